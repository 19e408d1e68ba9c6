"""Findings on real vLLM 0.32 captures (CPU build, tests/fixtures/vllm-cpu/CAPTURES.md): every input
read as vLLM defines it. KV pressure on a 48-block pool is found (from one snapshot and from a
pair); a CPU server gets observation findings only; requests stopping at their own max_tokens are
not blamed on max_model_len; quantiles stay inside what requests asked for; a CPU-bound engine is
not idle; max_num_seqs is never a default presented as observed."""
from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config import Config, TargetSpec
from exporter.parse import parse_vllm
from exporter.parse.metadata import Metadata
from exporter.pipeline import Pipelines, evaluate_snapshots

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"
URL = "http://127.0.0.1:8011"
META = Metadata(vllm_version="0.32.0", served_models=("tiny-llama",), max_model_len={"tiny-llama": 4096},
                root={"tiny-llama": "tiny-llama"})
# seconds between the captures' request starts (captures.json)
KV = (("kv-pressure-a", 0.0), ("kv-pressure-b", 20.0), ("kv-pressure", 31.0))
LOAD = (("load-a", 0.0), ("load-b", 30.0))
GPU_ONLY = ("gpu_memory_utilization", "kv_cache_dtype", "speculative_decoding", "tier_misplacement")


def report(files, *, gpu=None):
    fleet = Pipelines(Config(), one_shot=True)
    spec = TargetSpec(url=URL, gpu=gpu)
    batches = [parse_vllm((CPU / f"vllm-0.32.0-cpu-{name}.prom").read_bytes(), target=URL, timestamp=1.7e9 + t)
               for name, t in files]
    [r] = evaluate_snapshots(fleet, spec, batches, META, 1.7e9 + files[-1][1])
    return r


def loud(r):
    return {f.finding for f in r.findings if f.severity in ("warning", "critical")}


@pytest.mark.parametrize("files", [KV, KV[:1], KV[2:]], ids=["window", "snapshot-a", "snapshot"])
def test_kv_pressure_on_a_real_small_pool_and_observation_findings_only(files):
    r = report(files)
    assert "kv_pressure" in loud(r)
    assert r.derived["backend"] == "cpu" and r.derived["observation_only"]
    found = {f.finding for f in r.findings}
    assert not found & set(GPU_ONLY)
    for name in GPU_ONLY:
        st = r.finding_status[name]
        assert st["status"] == "unavailable" and "cpu backend" in st["reason"]
    assert r.tier is None and r.waste_dollars_per_hour is None
    assert any("observation findings only" in n for n in r.notes)


def test_kv_pressure_score_over_a_window_counts_recompute_and_the_blocked_queue():
    r = report(KV)
    d = r.derived
    assert r.status == "ok"
    # 48-block pool: usage swings with whole requests; 40+ requests wait, ~35% of the work recomputed
    assert d["recompute_share"] > 0.2 and d["queue_share"] > 0.8
    assert r.kv_pressure_score == pytest.approx(max(d["recompute_share"], d["queue_share"] * 1.0), abs=0.01)


def test_length_stops_at_the_requests_own_max_tokens_are_not_blamed_on_max_model_len():
    for files in (LOAD, KV):
        r = report(files)
        d = r.derived
        # the load generator sends max_tokens = min_tokens: every request finishes on "length"
        assert d["length_share"] == pytest.approx(1.0)
        assert d["context_length_share"] == 0.0
        mml = [f for f in r.findings if f.finding == "max_model_len"]
        assert all(f.binding != "length_truncation" and f.severity == "info" for f in mml)
        # quantiles bounded by what was asked for; a wide bucket is said to be one
        assert d["max_tokens_mean"] in (128.0, 1024.0)
        assert r.observed["generation_len_p99"] is not None
        assert d["prompt_plus_output_p99_tokens"] <= d["max_tokens_top_bucket"] + r.observed["prompt_len_p99"] + 1
        assert any(c.startswith("output p99 in (") for c in d["coarse_quantiles"])


def test_a_cpu_bound_engine_is_not_idle():
    r = report(LOAD)
    assert r.derived["busy_fraction"] > 0.9
    assert r.idle_capacity_ratio is not None and r.idle_capacity_ratio < 0.15
    assert "idle_capacity" not in loud(r)


def test_max_num_seqs_is_never_a_default_presented_as_observed():
    for files in (LOAD, KV):
        r = report(files)
        src = r.derived["max_num_seqs_source"]
        if src == "unknown":
            assert "max_num_seqs" not in r.configured
        else:
            assert src.startswith("inferred") or src == "hint"


def test_observed_generation_quantiles_stay_within_what_was_asked():
    """Every request of the kv-pressure run asked for 1,024 tokens (bucket (1000, 2000]): the
    observed p90/p99 are not interpolated past the largest bucket requested, nor past max_model_len."""
    r = report(KV)
    o = r.observed
    assert o["max_tokens_top_bucket"] == 2000.0
    for stat in ("p50", "p90", "p99"):
        assert o[f"generation_len_{stat}"] <= min(o["max_tokens_top_bucket"], o["max_model_len"])
