"""The finding rules on plain inputs: each fires on its cause, stays quiet without it, says what
is missing instead of guessing, and its score grows with the harm."""
from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.drift.inputs import DriftInput, Prediction
from exporter.model.optimizer import Tier
from exporter.drift.rules import (LEVELS, capture_ceil, capture_floor, grade, rule_enable_prefix_caching,
                                  rule_gpu_memory_utilization, rule_idle_capacity, rule_kv_cache_dtype,
                                  rule_kv_pressure, rule_max_model_len, rule_max_num_seqs,
                                  rule_speculative_decoding, rule_tier_misplacement, run_rules)


def tier(gpu: str, tp: int, replicas: int, dollars_per_hour: float) -> Tier:
    """A tier meeting the SLOs, as `exporter.model.optimizer.rank_tiers` returns it."""
    return Tier(gpu, tp, replicas, dollars_per_hour, None, True, 64, 1.0, "test")


# A comfortable chat server: ~10 running of 48, KV a quarter full, no queue, no preemption.
HEALTHY = DriftInput(
    target="http://a:8000", model_name="m", vllm_version=(0, 11, 0), window_s=60, covered_s=60, samples=30,
    arrival_rps=0.7, prompt_tps=650.0, generation_tps=150.0, preemptions_ps=0.0, steps_ps=20.0,
    prompt_mean=900, prompt_p50=800, prompt_p25=500, prompt_p99=2600,
    output_mean=220, output_p99=700, length_share=0.0, prefix_hit_ratio=0.15,
    kv_usage_mean=0.25, kv_usage_max=0.45, running_mean=10.0, running_max=17, waiting_mean=0.0,
    waiting_max=0, ttft_p99=0.8, tpot_p99=0.07, block_size=16,
    kv_cache_tokens=30400, gpu_memory_utilization=0.9, enable_prefix_caching=True, cache_dtype="auto",
    max_model_len=4096, missing_hints=("gpu",))


def loud(findings):
    return [f for f in findings if f.severity in ("warning", "critical")]


def test_healthy_raises_nothing_at_warning():
    assert loud(run_rules(HEALTHY)) == []


def test_kv_pressure_fires_with_preemptions_and_grows_with_them():
    x = replace(HEALTHY, kv_usage_mean=0.97, kv_usage_max=1.0, running_mean=40, running_max=60,
                preemptions_ps=0.2, prompt_tps=300.0, generation_tps=400.0)
    [f] = [f for f in rule_kv_pressure(x) if f.finding == "kv_pressure"]
    assert f.severity in ("warning", "critical") and 0 < f.score <= 1
    worse = [f for f in rule_kv_pressure(replace(x, preemptions_ps=2.0)) if f.finding == "kv_pressure"][0]
    assert worse.score > f.score
    assert grade("kv_pressure", worse.score) == worse.severity
    assert "preemptions/min" in f.explanation


def test_kv_full_without_preemption_or_queue_is_only_info():
    x = replace(HEALTHY, kv_usage_mean=0.6, kv_usage_max=0.95)
    fs = [f for f in rule_kv_pressure(x) if f.finding == "kv_pressure"]
    assert fs and fs[0].severity == "info" and fs[0].score == 0


def test_missing_families_are_unavailable_not_zero():
    x = replace(HEALTHY, kv_usage_mean=None, kv_usage_max=None)
    [f] = rule_kv_pressure(x)
    assert f.finding == "unavailable" and "needs kv_cache_usage" in f.explanation
    y = replace(HEALTHY, preemptions_ps=None, kv_usage_max=0.99, kv_usage_mean=0.9)
    assert any(f.finding == "unavailable" and "num_preemptions_total" in f.explanation
               for f in rule_kv_pressure(y))


def test_max_num_seqs_too_low_inferred_from_plateau():
    x = replace(HEALTHY, running_mean=5.8, running_max=6, waiting_mean=4.0, waiting_max=9)
    [f] = rule_max_num_seqs(x)
    assert f.parameter == "max_num_seqs" and f.configured == 6 and f.recommended > 6
    assert f.severity in ("warning", "critical")
    assert f.recommended in (8, 16, 24, 32)   # a CUDA-graph capture size near 1.5x the demand


def test_max_num_seqs_not_raised_past_the_kv_pool():
    # per-request footprint 0.7 x 30400 / 6 ~ 3547 tokens: the pool holds ~7; nothing to gain
    x = replace(HEALTHY, running_mean=6, running_max=6, waiting_mean=4.0, kv_usage_mean=0.7, kv_usage_max=0.75)
    fs = rule_max_num_seqs(x)
    assert all(f.recommended <= 8 for f in fs)


def test_max_num_seqs_too_high_under_preemption_churn():
    x = replace(HEALTHY, kv_usage_mean=0.98, kv_usage_max=1.0, running_mean=30, running_max=40,
                preemptions_ps=0.5, prompt_tps=300.0, generation_tps=400.0, max_num_seqs=256)
    [f] = rule_max_num_seqs(x)
    assert f.binding == "kv_cache" and f.recommended < 40 and f.configured == 256


