"""Trade-off sweeps, the TPOT p99 estimate, workload presets, the shared speculative-decoding
verdict and the tier list's current row, against the performance model."""
from __future__ import annotations

import pytest

from exporter.model.optimizer import rank_tiers
from exporter.model.perf import predict
from exporter.model.profiles import OBJECTIVES, profiles
from exporter.model.setup import Setup
from exporter.model.spec_decode import SpecConfig, break_even_acceptance, gain, spec_verdict
from exporter.model.tradeoff import PARAMS, concurrency_curve, sweep, tpot_p99_s
from exporter.model.traffic import SLO, TAIL_FACTOR, Traffic

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def setup():
    return Setup.build(LLAMA, "H100-SXM-80GB", max_model_len=8192, gpu_memory_utilization=0.95)


def test_tail_margin_only_when_no_tail_given():
    t = Traffic(1000, 200)
    assert t.prompt_p99 == pytest.approx(1000 * TAIL_FACTOR, abs=1) and t.tail_assumed == ["prompt", "output"]
    given = Traffic(1000, 200, prompt_tokens_p99=1500, output_tokens_p99=900)
    assert (given.prompt_p99, given.output_p99, given.tail_assumed, given.tail_note()) == (1500, 900, [], None)


def test_tpot_p99_sits_between_the_mean_and_the_mixed_step(setup):
    t = Traffic(2048, 128, prompt_tokens_p99=4096, output_tokens_p99=512)
    for c in (4, 64, 256):
        p = predict(setup, t, concurrency=c)
        p99 = tpot_p99_s(setup, t, p)
        assert p.tpot_s <= p99 <= p.tpot_s * 3


@pytest.mark.parametrize("param", PARAMS)
def test_each_sweep_has_rows_and_at_most_one_recommended(setup, param):
    t = Traffic(1024, 256, prompt_tokens_p99=4096, output_tokens_p99=1024)
    sw = sweep(setup, t, SLO(2.0, 0.1), param, recommended=getattr(setup, param, None))
    assert len(sw["rows"]) >= 2 and sum(r["recommended"] for r in sw["rows"]) <= 1


def test_gpu_memory_utilization_buys_kv_tokens(setup):
    sw = sweep(setup, Traffic(1024, 256), SLO(), "gpu_memory_utilization")
    kv = [r["kv_tokens"] for r in sw["rows"]]
    assert kv == sorted(kv) and kv[0] < kv[-1]
    assert all(r["meets_slo"] is None for r in sw["rows"])  # no SLO: nothing to meet


def test_objective_picks_the_row(setup):
    t = Traffic(1024, 256, prompt_tokens_p99=4096, output_tokens_p99=1024)
    cost = sweep(setup, t, SLO(), "tp", objective="cost")
    fast = sweep(setup, t, SLO(), "tp", objective="latency")
    rows = {r["value"]: r for r in cost["rows"]}
    assert cost["recommended"] == min(rows, key=lambda v: rows[v]["dollars_per_million_tokens"])
    assert fast["recommended"] == min(rows, key=lambda v: rows[v]["tpot_p99_s"])


def test_concurrency_curve_marks_the_recommended_point(setup):
    curve = concurrency_curve(setup, Traffic(1024, 256), SLO(), mark=96)
    assert [r["concurrency"] for r in curve if r["recommended"]] == [96]
    tput = [r["throughput_tokens_per_s"] for r in curve]
    assert tput[0] < tput[len(tput) // 2]


def test_break_even_acceptance_is_where_the_speedup_crosses_one(setup):
    for batch in (1, 64, 256):
        be = break_even_acceptance(setup, batch, 1152)
        assert be is not None
        speed = gain(setup, SpecConfig(num_tokens=3, alpha=be), batch, 1152).speedup
        assert speed == pytest.approx(1.0, abs=0.01)
    # bigger batches need better drafts (the verify step turns compute-bound)
    assert break_even_acceptance(setup, 1, 1152) < break_even_acceptance(setup, 256, 1152)


def test_spec_verdict_with_and_without_a_measured_rate(setup):
    v = spec_verdict(setup, 8, 1152)
    assert len(v["by_acceptance"]) == 7 and "unknown" in v["assumption"]
    m = spec_verdict(setup, 8, 1152, acceptance=0.85)
    assert len(m["by_acceptance"]) == 1 and m["recommended"] is True


def test_profiles_are_complete_and_sourced():
    profs = profiles()
    assert {"chatbot", "code-generation", "long-document", "batch", "rag", "agent"} <= set(profs)
    for p in profs.values():
        assert p.objective in OBJECTIVES
        assert p.prompt_tokens_p99 >= p.prompt_tokens_mean and p.output_tokens_p99 >= p.output_tokens_mean
        assert {"lengths", "arrival", "slo"} <= set(p.sources), p.name
        assert all(len(s) > 20 for s in p.sources.values())
    assert profs["long-document"].prompt_tokens_p99 + profs["long-document"].output_tokens_p99 <= 131072
    assert profs["batch"].ttft_p99_s is None and profs["batch"].objective == "throughput"


def test_current_tier_is_kept_even_outside_the_gpu_list():
    t = Traffic(512, 128, prompt_tokens_p99=1024, output_tokens_p99=256)
    tiers = rank_tiers(LLAMA, t, SLO(), gpus=["L4"], tps=(1,), current=("H100", 2))
    assert sorted((x.gpu, x.tp, x.current) for x in tiers) == [("H100-SXM-80GB", 2, True), ("L4", 1, False)]
    assert all(x.meets_slo is None for x in tiers)
    costs = [x.dollars_per_million_tokens for x in tiers]
    assert costs == sorted(costs)


def test_unknown_acceptance_uses_the_daemons_assumption(setup):
    """calc's yes/no and the daemon's "missed speed-up" read the same assumed acceptance."""
    from exporter.drift import predict as drift_predict
    from exporter.model.spec_decode import ASSUMED_SPEC
    assert drift_predict.ASSUMED_SPEC == ASSUMED_SPEC
    for batch in (1, 64, 512):
        v = spec_verdict(setup, batch, 1152)
        at = gain(setup, SpecConfig(**ASSUMED_SPEC), batch, 1152).speedup
        assert v["recommended"] == (at >= 1.05)
