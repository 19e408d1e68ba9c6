"""The sweep's statistics and knee rule on hand-built request results: TPOT as `vllm bench serve`
defines it, throughput over the measured window, and the knee by saturation and by SLO."""
from __future__ import annotations

import math

import pytest

from exporter.loadgen.client import RequestResult
from exporter.loadgen.stats import find_knee, gain_per_doubling, summarize


def _req(start, ttft, n, tpot, prompt=100):
    end = start + ttft + (n - 1) * tpot
    itl = [tpot] * (n - 1)
    return RequestResult(ok=True, start=start, end=end, ttft=ttft, itl=itl, prompt_tokens=prompt,
                         output_tokens=n, usage_reported=True)


def test_summary_uses_bench_serve_definitions():
    rs = [_req(0.0, 0.2, 11, 0.05), _req(0.5, 0.4, 21, 0.1)]
    rs.append(RequestResult(ok=False, start=1.0, end=1.1, error="HTTP 500: boom"))
    d = summarize(rs)
    assert d["requests"] == 3 and d["completed"] == 2 and d["failed"] == 1
    assert d["errors"] == ["HTTP 500: boom"]
    assert d["duration_s"] == pytest.approx(0.5 + 0.4 + 2.0)          # first start .. last end
    assert d["output_tokens_per_s"] == pytest.approx(32 / 2.9)
    assert d["total_tokens_per_s"] == pytest.approx(232 / 2.9)
    assert d["tpot_mean_s"] == pytest.approx(0.075)                   # (e2e - ttft) / (n - 1)
    assert d["ttft_p50_s"] == pytest.approx(0.3)
    assert d["itl_p50_s"] == pytest.approx(0.1)                       # pooled over requests: 10 x .05, 20 x .1
    assert d["in_flight_mean"] == pytest.approx((0.7 + 2.4) / 2.9)


def test_one_token_requests_have_no_tpot():
    d = summarize([_req(0.0, 0.2, 1, 0.0)])
    assert d["tpot_mean_s"] is None and d["ttft_mean_s"] == pytest.approx(0.2)


def test_gain_per_doubling_normalises_uneven_steps():
    assert gain_per_doubling(1, 100, 4, 400) == pytest.approx(1.0)   # x4 load, x4 throughput: +100 %/doubling
    assert gain_per_doubling(4, 100, 16, 121) == pytest.approx(0.1)
    assert gain_per_doubling(4, 100, 4, 200) is None


def _lv(c, t, ttft=0.1, tpot=0.02):
    return {"concurrency": c, "output_tokens_per_s": t, "ttft_p99_s": ttft, "tpot_p99_s": tpot}


def test_knee_at_saturation():
    levels = [_lv(1, 50), _lv(2, 98), _lv(4, 190), _lv(8, 360), _lv(16, 380), _lv(32, 385)]
    k = find_knee(levels)
    assert (k.level, k.index, k.reason) == (8, 3, "saturated")
    assert "+5.6 %" in k.detail
    assert find_knee(levels[:4]) is None


def test_knee_by_slo_and_first_level_breaking_it():
    levels = [_lv(1, 50, tpot=0.02), _lv(2, 98, tpot=0.03), _lv(4, 190, tpot=0.09)]
    k = find_knee(levels, tpot_slo=0.08)
    assert (k.level, k.reason) == (2, "slo") and "TPOT p99 90.0 ms > 80.0 ms" in k.detail
    k = find_knee(levels, ttft_slo=0.05)
    assert (k.level, k.index, k.reason) == (1, 0, "slo") and "already" in k.detail


def test_rate_levels_use_the_same_rule():
    levels = [{"rate": 0.5, "output_tokens_per_s": 60}, {"rate": 1, "output_tokens_per_s": 119},
              {"rate": 2, "output_tokens_per_s": 125}]
    k = find_knee(levels, "rate")
    assert k.level == 1 and "requests/s" in k.detail
    assert not math.isnan(k.level)
