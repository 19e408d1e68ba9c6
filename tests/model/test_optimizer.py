"""Optimiser: binding constraints of each recommendation, tier ranking by cost at equal SLO, and
the report the `calc` command prints."""
from __future__ import annotations

import pytest

from exporter.model import perf
from exporter.model.optimizer import (capture_size_floor, rank_tiers, recommend, round_model_len,
                                      tpot_batch_limit)
from exporter.model.report import performance_report
from exporter.model.setup import Setup
from exporter.model.spec_decode import SpecConfig
from exporter.model.traffic import SLO, Traffic


def _setup(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", **kw):
    return Setup.build(model, gpu, max_model_len=kw.pop("max_model_len", 8192), **kw)


def test_rounding_helpers():
    assert [capture_size_floor(x) for x in (0.5, 3, 7, 8, 13, 255, 300, 2000)] == \
        [1, 2, 4, 8, 8, 248, 288, 2000]
    assert round_model_len(3900) == 4096 and round_model_len(1000) == 1024
    assert round_model_len(9000) == 9216


def test_max_model_len_follows_p99_prompt_plus_output():
    tr = Traffic(1000, 200, prompt_tokens_p99=3000, output_tokens_p99=900)
    rec = recommend(_setup(), tr)
    assert rec.max_model_len == 4096
    assert "p99 prompt+output" in rec.binding["max_model_len"]


def test_max_model_len_capped_by_the_model():
    tr = Traffic(1000, 200, prompt_tokens_p99=200_000, output_tokens_p99=900)
    rec = recommend(_setup(), tr)
    assert rec.max_model_len == 131072 and "model maximum" in rec.binding["max_model_len"]


def test_max_num_seqs_bound_by_kv_capacity_for_long_requests():
    s = _setup("meta-llama/Llama-3.1-70B-Instruct", tp=2, quantization="fp8", max_model_len=16384)
    tr = Traffic(8000, 2000)
    rec = recommend(s, tr)
    assert rec.binding["max_num_seqs"].startswith("KV capacity")
    tuned = s.with_(gpu_memory_utilization=rec.gpu_memory_utilization, max_model_len=rec.max_model_len)
    slots = perf.kv_slots(tr, perf.kv_tokens_for(tuned))
    assert rec.max_num_seqs <= 0.9 * slots < rec.max_num_seqs + 9


def test_max_num_seqs_bound_by_tpot_slo():
    s = _setup()
    tr = Traffic(512, 256)
    rec = recommend(s, tr, SLO(tpot_p99_s=0.012))
    assert rec.binding["max_num_seqs"].startswith("TPOT SLO")
    tuned = s.with_(gpu_memory_utilization=rec.gpu_memory_utilization, max_model_len=rec.max_model_len,
                    max_num_seqs=rec.max_num_seqs)
    assert perf.predict(tuned, tr, concurrency=rec.max_num_seqs).tpot_s <= 0.012
    assert perf.predict(tuned.with_(max_num_seqs=1024), tr, concurrency=rec.max_num_seqs + 16).tpot_s > 0.012


def test_unreachable_tpot_slo_is_named():
    rec = recommend(_setup(), Traffic(512, 256), SLO(tpot_p99_s=0.001))
    assert rec.max_num_seqs == 1 and "unreachable" in rec.binding["max_num_seqs"]
    assert tpot_batch_limit(_setup(), Traffic(512, 256), 0.001, 64) == 0


def test_batched_tokens_cover_the_p99_prompt_and_the_batch():
    rec = recommend(_setup(), Traffic(1000, 200, prompt_tokens_p99=6000))
    assert rec.max_num_batched_tokens >= 6000 + rec.max_num_seqs or \
        rec.max_num_batched_tokens == 16384
    assert rec.max_num_batched_tokens >= rec.max_num_seqs


def test_speculation_on_at_low_load_off_at_high_load():
    spec = SpecConfig(num_tokens=3, alpha=0.8)
    low = recommend(_setup(), Traffic(1024, 256, arrival_rate_rps=0.1), spec=spec)
    assert low.speculative_decoding and low.binding["speculative_decoding"].startswith("gain")
    high = recommend(_setup(), Traffic(200, 200, concurrency=512), spec=spec)
    assert not high.speculative_decoding


def test_tiny_load_picks_a_cheaper_tier_than_heavy_load():
    model = "meta-llama/Llama-3.1-8B-Instruct"
    slo = SLO(ttft_p99_s=2.0, tpot_p99_s=0.08)
    tiny = rank_tiers(model, Traffic(512, 128, arrival_rate_rps=0.05), slo)
    heavy = rank_tiers(model, Traffic(512, 128, arrival_rate_rps=200), slo)
    assert tiny[0].meets_slo and heavy[0].meets_slo
    assert tiny[0].replicas == 1 and tiny[0].dollars_per_hour < 2.0
    assert heavy[0].dollars_per_hour > 5 * tiny[0].dollars_per_hour
    assert heavy[0].replicas * heavy[0].replica_rate_rps * 0.85 >= 200
    # sorted: among tiers meeting the SLO, cheapest per hour first
    ok = [t.dollars_per_hour for t in heavy if t.meets_slo]
    assert ok == sorted(ok)


def test_prices_override_the_catalog():
    model = "meta-llama/Llama-3.1-8B-Instruct"
    tr, slo = Traffic(512, 128, arrival_rate_rps=0.5), SLO(tpot_p99_s=0.1)
    base = rank_tiers(model, tr, slo, gpus=["H100", "A100-80GB"], tps=(1,))
    assert base[0].gpu == "A100-80GB"
    cheap = rank_tiers(model, tr, slo, gpus=["H100", "A100-80GB"], tps=(1,), prices={"h100": 0.10})
    assert cheap[0].gpu == "H100-SXM-80GB" and cheap[0].dollars_per_hour == pytest.approx(0.10)


def test_tier_cannot_hold_a_70b_model_on_one_small_gpu():
    tiers = rank_tiers("meta-llama/Llama-3.1-70B-Instruct", Traffic(512, 128, arrival_rate_rps=1),
                       SLO(), gpus=["L4"], tps=(1,))
    assert tiers == []


def test_performance_report_shapes():
    s = _setup()
    doc = performance_report(s, prompt_tokens=1024, output_tokens=256, concurrency=8,
                             ttft_slo=1.0, tpot_slo=0.05)
    assert set(doc) >= {"predicted", "recommendation", "tiers"}
    assert set(doc["predicted"]) >= {"ttft_s", "tpot_s", "output_tokens_per_s"}
    assert doc["predicted"]["operating_point"] == "given load"
    assert set(doc["recommendation"]) >= {"max_num_seqs", "gpu_memory_utilization", "max_model_len",
                                          "max_num_batched_tokens", "speculative_decoding", "binding"}
    t = doc["tiers"][0]
    assert set(t) >= {"gpu", "tp", "replicas", "dollars_per_hour", "dollars_per_million_tokens", "meets_slo"}
    free = performance_report(s, prompt_tokens=1024, output_tokens=256)
    assert free["predicted"]["operating_point"].startswith("recommended")
    assert free["predicted"]["running"] == pytest.approx(free["recommendation"]["max_num_seqs"])
