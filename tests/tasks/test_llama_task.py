"""The config-built Hugging Face Llama example: a TP=2 site and a TP=1 site train it
bit-identical with the coordinator, and its export loads back into the HF model."""

from __future__ import annotations

import json

import pytest
import torch

from skyfed.procs import command
from skyfed.tasks import load_task

pytestmark = pytest.mark.multiprocess

TASK = "skyfed.tasks.llama:llama?hidden=32&layers=1&heads=2&kv_heads=2&intermediate=64&block=32&batch=8&eval_batches=2"


def test_a_tp2_site_and_a_tp1_site_train_the_llama_bit_identical(serve, reaped, pki, tmp_path):
    running = serve(task=TASK, min_agents=2, quorum=2, rounds=2, codec="fp16")
    for cloud, tp in (("aws", 2), ("gcp", 1)):
        flags = {
            "--cloud": cloud,
            "--coordinator": f"localhost:{running.port}",
            "--certs": pki.directory,
            "--task": TASK,
            "--local-steps": 2,
            "--tp": tp,
            "--device": "cpu",
            "--report": tmp_path / f"{cloud}.json",
        }
        reaped.start(cloud, command("agent", "start", *(str(x) for f in flags.items() for x in f)))
    for cloud in ("aws", "gcp"):
        assert reaped.procs[cloud].wait(timeout=240) == 0, reaped.log(cloud)[-3000:]
        report = json.loads((tmp_path / f"{cloud}.json").read_text())
        assert report["weights_digest"] == running.federation.model.weights_digest
    assert "[Agent.Ranks] dp=1 tp=2" in reaped.log("aws")
    assert "resync" not in reaped.log("aws").lower()


def test_the_llama_export_loads_into_the_hf_model_strictly(tmp_path):
    from skyfed.coordinator.export import export_weights

    task = load_task(TASK)
    model = task.build_model(0)
    weights = [p.detach().clone() for p in model.parameters()]
    export_weights(weights, tmp_path / "llama.pt", task=TASK, round_=0, seed=0)
    fresh = task.build_model(1)
    fresh.load_state_dict(torch.load(tmp_path / "llama.pt"), strict=True)
    fresh.save_pretrained(tmp_path / "hf")
    again = type(fresh).from_pretrained(tmp_path / "hf")
    out = again.generate(torch.tensor([[72, 101]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 6)