def test_gpu_memory_utilization_low_under_pressure():
    x = replace(HEALTHY, gpu_memory_utilization=0.5, kv_usage_mean=0.97, kv_usage_max=1.0, running_mean=30,
                running_max=40, preemptions_ps=0.3, prompt_tps=300.0, generation_tps=400.0)
    [f] = rule_gpu_memory_utilization(x)
    assert f.recommended == 0.9 and f.configured == 0.5 and f.severity != "info"
    assert rule_gpu_memory_utilization(replace(x, gpu_memory_utilization=0.9)) == []
    assert rule_gpu_memory_utilization(replace(HEALTHY, gpu_memory_utilization=0.5)) == []


def test_gpu_memory_utilization_risky():
    [f] = rule_gpu_memory_utilization(replace(HEALTHY, gpu_memory_utilization=0.99))
    assert f.binding == "oom_risk" and f.severity == "warning"


def test_max_model_len_oversized_and_too_small():
    x = replace(HEALTHY, max_model_len=32768)
    [f] = rule_max_model_len(x)
    assert f.severity in ("warning", "critical") and f.recommended < 32768 and f.recommended >= 3300
    assert rule_max_model_len(HEALTHY) == []
    small = replace(HEALTHY, max_model_len=2048, length_share=0.2)
    [g] = rule_max_model_len(small)
    assert g.severity == "critical" and g.recommended > 2048 and g.binding == "length_truncation"


def test_prefix_caching_off_is_reported_on_v1_only():
    x = replace(HEALTHY, enable_prefix_caching=False, prompt_p25=1500, prompt_mean=1650)
    [f] = rule_enable_prefix_caching(x)
    assert f.severity in ("warning", "critical") and f.recommended is True and f.configured is False
    assert rule_enable_prefix_caching(replace(x, era="v0")) == []
    assert rule_enable_prefix_caching(HEALTHY) == []


def test_spec_decode_harmful_at_low_acceptance_and_large_batch():
    x = replace(HEALTHY, spec_k=4, spec_acceptance=0.06, spec_mean_accepted=0.25, running_mean=100)
    [f] = rule_speculative_decoding(x)
    assert f.severity in ("warning", "critical") and f.recommended == 0
    good = replace(HEALTHY, spec_k=3, spec_acceptance=0.7, spec_mean_accepted=2.1, running_mean=4)
    assert rule_speculative_decoding(good) == []


def test_kv_cache_dtype_only_under_kv_pressure():
    x = replace(HEALTHY, kv_usage_mean=0.98, kv_usage_max=1.0, running_mean=30, running_max=40,
                preemptions_ps=0.5, prompt_tps=300.0, generation_tps=400.0)
    [f] = rule_kv_cache_dtype(x)
    assert f.recommended == "fp8" and f.severity != "critical"
    assert rule_kv_cache_dtype(replace(x, cache_dtype="fp8")) == []
    assert rule_kv_cache_dtype(HEALTHY) == []


def test_idle_capacity_monotonic():
    idle = replace(HEALTHY, kv_usage_mean=0.002, running_mean=0.7, running_max=3)
    [f] = rule_idle_capacity(idle)
    assert f.severity == "critical" and f.score > 0.97
    busier = rule_idle_capacity(replace(idle, kv_usage_mean=0.1, running_mean=5))
    assert busier and busier[0].score < f.score
    assert loud(rule_idle_capacity(HEALTHY)) == []


def test_a_device_far_slower_than_its_catalog_row_is_judged_by_its_busy_time():
    """Batch slots and KV nearly empty, and the throughput model (extrapolated from the catalog
    row) says 95 % of the capacity is unused: but every step takes 7x what the row predicts and
    the engine steps back to back. Busy time then counts as used capacity: not idle. The same
    server stepping as its catalog row predicts is idle."""
    base = replace(HEALTHY, kv_usage_mean=0.02, running_mean=8.0, running_max=8, arrival_rps=0.8,
                   steps_ps=15.0, prediction=Prediction(current_max_rps=17.5, prior_tpot_s=0.008,
                                                        tpot_s=0.008, current_cost_per_hour=0.8))
    slow = replace(base, itl_mean=0.059)            # 7x the predicted step, busy 89 % of the time
    assert loud(rule_idle_capacity(slow)) == []
    on_row = replace(base, itl_mean=0.009, steps_ps=15.0)   # busy 14 %: really idle
    [f] = rule_idle_capacity(on_row)
    assert f.severity in ("warning", "critical") and "throughput" in f.explanation


def test_tier_misplacement_needs_hints_and_prices_the_waste():
    [u] = rule_tier_misplacement(HEALTHY)
    assert u.finding == "unavailable" and "targets[].gpu" in u.explanation
    pred = Prediction(tiers=(tier("L4", 1, 1, 0.8),), current_cost_per_hour=3.0)
    x = replace(HEALTHY, missing_hints=(), gpu="H100-SXM-80GB", prediction=pred)
    [f] = rule_tier_misplacement(x)
    assert f.recommended == "L4" and abs(f.score - (1 - 0.8 / 3.0)) < 1e-3 and "$2.20/h" in f.explanation


