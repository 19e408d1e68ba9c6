"""The performance part of `vllm-drift calc`: predicted latency, recommended flags, GPU tiers.

Why one function: the CLI and the daemon both want the same three sections for a setup and a
traffic description, with the same defaults (no load given -> the recommended operating point).
"""
from __future__ import annotations

from typing import Any, Mapping

from exporter.model.optimizer import rank_tiers, recommend
from exporter.model.perf import predict
from exporter.model.spec_decode import SpecConfig
from exporter.model.traffic import SLO, Traffic


def performance_report(setup: Any, *, prompt_tokens: float, output_tokens: float,
                       concurrency: int | None = None, rate: float | None = None,
                       prefix_hit_ratio: float = 0.0, ttft_slo: float | None = None,
                       tpot_slo: float | None = None, spec_tokens: int = 0,
                       spec_acceptance: float | None = None,
                       prices: Mapping[str, float] | None = None,
                       tiers: bool = True, tier_limit: int | None = 12,
                       calibration: Any = None) -> dict[str, Any]:
    """{"predicted": ..., "recommendation": ..., "tiers": [...]} for `setup` under the traffic.

    "predicted" is at the given concurrency or rate; without either, at the recommended
    operating point (recommended flags, running the recommended max_num_seqs). `calibration`:
    fitted step-time factors (`exporter.model.calibrate`) for "predicted"; the prior's TPOT and
    TTFT are then kept beside them."""
    traffic = Traffic(prompt_tokens_mean=float(prompt_tokens), output_tokens_mean=float(output_tokens),
                      arrival_rate_rps=rate, concurrency=concurrency,
                      prefix_hit_ratio=float(prefix_hit_ratio or 0.0),
                      spec_acceptance_rate=spec_acceptance, spec_tokens=int(spec_tokens or 0))
    slo = SLO(ttft_p99_s=ttft_slo, tpot_p99_s=tpot_slo)
    spec = None
    if spec_tokens and spec_tokens > 0:
        spec = SpecConfig(num_tokens=int(spec_tokens), alpha=float(spec_acceptance or 0.0))
    rec = recommend(setup, traffic, slo, spec)
    if concurrency is not None or rate is not None:
        at, kw = setup, dict(concurrency=concurrency, rate=rate, spec=spec)
        point = "given load"
    else:
        at = setup.with_(max_num_seqs=rec.max_num_seqs, gpu_memory_utilization=rec.gpu_memory_utilization,
                         max_model_len=rec.max_model_len,
                         max_num_batched_tokens=rec.max_num_batched_tokens)
        kw = dict(concurrency=rec.max_num_seqs, spec=spec if rec.speculative_decoding else None)
        point = f"recommended operating point (concurrency {rec.max_num_seqs})"
    pred = predict(at, traffic, **kw, calibration=calibration)
    predicted = pred.as_dict()
    predicted["basis"] = "prior"
    if calibration is not None:
        prior = predict(at, traffic, **kw)
        predicted["basis"] = "calibrated"
        predicted["prior_tpot_s"] = prior.as_dict()["tpot_s"]
        predicted["prior_ttft_s"] = prior.as_dict()["ttft_s"]
    predicted["operating_point"] = point
    predicted["meets_slo"] = _meets(pred, slo)
    doc: dict[str, Any] = {"predicted": predicted, "recommendation": rec.as_dict()}
    if tiers:
        # a closed-loop load is converted to the request rate it produces on this setup
        load = rate if rate is not None else (pred.requests_per_s if concurrency is not None else None)
        ranked = rank_tiers(setup.model, traffic, slo, prices=prices, quantization=setup.quantization,
                            kv_cache_dtype=setup.kv_cache_dtype, vllm_version=setup.vllm_version,
                            concurrency_rate=load, limit=tier_limit)
        doc["tiers"] = [t.as_dict() for t in ranked]
    else:
        doc["tiers"] = []
    return doc


def _meets(pred: Any, slo: SLO) -> bool | None:
    if slo.ttft_p99_s is None and slo.tpot_p99_s is None:
        return None
    ok = True
    if slo.ttft_p99_s is not None:
        ok = ok and pred.ttft_p99_s <= slo.ttft_p99_s
    if slo.tpot_p99_s is not None:
        ok = ok and pred.tpot_s <= slo.tpot_p99_s
    return ok
