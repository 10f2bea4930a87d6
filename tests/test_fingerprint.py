"""The weights digest: bit-identity in, the same digest out, however it is fed."""

from __future__ import annotations

import torch

from skyfed import fingerprint
from skyfed.fingerprint import weights_digest


def _weights() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    big = fingerprint.DIGEST_BLOCK_BYTES // 4 * 2 + 7  # spans three blocks
    return [torch.randn(big, generator=gen), torch.randn(3, 5, generator=gen), torch.zeros(0)]


def test_a_list_and_a_generator_of_the_same_tensors_give_one_digest():
    ws = _weights()
    assert weights_digest(ws) == weights_digest(w.clone() for w in ws)


def test_one_flipped_bit_in_any_block_changes_the_digest():
    ws = _weights()
    before = weights_digest(ws)
    for index in (0, fingerprint.DIGEST_BLOCK_BYTES // 4 + 1, ws[0].numel() - 1):
        flipped = [w.clone() for w in ws]
        flipped[0].view(torch.int32)[index] ^= 1
        assert weights_digest(flipped) != before, index


def test_moving_bytes_between_tensors_changes_the_digest():
    a, b = torch.arange(6, dtype=torch.float32), torch.arange(6, 10, dtype=torch.float32)
    assert weights_digest([a, b]) != weights_digest([torch.cat([a, b])])


def test_a_transposed_view_is_digested_as_its_values():
    w = torch.randn(4, 6)
    assert weights_digest([w.t()]) == weights_digest([w.t().contiguous()])
    assert weights_digest([w.t()]) != weights_digest([w])


def test_the_integrity_digest_catches_a_flipped_bit_in_any_block_and_is_no_weights_digest():
    ws = _weights()
    before = fingerprint.integrity_digest(ws)
    assert before == fingerprint.integrity_digest(w.clone() for w in ws)
    assert before != weights_digest(ws)  # another tree: the two never pass for each other
    for index in (0, fingerprint.DIGEST_BLOCK_BYTES // 4 + 1, ws[0].numel() - 1):
        flipped = [w.clone() for w in ws]
        flipped[0].view(torch.int32)[index] ^= 1
        assert fingerprint.integrity_digest(flipped) != before, index
    a, b = torch.arange(6, dtype=torch.float32), torch.arange(6, 10, dtype=torch.float32)
    assert fingerprint.integrity_digest([a, b]) != fingerprint.integrity_digest([torch.cat([a, b])])


def test_the_weights_digest_is_a_crc32_tree_tagged_v3_not_the_sha256_tree_before_it():
    ws = _weights()
    digest = weights_digest(ws)
    assert digest.startswith(fingerprint.DIGEST_PREFIX) and fingerprint.is_weights_digest(digest)
    before = fingerprint.sha256_weights_digest(ws)  # what agents and checkpoints had up to v2
    assert not fingerprint.is_weights_digest(before) and len(before) == 64
    assert digest[len(fingerprint.DIGEST_PREFIX) :] != before
    assert digest != fingerprint.DIGEST_PREFIX + fingerprint.integrity_digest(ws)
