"""`vllm-drift demo` end to end on loopback: simulated servers + the real daemon in one command;
it prints the URLs and a findings table, finds the injected KV pressure, raises nothing on the
healthy server, and stops by itself after --duration."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_demo_runs_finds_kv_pressure_and_stops_by_itself():
    r = subprocess.run([sys.executable, "-m", "exporter", "demo", "--scenarios", "healthy,kv-pressure",
                        "--listen", "127.0.0.1:0", "--duration", "45", "--refresh", "5"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "/api/v1/findings" in out and "/metrics" in out
    tables = [t for t in out.split("vllm-drift demo —")[1:]]
    assert tables, out
    last = tables[-1].splitlines()
    healthy = next(l for l in last if l.startswith("healthy"))
    pressure = next(l for l in last if l.startswith("kv-pressure"))
    assert "kv_pressure" in pressure.split("[")[0], pressure
    assert "warning" not in healthy and "critical" not in healthy, healthy
