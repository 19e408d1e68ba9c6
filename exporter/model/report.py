"""The performance part of `vllm-drift calc`: predicted latency, recommended flags, speculative
decoding verdict and GPU tiers.

Why one function: the CLI and the daemon both want the same sections for a setup and a traffic
description, with the same defaults (no load given -> the recommended operating point).
"""
from __future__ import annotations

from typing import Any, Mapping

from exporter.model.optimizer import rank_tiers, recommend
from exporter.model.perf import predict, prior_note
from exporter.model.spec_decode import DEFAULT_SPEC_TOKENS, SpecConfig, spec_verdict
from exporter.model.tradeoff import tpot_p99_s
from exporter.model.traffic import SLO, Traffic


def make_traffic(*, prompt_tokens: float, output_tokens: float, prompt_tokens_p99: float | None = None,
                 output_tokens_p99: float | None = None, concurrency: int | None = None,
                 rate: float | None = None, prefix_hit_ratio: float = 0.0,
                 spec_tokens: int = 0, spec_acceptance: float | None = None) -> Traffic:
    return Traffic(prompt_tokens_mean=float(prompt_tokens), output_tokens_mean=float(output_tokens),
                   prompt_tokens_p99=None if prompt_tokens_p99 is None else float(prompt_tokens_p99),
                   output_tokens_p99=None if output_tokens_p99 is None else float(output_tokens_p99),
                   arrival_rate_rps=rate, concurrency=concurrency,
                   prefix_hit_ratio=float(prefix_hit_ratio or 0.0),
                   spec_acceptance_rate=spec_acceptance, spec_tokens=int(spec_tokens or 0))


def performance_report(setup: Any, *, prompt_tokens: float, output_tokens: float,
                       concurrency: int | None = None, rate: float | None = None,
                       prefix_hit_ratio: float = 0.0, ttft_slo: float | None = None,
                       tpot_slo: float | None = None, spec_tokens: int = 0,
                       spec_acceptance: float | None = None,
                       prices: Mapping[str, float] | None = None,
                       tiers: bool = True, tier_limit: int | None = 12,
                       prompt_tokens_p99: float | None = None,
                       output_tokens_p99: float | None = None,
                       calibration: Any = None) -> dict[str, Any]:
    """{"predicted", "recommendation", "speculative_decoding", "tiers", "notes"} for `setup`.

    A setup started with `--speculative-config` (`setup.speculative`) is judged with its method
    and its num_speculative_tokens unless `spec_tokens` says otherwise.

    "predicted" is at the given concurrency or rate; without either, at the recommended
    operating point (recommended flags, running the recommended max_num_seqs). The current
    GPU x TP is always a tier row (`current: true`). `calibration`: factors fitted on this
    setup's measured rows (`exporter.model.calibrate`) for "predicted" and the recommendation
    (the prior's TPOT and TTFT are kept beside them); the tiers, other GPUs and TPs, stay a priori."""
    drafter = getattr(setup, "speculative", None)
    method = drafter.method if drafter is not None else "eagle"
    if drafter is not None and not spec_tokens:
        spec_tokens = drafter.num_speculative_tokens
    traffic = make_traffic(prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                           prompt_tokens_p99=prompt_tokens_p99, output_tokens_p99=output_tokens_p99,
                           concurrency=concurrency, rate=rate, prefix_hit_ratio=prefix_hit_ratio,
                           spec_tokens=spec_tokens, spec_acceptance=spec_acceptance)
    slo = SLO(ttft_p99_s=ttft_slo, tpot_p99_s=tpot_slo)
    notes: list[str] = []
    tail = traffic.tail_note()
    if tail:
        notes.append(tail)
    spec = None
    if spec_tokens and spec_tokens > 0 and spec_acceptance is not None:
        spec = SpecConfig(num_tokens=int(spec_tokens), alpha=float(spec_acceptance), method=method)
    rec = recommend(setup, traffic, slo, spec, calibration=calibration)
    tuned = setup.with_(max_num_seqs=rec.max_num_seqs, gpu_memory_utilization=rec.gpu_memory_utilization,
                        max_model_len=rec.max_model_len, max_num_batched_tokens=rec.max_num_batched_tokens)
    fit = _fit_note(tuned)
    if fit:
        notes.append(fit)
    if concurrency is not None or rate is not None:
        at, kw = setup, dict(concurrency=concurrency, rate=rate, spec=spec)
        point = "given load"
    else:
        at = tuned
        kw = dict(concurrency=rec.max_num_seqs, spec=spec if rec.speculative_decoding else None)
        point = f"recommended operating point (concurrency {rec.max_num_seqs})"
    pred = predict(at, traffic, **kw, calibration=calibration)
    predicted = pred.as_dict()
    tp99 = tpot_p99_s(at, traffic, pred, calibration)
    predicted["tpot_p99_s"] = None if tp99 is None else round(tp99, 6)
    predicted["basis"] = "prior"
    if calibration is None:
        caution = prior_note(setup.gpu.name, setup.gpu.vendor)
        if caution:
            notes.append(caution)
    else:
        prior = predict(at, traffic, **kw)
        predicted["basis"] = "calibrated"
        predicted["prior_tpot_s"] = prior.as_dict()["tpot_s"]
        predicted["prior_ttft_s"] = prior.as_dict()["ttft_s"]
    predicted["operating_point"] = point
    predicted["meets_slo"] = _meets(pred, tp99, slo)
    # speculative decoding: one shared verdict (spec_decode.spec_verdict) at the batch this
    # replica runs, across acceptance 0.3-0.9 unless a rate was given
    batch = max(int(round(pred.running)), 1)
    ctx = traffic.prompt_tokens_mean + traffic.output_tokens_mean / 2.0
    verdict = spec_verdict(at, batch, ctx, acceptance=spec_acceptance,
                           num_tokens=spec_tokens or DEFAULT_SPEC_TOKENS, method=method)
    recommendation = rec.as_dict()
    if spec is None:
        recommendation["speculative_decoding"] = verdict["recommended"]
        recommendation["binding"]["speculative_decoding"] = verdict["verdict"]
    doc: dict[str, Any] = {"traffic": _traffic_doc(traffic), "predicted": predicted,
                           "recommendation": recommendation, "speculative_decoding": verdict}
    if tiers:
        # a closed-loop load is converted to the request rate it produces on this setup
        load = rate if rate is not None else (pred.requests_per_s if concurrency is not None else None)
        ranked = rank_tiers(setup.model, traffic, slo, prices=prices, quantization=setup.quantization,
                            kv_cache_dtype=setup.kv_cache_dtype, vllm_version=setup.vllm_version,
                            concurrency_rate=load, limit=tier_limit, current=(setup.gpu.name, setup.tp))
        doc["tiers"] = [t.as_dict() for t in ranked]
        if calibration is not None:
            notes.append(f"tiers are a priori for every GPU and TP, {setup.tp} x {setup.gpu.name} included "
                         "(the calibration describes that setup alone; its calibrated figures are above)")
    else:
        doc["tiers"] = []
    if drafter is not None:
        notes.extend(drafter.notes)
    doc["notes"] = notes
    return doc


