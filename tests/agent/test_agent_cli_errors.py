"""An agent's start-up mistakes are one line and exit code 2, at once."""

from __future__ import annotations

import subprocess
import time

import pytest

from skyfed.procs import command

MISTAKES = {
    "key-of-another-cert": (["--key", "{certs}/gcp-1.key"], "is not the private key"),
    "report-dir": (["--report", "/nonexistent/dir/aws.json"], "--report"),
    "task": (["--task", "no_such_module:make"], "cannot import 'no_such_module'"),
    "tp-plan": (
        ["--task", "tests.agent.bad_plan_task:make", "--tp", "2"],
        "names module 'blocks.9.attn.q'",
    ),
    "gpt2-conv1d-plan": (
        ["--task", "tests.agent.gpt2_task:make", "--tp", "2"],
        "transformer.h.0.attn.c_attn is a Conv1D; ColwiseParallel shards only nn.Linear",
    ),
    "heads-tp-does-not-divide": (
        ["--task", "skyfed.tasks.llama:llama?heads=2&kv_heads=1&hidden=64", "--tp", "4"],
        "num_attention_heads = 2 is not divisible by tp=4",
    ),
    "log-level": (["--log-level", "verbose"], "--log-level"),
    "certs-dir": (["--certs", "/nonexistent/certs"], "--ca /nonexistent/certs/ca.crt"),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_agent_start_mistake_is_one_line_and_exit_code_2(pki, case):
    args, words = MISTAKES[case]
    args = [a.format(certs=pki.directory) for a in args]
    argv = command("agent", "start", "--cloud", "aws", "--coordinator", "localhost:9", *args)
    if "--certs" not in args:
        argv += ["--certs", str(pki.directory)]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert words in done.stderr
    assert time.monotonic() - started < 30  # at once, not after retrying
