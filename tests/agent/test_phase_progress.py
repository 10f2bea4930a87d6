"""A long local phase says how far it is: a line between applied rounds, not silence."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from skyfed.agent.config import AgentConfig
from skyfed.agent.observe import RoundLines
from skyfed.agent.site import Site
from skyfed.agent.trainer import LocalTrainer
from skyfed.tasks import load_task

TASK = "skyfed.tasks.examples:wide?params=20k&batch=4"


def test_a_long_local_phase_prints_its_local_step_between_rounds(pki):
    steps = 4000
    trainer = LocalTrainer(load_task(TASK), seed=0, shard=0, num_shards=1, local_steps=steps)
    # The fields RoundLines reads of an agent that has applied nothing yet (the real
    # agent's per-round lines: tests/e2e); the trainer is the real one, mid-phase.
    agent = SimpleNamespace(
        connected=True,
        last_round=-1,
        applied=0,
        last_loss=float("nan"),
        bytes_up=0,
        bytes_down=0,
        codec="fp32",
        metrics={},
        site=Site(trainer),
    )
    lines: list[str] = []
    say = RoundLines(
        agent, AgentConfig(cloud="aws", certs=pki.directory), lines.append, phase_line_s=0.05
    )
    training = threading.Thread(target=trainer.train)
    say.start()
    training.start()
    training.join()
    say.close()
    assert lines, "no progress line during the local phase"
    first = lines[0].rsplit(" ", 3)
    assert lines[0].startswith("aws-1: round 0 · local step ")
    assert first[-2:] == ["of", str(steps)] and 0 < int(first[-3]) <= steps
