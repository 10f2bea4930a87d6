"""A Hugging Face ``Trainer`` run with ``SkyfedCallback`` is a site: the tutorial's script,
as written in docs/tutorial-hf.md, beside an ``agent start`` site of the config-built Llama
task, against a coordinator that builds the model from the script's own config."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skyfed.procs import command
from skyfed.tasks import load_task
from tests.e2e.test_federation_processes import wait_until

pytestmark = pytest.mark.multiprocess

TUTORIAL = Path(__file__).parents[2] / "docs" / "tutorial-hf.md"
# The tutorial's LlamaConfig, as the example task spells it (its batch the script's too).
LLAMA = "skyfed.tasks.llama:llama?hidden=32&layers=1&heads=2&kv_heads=2&intermediate=64&block=32&batch=16"
ROUNDS = 6  # 12 optimizer steps at --local-steps 2; the Trainer evaluates at step 10


def tutorial_script(into: Path) -> Path:
    """``train.py`` exactly as the tutorial gives it (its first Python block)."""
    script = into / "train.py"
    script.write_text(re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)[0])
    return script


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_tutorials_trainer_site_trains_bit_identical_with_an_agent_start_site(
    serve, reaped, pki, tmp_path, ranks
):
    """One process, and two under torchrun (the Trainer's own DDP over Gloo: a site of
    two replicas)."""
    assert pki.directory == tmp_path / "certs"  # where the script looks for them
    script = tutorial_script(tmp_path)
    subprocess.run(
        [sys.executable, str(script), "--save-config", "model-config"],
        cwd=tmp_path,
        check=True,
        timeout=120,
    )
    task = f"skyfed.tasks.hf:causal_lm?config={tmp_path / 'model-config'}"
    run_dir = tmp_path / "run"
    running = serve(task=task, min_agents=2, rounds=ROUNDS, codec="fp16", run_dir=run_dir)
    port = running.port
    agent = {"--cloud": "gcp", "--coordinator": f"localhost:{port}", "--task": LLAMA}
    agent |= {"--certs": pki.directory, "--local-steps": 2, "--report": tmp_path / "gcp.json"}
    reaped.start("gcp", command("agent", "start", *(str(x) for f in agent.items() for x in f)))
    trainer = [sys.executable, str(script), "--cloud", "aws", "--coordinator", f"localhost:{port}"]
    if ranks > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        trainer = [*torchrun, f"--nproc-per-node={ranks}", *trainer[1:]]
    proc = subprocess.Popen(
        [*trainer, "--local-steps", "2"],
        cwd=tmp_path,
        stdout=open(tmp_path / "aws.log", "wb"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    reaped.procs["aws"] = proc
    assert proc.wait(timeout=300) == 0, (tmp_path / "aws.log").read_text()[-3000:]
    assert reaped.procs["gcp"].wait(timeout=120) == 0, reaped.log("gcp")[-3000:]

    digest = running.federation.model.weights_digest
    for report in ("site-aws.json", "gcp.json"):
        got = json.loads((tmp_path / report).read_text())
        assert (got["round"], got["weights_digest"]) == (ROUNDS - 1, digest), report
    # The Trainer stopped by itself when the federation finished, and saved its weights.
    from transformers import LlamaForCausalLM

    from skyfed.fingerprint import weights_digest

    saved = LlamaForCausalLM.from_pretrained(tmp_path / "final-aws")
    assert weights_digest(p.detach() for p in saved.parameters()) == digest
    # Its training loss, read off the model's outputs, is what its site reported.
    assert 0 < json.loads((tmp_path / "site-aws.json").read_text())["loss"] < 6  # ln 256 = 5.5
    # The Trainer's evaluation (step 10) went with its next contribution.
    aws = next(a for a in running.federation.status(departed=True).agents if a.name == "aws-1")
    assert set(aws.metrics) == {"eval_loss"} and aws.metrics_round == ROUNDS - 1
    assert (aws.dp, aws.tp) == (ranks, 1)

    def reported() -> list[dict]:
        lines = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
        return [
            x["links"]["aws-1"]["metrics"]
            for x in lines
            if "metrics" in x.get("links", {}).get("aws-1", {})
        ]

    wait_until(lambda: reported() == [aws.metrics], 10, "the Trainer's eval_loss in rounds.jsonl")


def test_the_coordinators_task_from_the_scripts_config_is_the_llama_tasks_model(tmp_path):
    """What makes the two sites above one federation: the same fingerprint, and the
    model's own TP plan read the same way (``skyfed.tasks.hf.hf_tp_plan``)."""
    from skyfed.fingerprint import model_spec

    llama = load_task(LLAMA)
    llama.model_config().save_pretrained(tmp_path / "config")
    causal = load_task(f"skyfed.tasks.hf:causal_lm?config={tmp_path / 'config'}")
    assert model_spec(list(causal.build_model(0).named_parameters())) == model_spec(
        list(llama.build_model(0).named_parameters())
    )
    assert causal.tp_plan() == llama.tp_plan()
    assert causal.tp_plan()["model.layers.*.self_attn.q_proj"] == "colwise"


def test_agent_start_with_a_task_that_only_builds_the_model_is_one_line(pki, tmp_path):
    load_task(LLAMA).model_config().save_pretrained(tmp_path / "config")
    task = f"skyfed.tasks.hf:causal_lm?config={tmp_path / 'config'}"
    argv = command("agent", "start", "--cloud", "aws", "--coordinator", "localhost:9")
    done = subprocess.run(
        [*argv, "--certs", str(pki.directory), "--task", task],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "only builds the model: its sites train with their own script" in done.stderr