def test_levels_are_ordered_and_capture_sizes():
    for warn, crit in LEVELS.values():
        assert 0 < warn < crit <= 1
    assert capture_floor(30) == 24 and capture_ceil(30) == 32 and capture_ceil(3) == 4


@pytest.mark.parametrize("field", ["kv_usage_mean", "running_mean", "waiting_mean", "prompt_tps"])
def test_rules_tolerate_missing_signals(field):
    run_rules(replace(HEALTHY, **{field: None}))


def test_max_model_len_waits_for_finished_requests_but_names_missing_histograms():
    x = replace(HEALTHY, prompt_p99=None, output_p99=None,
                families=frozenset({"prompt_tokens", "generation_tokens"}))
    assert rule_max_model_len(x) == []
    [u] = rule_max_model_len(replace(x, families=frozenset()))
    assert u.finding == "unavailable" and "request_prompt_tokens" in u.explanation


def test_missed_spec_gain_is_info_unless_it_would_fix_a_missed_tpot_slo():
    x = replace(HEALTHY, prediction=Prediction(spec_missed_speedup=1.6))
    [f] = rule_speculative_decoding(x)
    assert f.severity == "info" and f.binding == "missed_gain" and f.recommended == 3
    slow = replace(x, slo_tpot_s=0.05, tpot_p99=0.07)
    [g] = rule_speculative_decoding(slow)
    assert g.severity in ("warning", "critical") and g.score >= 1 - 0.05 / 0.07 - 1e-9
    assert rule_speculative_decoding(replace(x, prediction=Prediction(spec_missed_speedup=1.05))) == []


def test_tier_that_observably_misses_a_set_slo_gets_a_bigger_one():
    pred = Prediction(tiers=(tier("L40S", 1, 1, 1.95),), current_cost_per_hour=0.8)
    x = replace(HEALTHY, missing_hints=(), gpu="L4", prediction=pred, slo_tpot_s=0.05, tpot_p99=0.09)
    [f] = rule_tier_misplacement(x)
    assert f.binding == "slo" and f.recommended == "L40S" and f.severity == "warning"
    # without a configured SLO, a slower tier is not "missing" anything
    assert rule_tier_misplacement(replace(x, slo_tpot_s=None)) == []


def test_rules_on_random_inputs_stay_in_range():
    """Any mix of present and missing signals: no exception, scores in [0, 1], severities from
    the fixed set, finding and parameter names from the fixed label sets."""
    import math
    import random

    from exporter.report import FINDINGS, PARAMETERS, SEVERITIES
    rng = random.Random(5)
    numeric = {"arrival_rps": 20, "prompt_tps": 5000, "generation_tps": 3000, "preemptions_ps": 5, "steps_ps": 100,
               "prompt_mean": 4000, "prompt_p50": 4000, "prompt_p25": 3000, "prompt_p99": 9000, "output_mean": 2000,
               "output_p99": 5000, "length_share": 1, "prefix_hit_ratio": 0.99, "spec_acceptance": 1,
               "spec_mean_accepted": 4, "spec_k": 5, "kv_usage_mean": 1, "kv_usage_max": 1, "running_mean": 300,
               "running_max": 300, "waiting_mean": 100, "waiting_max": 100, "ttft_p99": 10, "tpot_p99": 1,
               "queue_p99": 10, "e2e_mean": 60, "itl_mean": 0.5, "kv_cache_tokens": 1e6, "block_size": 16,
               "gpu_memory_utilization": 1, "max_model_len": 131072, "slo_ttft_s": 3, "slo_tpot_s": 0.2,
               "iteration_tokens_max": 8192}
    for _ in range(3000):
        kw = {}
        for name, hi in numeric.items():
            roll = rng.random()
            kw[name] = None if roll < 0.25 else (0.0 if roll < 0.35 else rng.uniform(0, hi))
        kw["enable_prefix_caching"] = rng.choice([True, False, None])
        kw["max_num_seqs"] = rng.choice([None, 1, 8, 256])
        kw["era"] = rng.choice(["v0", "v1"])
        pred = Prediction(spec_missed_speedup=rng.choice([None, 0.8, 1.5]),
                          tiers=(tier("L4", 1, rng.randint(1, 4), rng.uniform(0.5, 20)),),
                          current_cost_per_hour=rng.choice([None, 0.8, 10.0]))
        x = replace(HEALTHY, prediction=pred, missing_hints=rng.choice([(), ("gpu",)]), gpu="H100-SXM-80GB", **kw)
        for f in run_rules(x):
            assert 0.0 <= f.score <= 1.0 and not math.isnan(f.score), f
            assert f.severity in SEVERITIES and f.finding in FINDINGS, f
            assert f.parameter is None or f.parameter in PARAMETERS, f
            if f.finding in LEVELS and f.binding not in ("policy", "oom_risk", "length_truncation", "missed_gain"):
                # severity follows the score, except where a documented cap or policy applies
                assert f.severity == grade(f.finding, f.score) or f.finding in ("kv_cache_dtype", "idle_capacity"), f
