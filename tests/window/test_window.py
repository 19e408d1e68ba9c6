"""Sliding windows: rates, resets, quantiles from bucket deltas, bounds, incremental gauge stats,
and the `observed` signals on real captures."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.parse import parse_vllm
from exporter.parse.snapshot import Histogram, Snapshot
from exporter.window import OBSERVED_KEYS, Window, observed_signals

from conftest import SHARED
PROM = SHARED / "fixtures" / "prom"


def exposition(*, prompt: float, gen: float, finished: dict[str, float], ttft: tuple[float, ...],
               running: float = 0.0, kv: float = 0.0, created: float = 1700000000.0,
               steps: float = 0.0, preempt: float = 0.0) -> str:
    """A small V1-style exposition (one engine) with the given cumulative values."""
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}',
        "# TYPE vllm:prompt_tokens_total counter",
        f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}',
        "# TYPE vllm:prompt_tokens_created gauge",
        f'vllm:prompt_tokens_created{{engine="0",model_name="m"}} {created}',
        "# TYPE vllm:generation_tokens_total counter",
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}',
        "# TYPE vllm:num_preemptions_total counter",
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {preempt}',
        "# TYPE vllm:request_success_total counter",
    ]
    lines += [f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="m"}} {v}'
              for r, v in finished.items()]
    lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
    for le, c in zip(("0.1", "0.5", "1.0", "+Inf"), ttft):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft[-1]}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft[-1] * 0.3}')
    lines.append("# TYPE vllm:iteration_tokens_total histogram")
    lines.append(f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {steps}')
    lines.append(f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}')
    lines.append(f'vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {steps * 4}')
    return "\n".join(lines) + "\n"


def snap(ts: float, **kw) -> Snapshot:
    (s,) = parse_vllm(exposition(**kw), target="http://t", timestamp=ts)
    return s


def test_rates_and_window_quantiles_by_hand():
    w = Window(600)
    w.observe(snap(100.0, prompt=1000, gen=500, finished={"stop": 4, "length": 1},
                   ttft=(1, 2, 3, 3), steps=50, preempt=2, running=2, kv=0.2))
    w.observe(snap(130.0, prompt=4000, gen=2000, finished={"stop": 12, "length": 5},
                   ttft=(3, 10, 15, 16), steps=350, preempt=8, running=6, kv=0.6))
    o = w.summary(130.0)
    assert (o.samples, o.duration_s, o.reset) == (2, 30.0, False)
    assert o.prompt_tokens_per_s == pytest.approx(3000 / 30)
    assert o.generation_tokens_per_s == pytest.approx(1500 / 30)
    assert o.requests_per_s == pytest.approx(12 / 30)
    assert o.finished_length_share == pytest.approx(4 / 12)
    assert o.preemptions_per_s == pytest.approx(6 / 30)
    assert o.engine_steps_per_s == pytest.approx(300 / 30)
    # bucket deltas (2, 8, 12, 13) at bounds (0.1, 0.5, 1, +Inf):
    # p50: rank 6.5 in (0.1, 0.5] holding 2..8  -> 0.1 + 0.4 * 4.5 / 6 = 0.4
    # p90: rank 11.7 in (0.5, 1] holding 8..12  -> 0.5 + 0.5 * 3.7 / 4 = 0.9625
    # p99: rank 12.87 falls in +Inf             -> the highest finite bound, 1.0
    assert o.ttft.p50 == pytest.approx(0.4)
    assert o.ttft.p90 == pytest.approx(0.9625)
    assert o.ttft.p99 == pytest.approx(1.0)
    assert o.ttft.count == 13
    assert o.ttft.mean == pytest.approx((16 - 3) * 0.3 / 13)
    assert (o.kv_usage_mean, o.kv_usage_max) == (pytest.approx(0.4), 0.6)
    assert (o.running_mean, o.running_max, o.max_running_seen) == (4.0, 6.0, 6.0)


def test_counter_reset_starts_a_fresh_window():
    w = Window(600)
    w.observe(snap(0.0, prompt=1000, gen=10, finished={"stop": 5}, ttft=(1, 1, 1, 1)))
    w.observe(snap(15.0, prompt=2000, gen=20, finished={"stop": 9}, ttft=(2, 2, 2, 2)))
    # restart: counters back near zero (same _created, so only the counters tell)
    w.observe(snap(30.0, prompt=300, gen=3, finished={"stop": 1}, ttft=(0, 1, 1, 1)))
    o = w.summary(30.0)
    assert (o.samples, o.reset, o.resets) == (1, True, 1)
    assert o.prompt_tokens_per_s is None  # one snapshot since the restart: no rate yet
    w.observe(snap(45.0, prompt=900, gen=9, finished={"stop": 3}, ttft=(0, 2, 3, 3)))
    o = w.summary(45.0)
    assert o.samples == 2 and o.reset
    assert o.prompt_tokens_per_s == pytest.approx(600 / 15)  # never negative
    assert o.requests_per_s == pytest.approx(2 / 15)
    # the reset flag clears once the restart has left the window
    assert Window(20).summary(0).reset is False
    w2 = Window(20)
    w2.observe(snap(0.0, prompt=10, gen=1, finished={"stop": 1}, ttft=(1, 1, 1, 1)))
    w2.observe(snap(10.0, prompt=5, gen=1, finished={"stop": 1}, ttft=(1, 1, 1, 1)))
    assert w2.summary(10.0).reset and not w2.summary(31.0).reset


def test_new_start_time_is_a_reset_even_if_counters_grew():
    w = Window(600)
    w.observe(snap(0.0, prompt=10, gen=1, finished={"stop": 1}, ttft=(1, 1, 1, 1), created=1.7e9))
    w.observe(snap(15.0, prompt=50, gen=5, finished={"stop": 2}, ttft=(1, 1, 1, 1), created=1.7e9 + 10))
    assert w.summary(15.0).reset and len(w) == 1


def test_window_is_bounded_by_count_and_duration_without_reallocation():
    w = Window(100, max_samples=5)
    ring = w._ring
    for i in range(40):
        w.observe(snap(float(i), prompt=i * 10, gen=i, finished={"stop": i}, ttft=(i, i, i, i), running=i))
        assert len(w) <= 5
    assert w._ring is ring and len(ring) == 5
    assert [s.timestamp for s in w.snapshots()] == [35.0, 36.0, 37.0, 38.0, 39.0]
    o = w.summary(39.0)
    assert (o.running_mean, o.running_max) == (37.0, 39.0)
    assert o.max_running_seen == 39.0
    # duration: with snapshots every 10 s, a 25 s window keeps those >= now - 25
    w = Window(25)
    for i in range(10):
        w.observe(snap(i * 10.0, prompt=i, gen=i, finished={"stop": i}, ttft=(i, i, i, i)))
    assert [s.timestamp for s in w.snapshots()] == [70.0, 80.0, 90.0]
    assert w.summary(200.0).samples == 0  # everything aged out
    assert not w.observe(snap(50.0, prompt=0, gen=0, finished={"stop": 0}, ttft=(0, 0, 0, 0)))


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 64)), min_size=1, max_size=40),
       cap=st.integers(2, 8), duration=st.integers(5, 60))
def test_incremental_gauge_stats_match_recomputation(values, cap, duration):
    w = Window(duration, max_samples=cap)
    base = snap(0.0, prompt=0, gen=0, finished={"stop": 0}, ttft=(0, 0, 0, 0))
    for i, (kv, running) in enumerate(values):
        s = Snapshot(target="t", model_name="m", timestamp=float(i * 3), engine_era="v1",
                     gauges={"kv_cache_usage": kv, "num_requests_running": float(running)},
                     counters=base.counters, histograms=base.histograms)
        w.observe(s)
        o = w.summary(float(i * 3))
        kept = w.snapshots()
        kvs = [k.gauges["kv_cache_usage"] for k in kept]
        runs = [k.gauges["num_requests_running"] for k in kept]
        assert o.samples == len(kept) <= cap
        assert o.kv_usage_mean == pytest.approx(sum(kvs) / len(kvs), abs=1e-9)
        assert o.kv_usage_max == max(kvs)
        assert (o.running_mean, o.running_max) == (pytest.approx(sum(runs) / len(runs)), max(runs))


def test_histogram_delta_refuses_layout_change_and_decrease():
    a = Histogram((1.0, math.inf), (1.0, 2.0), 1.0, 2.0)
    assert Histogram((1.0, 2.0, math.inf), (1.0, 1.0, 3.0), 2.0, 3.0).delta(a) is None
    assert Histogram((1.0, math.inf), (0.0, 1.0), 0.5, 1.0).delta(a) is None


# ---------------------------------------------------------------------------------------------
# observed signals

def test_observed_signals_keys_and_real_capture_values():
    paths = sorted(PROM.glob("*.prom"))
    if not paths:
        pytest.skip(f"shared captures not found under {PROM}")
    for path in paths:
        raw = path.read_bytes()
        fams = {f.name: f for f in text_string_to_metric_families(raw.decode())}
        s = parse_vllm(raw, target="t", timestamp=0.0)[0]
        w = Window(600)
        w.observe(s)
        obs = observed_signals(s, w.summary(0.0), max_model_len=4096)
        assert set(OBSERVED_KEYS) <= set(obs)
        json.dumps(obs, allow_nan=False)  # plain JSON, no NaN
        info = (fams.get("vllm:cache_config_info") or fams["vllm:cache_config"]).samples[0].labels
        assert obs["num_gpu_blocks"] == int(info["num_gpu_blocks"])
        assert obs["block_size"] == int(info["block_size"])
        assert obs["gpu_memory_utilization"] == float(info["gpu_memory_utilization"])
        assert obs["enable_prefix_caching"] == (info["enable_prefix_caching"] == "True")
        assert obs["cache_dtype"] == info["cache_dtype"]
        assert obs["kv_cache_tokens"] == obs["num_gpu_blocks"] * obs["block_size"]
        assert obs["max_model_len"] == 4096
        for key in ("num_requests_running", "num_requests_waiting"):
            assert obs[key] == sum(x.value for x in fams[f"vllm:{key}"].samples)
        for key in ("prompt_tokens", "generation_tokens", "num_preemptions"):
            assert obs[f"{key}_total"] == sum(x.value for x in fams[f"vllm:{key}"].samples)
        assert obs["spec_decode_acceptance_rate"] is None  # no speculative decoding in these


def test_observed_latency_from_cumulative_then_from_window():
    raw = (PROM / "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom")
    if not raw.exists():
        pytest.skip(f"{raw} not found")
    s = parse_vllm(raw.read_bytes(), target="t", timestamp=0.0)[0]
    fams = {f.name: f for f in text_string_to_metric_families(raw.read_text())}
    buckets = [(float(x.labels["le"]), x.value) for x in fams["vllm:time_to_first_token_seconds"].samples
               if x.name.endswith("_bucket")]
    # hand: 6 observations, rank 3 for p50 lies in the first bucket holding any (0.02, 0.04]: 0..4
    lo = [(b, c) for b, c in buckets if c > 0][0]
    prev = max(b for b, c in buckets if b < lo[0])
    obs = observed_signals(s)
    assert obs["latency_source"] == "cumulative"
    assert obs["ttft_p50_s"] == pytest.approx(prev + (lo[0] - prev) * 3 / lo[1])
    assert obs["tpot_source"] == "itl"  # 0.10.1 has no per-request TPOT histogram
    assert obs["prefix_cache_hit_ratio"] == pytest.approx(80 / 246)
    # a window with traffic overrides the lifetime figures
    w = Window(600)
    w.observe(snap(0.0, prompt=0, gen=0, finished={"stop": 0}, ttft=(0, 0, 0, 0)))
    later = snap(30.0, prompt=300, gen=30, finished={"stop": 3}, ttft=(2, 2, 3, 3))
    w.observe(later)
    obs = observed_signals(later, w.summary(30.0))
    assert obs["latency_source"] == "window"
    assert obs["ttft_p50_s"] == pytest.approx(0.1 * 1.5 / 2)
    assert obs["prompt_tokens_per_s"] == pytest.approx(10.0)
    assert obs["window_samples"] == 2 and obs["counter_reset"] is False


def spec_exposition(drafts: float, drafted: float, accepted: float, per_pos: tuple[float, ...],
                    hits: float, queries: float) -> str:
    lines = ["# TYPE vllm:spec_decode_num_drafts_total counter",
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
             "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafted}',
             "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}'
              for i, v in enumerate(per_pos)]
    lines += ["# TYPE vllm:prefix_cache_hits_total counter",
              f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}',
              "# TYPE vllm:prefix_cache_queries_total counter",
              f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}']
    return "\n".join(lines) + "\n"


def test_spec_decode_and_prefix_cache_over_the_window():
    w = Window(600)
    (a,) = parse_vllm(spec_exposition(100, 300, 150, (80, 50, 20), 1000, 4000), target="t", timestamp=0.0)
    (b,) = parse_vllm(spec_exposition(300, 900, 390, (230, 120, 40), 1600, 5000), target="t", timestamp=60.0)
    w.observe(a)
    w.observe(b)
    o = w.summary(60.0)
    # 200 drafts of 3 tokens = 600 drafted, 240 accepted (150 + 70 + 20 by position)
    assert o.spec_decode_acceptance_rate == pytest.approx(240 / 600)
    assert o.spec_decode_mean_acceptance_length == pytest.approx(1 + 240 / 200)
    assert o.spec_decode_acceptance_per_pos == pytest.approx((150 / 200, 70 / 200, 20 / 200))
    assert o.prefix_cache_hit_ratio == pytest.approx(600 / 1000)
    obs = observed_signals(b, o)
    assert obs["spec_decode_acceptance_rate"] == pytest.approx(0.4)
    assert obs["prefix_cache_hit_ratio"] == pytest.approx(0.6)
    # one snapshot only: lifetime ratios
    alone = observed_signals(b)
    assert alone["spec_decode_acceptance_rate"] == pytest.approx(390 / 900)
    assert alone["prefix_cache_hit_ratio"] == pytest.approx(1600 / 5000)


def test_thinned_window_keeps_few_whole_snapshots_and_exact_rates():
    w = Window(600)  # keep_every = 75 s
    for i in range(120):  # 30 minutes of 15 s scrapes at a constant 40 prompt tokens/s
        w.observe(snap(i * 15.0, prompt=600.0 * i, gen=10.0 * i, finished={"stop": i}, ttft=(i, i, i, i),
                       running=float(i % 7)))
        whole = w.snapshots()
        assert len(whole) <= 600 / 75 + 2
        assert whole[-1].timestamp == i * 15.0  # the newest is always whole
    o = w.summary(119 * 15.0)
    assert o.samples == 41  # entries inside the last 600 s, all counted for gauge statistics
    assert 600 * 7 / 8 <= o.duration_s <= 600
    assert o.prompt_tokens_per_s == pytest.approx(40.0)
    runs = [float(i % 7) for i in range(79, 120)]
    assert o.running_mean == pytest.approx(sum(runs) / len(runs))
    assert o.running_max == max(runs)
    # count-bounded windows keep a baseline too
    w = Window(600, max_samples=16)
    for i in range(100):
        w.observe(snap(i * 15.0, prompt=600.0 * i, gen=i, finished={"stop": i}, ttft=(i, i, i, i)))
        if i >= 1:
            o = w.summary(i * 15.0)
            assert o.prompt_tokens_per_s == pytest.approx(40.0)
    assert o.duration_s >= (16 - 16 // 8 - 1) * 15


def test_gauges_only_snapshots_are_not_rate_baselines():
    # what a state file restores between its first and last whole snapshots
    w = Window(600, keep_every=0)
    w.observe(Snapshot(target="t", model_name="m", timestamp=0.0, engine_era="v1",
                       gauges={"num_requests_running": 3.0}))
    w.observe(snap(15.0, prompt=100, gen=10, finished={"stop": 1}, ttft=(1, 1, 1, 1), running=5))
    w.observe(snap(45.0, prompt=1300, gen=40, finished={"stop": 4}, ttft=(2, 3, 4, 4), running=7))
    o = w.summary(45.0)
    assert o.prompt_tokens_per_s == pytest.approx(1200 / 30)
    assert o.running_mean == pytest.approx(5.0) and o.samples == 3


def test_history_is_how_long_the_window_has_filled_not_its_span():
    """`history_s` grows from the first snapshot until the window is whole and then stays past
    its length, while the span (`duration_s`) moves with the scrape times; a reset or a drained
    window starts it afresh."""
    w = Window(60)
    ts = [0.0, 16.0, 29.5, 46.0, 61.5, 75.0, 92.0, 104.0]     # scrapes ~15 s apart, jittered
    spans, histories = [], []
    for i, t in enumerate(ts):
        w.observe(snap(t, prompt=100 * i, gen=10 * i, finished={"stop": i}, ttft=(i, i, i, i)))
        o = w.summary(t + 7.0)                                  # evaluated between two scrapes
        spans.append(o.duration_s)
        histories.append(o.history_s)
    assert histories == ts                                      # since the first snapshot
    assert len(set(spans[4:])) > 1 and max(spans[4:]) < 60      # the whole window's span jitters
    # a counter reset: the window fills again from the restart
    w.observe(snap(120.0, prompt=5, gen=1, finished={"stop": 1}, ttft=(1, 1, 1, 1)))
    assert w.summary(120.0).history_s == 0.0
    w.observe(snap(135.0, prompt=50, gen=5, finished={"stop": 2}, ttft=(2, 2, 2, 2)))
    assert w.summary(135.0).history_s == 15.0
    # drained by a long outage: the next snapshot starts it afresh
    w.summary(400.0)
    assert len(w) == 0
    w.observe(snap(410.0, prompt=60, gen=6, finished={"stop": 3}, ttft=(3, 3, 3, 3)))
    assert w.summary(410.0).history_s == 0.0
