"""bench/scale.py counts an agent's rank processes (its children on CUDA) in its memory
and CPU: a launcher's own figures said 0.2x the model and 0 CPU-s on the H200 host."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.bench import bench_module

# A child that starts a grandchild holding 128 MiB (touched), then both wait.
GRANDCHILD = "b = bytearray(128 << 20); import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); import time; time.sleep(60)"
CHILD = f"""
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}], stdout=subprocess.PIPE, text=True)
p.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


def test_a_process_peak_counts_its_descendants():
    scale = bench_module("scale")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert len(scale.family(child.pid)) == 2
        assert scale.peak_rss(child.pid) >= 128 << 20
        deadline = time.monotonic() + 10
        while scale.cpu_seconds(child.pid) <= 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scale.cpu_seconds(child.pid) > 0
    finally:
        for pid in reversed(scale.family(child.pid)):
            subprocess.run(["kill", str(pid)], check=False)
        child.wait(timeout=10)
