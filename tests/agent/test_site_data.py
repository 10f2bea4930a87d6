"""Sites started from the same recipe train on their own batches."""

from __future__ import annotations

import torch

from skyfed.agent.config import AgentConfig
from skyfed.agent.launch import _trainer


def _first_batch(pki, cloud: str, **options: object) -> torch.Tensor:
    config = AgentConfig(cloud=cloud, coordinator="localhost:1", certs=pki.directory, **options)
    return next(_trainer(config).batches)[0]


def test_sites_with_default_shards_train_on_different_batches(pki):
    aws, gcp = _first_batch(pki, "aws"), _first_batch(pki, "gcp")
    assert not torch.equal(aws, gcp)
    assert torch.equal(aws, _first_batch(pki, "aws"))  # and each site's order is repeatable


def test_explicit_shards_keep_their_order(pki):
    a = _first_batch(pki, "aws", shard=0, num_shards=3)
    b = _first_batch(pki, "gcp", shard=0, num_shards=3)
    assert torch.equal(a, b)  # the shard decides, not the name