def _fit_note(tuned: Any) -> str | None:
    """vLLM refuses to start when one max_model_len request does not fit the KV cache; the
    recommendation keeps the length the traffic needs and says what it takes to serve it."""
    from exporter.errors import InputError
    from exporter.model.kv_cache import kv_capacity, largest_max_model_len
    try:
        cap = kv_capacity(tuned, check_fits=False)
    except InputError as exc:
        return str(exc)
    if cap.fits:
        return None
    largest = largest_max_model_len(tuned, cap.fit_blocks)
    return (f"the p99 request needs max_model_len {tuned.max_model_len} but this setup's KV cache holds "
            f"at most {max(largest, 0)} tokens per request, so vLLM would not start with it: use more "
            "GPUs (--tp), a bigger GPU, --kv-cache-dtype fp8 or quantized weights (see the tiers)")


def _traffic_doc(t: Traffic) -> dict[str, Any]:
    return {"prompt_tokens": {"mean": t.prompt_tokens_mean, "p99": t.prompt_p99,
                              "p99_source": "margin" if "prompt" in t.tail_assumed else "given"},
            "output_tokens": {"mean": t.output_tokens_mean, "p99": t.output_p99,
                              "p99_source": "margin" if "output" in t.tail_assumed else "given"},
            "prefix_hit_ratio": t.prefix_hit_ratio, "rate_rps": t.arrival_rate_rps,
            "concurrency": t.concurrency}


def _meets(pred: Any, tpot_p99: float | None, slo: SLO) -> bool | None:
    if slo.ttft_p99_s is None and slo.tpot_p99_s is None:
        return None
    ok = True
    if slo.ttft_p99_s is not None:
        ok = ok and pred.ttft_p99_s <= slo.ttft_p99_s
    if slo.tpot_p99_s is not None:
        ok = ok and (tpot_p99 if tpot_p99 is not None else pred.tpot_s) <= slo.tpot_p99_s
    return ok
