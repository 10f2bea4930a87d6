"""What a run writes about its model is its operator's alone: checkpoints, the exported
model, status.json and the round history are 0600 (docs/security.md, "Identity and
transport")."""

from __future__ import annotations

import stat

from skyfed.coordinator.config import CoordinatorConfig
from skyfed.coordinator.server import run_server
from tests.conftest import RawAgent, credentials
from tests.coordinator.test_bad_input import contribution, deltas, join, send


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_checkpoints_export_status_and_history_are_private(pki, tmp_path):
    config = CoordinatorConfig.from_flat(
        listen="127.0.0.1:0",
        certs=pki.directory,
        codec="fp32",
        rounds=1,
        checkpoint_dir=tmp_path / "ckpt",
        run_dir=tmp_path / "run",
        export=tmp_path / "out" / "model.pt",
    )
    with run_server(config) as running:
        agent = RawAgent(running.port, credentials(pki.directory, "aws-1"))
        try:
            join(agent, "aws", "aws-1")
            send(agent, *contribution(deltas(1)))
            assert agent.expect("receipt").receipt.accepted
            assert agent.expect("round_end").round_end.final
        finally:
            agent.close()
    written = [
        *(tmp_path / "ckpt").iterdir(),
        tmp_path / "run" / "status.json",
        tmp_path / "run" / "rounds.jsonl",
        tmp_path / "out" / "model.pt",
        tmp_path / "out" / "model.json",
    ]
    assert len(written) > 4  # a checkpoint at least
    assert {str(p): oct(mode(p)) for p in written if p.is_file()} == {
        str(p): oct(0o600) for p in written if p.is_file()
    }
