"""Trade-off tables: one engine parameter at a time, what each value buys and costs.

Why: the tuning question is rarely "what is optimal" in the abstract but "what do I give up if I
raise max_num_seqs / lower gpu_memory_utilization / switch to an fp8 KV cache". Each row is the
performance model at that value, everything else at the recommended setup: KV tokens, how many
requests of this traffic fit, throughput, TTFT/TPOT p50 and p99, $/million output tokens, whether
the SLOs hold, and what binds. Without a given load each row runs at its own capacity (the
saturating closed loop: as many clients as the setting lets run), which is what the setting buys.

Percentiles: p50 is the model's mean (the queueing model is for means; latency at a fixed mix is
close to symmetric around it); TTFT p99 is `Prediction.ttft_p99_s` (prefill-queue tail); TPOT p99
is derived in `tpot_p99_s` from how many of a request's decode steps carry a prefill chunk.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from exporter.errors import InputError
from exporter.model.optimizer import KV_MARGIN, capture_size_floor
from exporter.model.perf import Prediction, kv_pool_tokens, kv_slots, predict, step_time_s
from exporter.model.setup import tp_refusal
from exporter.model.traffic import SLO, Z99, Traffic

PARAMS = ("max_num_seqs", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
          "tp", "kv_cache_dtype", "quantization")
# the parameters a calibration of this model x GPU x TP still describes (the others change it)
CALIBRATED_PARAMS = PARAMS[:4]


def tpot_p99_s(setup: Any, traffic: Traffic, pred: Prediction, calibration: Any = None) -> float | None:
    """p99 of per-request TPOT.

    A request's TPOT is the mean of its decode steps; a share q of steps also carries a prefill
    chunk (slower by dt). q follows from the predicted mean step time, q = (t_mean - t_decode)/dt;
    over m = output - 1 steps the count of mixed steps is binomial, so the 99th percentile request
    sees q + z99 sqrt(q (1 - q) / m) of them. Stalls (preemption) in the mean are kept.
    `calibration`: the factors `pred` was made with (its step time and these must agree)."""
    if pred.tpot_s is None or not math.isfinite(pred.tpot_s) or not math.isfinite(pred.step_time_s):
        return None
    b = max(int(round(pred.running)), 1)
    ctx = traffic.prompt_tokens_mean + traffic.output_tokens_mean / 2.0
    t_d = step_time_s(setup, decode_seqs=b, decode_context_tokens=int(b * ctx), prefill_tokens=0,
                      calibration=calibration)
    chunk = max(min(setup.max_num_batched_tokens - b, traffic.prompt_tokens_mean * (1 - traffic.prefix_hit_ratio)), 1)
    t_m = step_time_s(setup, decode_seqs=b, decode_context_tokens=int(b * ctx), prefill_tokens=int(chunk),
                      calibration=calibration)
    dt = max(t_m - t_d, 0.0)
    m = max(traffic.output_tokens_mean - 1.0, 1.0)
    if dt <= 0:
        return pred.tpot_s
    q = min(max((pred.step_time_s - t_d) / dt, 0.0), 1.0)
    q99 = min(q + Z99 * math.sqrt(q * (1.0 - q) / m), 1.0)
    extra = (q99 - q) * dt / max(pred.spec_tokens_per_step, 1.0)
    return pred.tpot_s + extra


def capacity(setup: Any, traffic: Traffic, calibration: Any = None) -> int:
    """Requests that run at once: min(max_num_seqs, what the KV pool holds of this traffic)."""
    return max(min(setup.max_num_seqs, int(kv_slots(traffic, kv_pool_tokens(setup, calibration), setup.block_size))), 0)


def evaluate(setup: Any, traffic: Traffic, slo: SLO, *, concurrency: int | None = None,
             rate: float | None = None, spec: Any = None, calibration: Any = None) -> dict[str, Any]:
    """One row: the setup at the given load, or at its own capacity when none is given.
    `calibration`: fitted factors (`calc --calibrate`) instead of the GPU class's."""
    kv_tok = kv_pool_tokens(setup, calibration)
    cap = capacity(setup, traffic, calibration)
    row: dict[str, Any] = {"kv_tokens": int(kv_tok), "max_concurrency": round(kv_slots(traffic, kv_tok, setup.block_size), 1)}
    if cap < 1:
        row.update(concurrency=0, throughput_tokens_per_s=0.0, requests_per_s=0.0, ttft_p50_s=None,
                   ttft_p99_s=None, tpot_p50_s=None, tpot_p99_s=None, dollars_per_million_tokens=None,
                   meets_slo=False, binding="one request does not fit the KV cache")
        return row
    if concurrency is None and rate is None:
        load: dict[str, Any] = {"concurrency": cap}
    else:
        load = {"concurrency": concurrency} if concurrency is not None else {"rate": rate}
    p = predict(setup, traffic, spec=spec, calibration=calibration, **load)
    d = p.as_dict()
    tp99 = tpot_p99_s(setup, traffic, p, calibration)
    price = setup.gpu.dollars_per_hour * setup.num_gpus
    tps = p.output_tokens_per_s
    row.update(concurrency=load.get("concurrency"), rate=load.get("rate"),
               throughput_tokens_per_s=round(tps, 2), requests_per_s=round(p.requests_per_s, 4),
               ttft_p50_s=d["ttft_s"], ttft_p99_s=d["ttft_p99_s"], tpot_p50_s=d["tpot_s"],
               tpot_p99_s=None if tp99 is None else round(tp99, 6),
               dollars_per_million_tokens=round(price / (tps * 3600.0) * 1e6, 4) if tps > 0 else None)
    binding = "KV capacity" if kv_slots(traffic, kv_tok, setup.block_size) < setup.max_num_seqs else "max_num_seqs"
    if load.get("concurrency") is not None and load["concurrency"] < cap:
        binding = "offered load"
    missed = []
    if slo.ttft_p99_s is not None and (d["ttft_p99_s"] is None or d["ttft_p99_s"] > slo.ttft_p99_s):
        missed.append("TTFT SLO")
    if slo.tpot_p99_s is not None and (tp99 is None or tp99 > slo.tpot_p99_s):
        missed.append("TPOT SLO")
    if p.saturated and rate is not None:
        missed.append("queue grows (load above capacity)")
    row["meets_slo"] = None if (slo.ttft_p99_s is None and slo.tpot_p99_s is None) else not missed
    row["binding"] = binding + ("; misses " + ", ".join(missed) if missed else "")
    return row


def default_values(param: str, base: Any, traffic: Traffic, recommended: Any) -> list[Any]:
    """The values a sweep tries: a readable ladder around the recommended value."""
    m = base.model
    if param == "max_num_seqs":
        vals = [8, 16, 32, 64, 128, 256, 512, 1024]
    elif param == "gpu_memory_utilization":
        vals = [0.8, 0.85, 0.9, 0.92, 0.95]
    elif param == "max_model_len":
        vals = [v for v in (2048, 4096, 8192, 16384, 32768, 65536, 131072) if v <= m.max_position_embeddings]
        vals.append(m.max_position_embeddings)
    elif param == "max_num_batched_tokens":
        vals = [512, 1024, 2048, 4096, 8192, 16384]
    elif param == "tp":
        vals = [t for t in (1, 2, 4, 8) if tp_refusal(m, t) is None]
    elif param == "kv_cache_dtype":
        vals = ["auto", "fp8"]
    elif param == "quantization":
        vals = [None, "fp8", "w8a8", "w4a16"]
    else:
        raise InputError(f"--sweep: unknown parameter {param!r}; one of {', '.join(PARAMS)}")
    if recommended is not None and recommended not in vals:
        vals.append(recommended)
    key = (lambda v: (v is not None, str(v))) if param in ("kv_cache_dtype", "quantization") else None
    return sorted(dict.fromkeys(vals), key=key) if key is None else list(dict.fromkeys(vals))


def _variant(base: Any, param: str, value: Any) -> Any:
    if param in ("tp", "kv_cache_dtype", "quantization"):
        # the value changes what vLLM derives: built again, every other flag of the base kept
        model = base.model if param != "quantization" else base.model.with_quantization(None)
        return base.rebuilt(model, **{param: value})
    changes = {param: value}
    if param == "max_num_seqs" and base.max_num_batched_tokens < value:
        changes["max_num_batched_tokens"] = value   # vLLM requires mnbt >= max_num_seqs
    return base.with_(**changes)


def sweep(base: Any, traffic: Traffic, slo: SLO, param: str, *, values: Sequence[Any] | None = None,
          recommended: Any = None, objective: str = "cost", concurrency: int | None = None,
          rate: float | None = None, spec: Any = None, calibration: Any = None) -> dict[str, Any]:
    """{"param", "objective", "basis", "rows": [...]} with one row per value; `recommended` marks a row.

    `calibration` (fitted on this model, GPU and TP: `calc --calibrate`) is used for the engine
    flags that leave the hardware and weights as they were; a sweep of tp, kv_cache_dtype or
    quantization changes what the factors were fitted on, so it stays a priori (`basis`).

    `recommended` is the optimiser's value for the four engine flags it sets; for tp,
    kv_cache_dtype and quantization the row best for `objective` among those meeting the SLOs
    (cost: lowest $/Mtok, latency: lowest TPOT p99, throughput: most tokens/s)."""
    if param not in PARAMS:
        raise InputError(f"--sweep: unknown parameter {param!r}; one of {', '.join(PARAMS)}")
    vals = list(values) if values is not None else default_values(param, base, traffic, recommended)
    need = traffic.prompt_p99 + traffic.output_p99
    cal = calibration if param in CALIBRATED_PARAMS else None
    rows = []
    for v in vals:
        row: dict[str, Any] = {"value": v}
        try:
            s = _variant(base, param, v)    # a TP vLLM refuses raises with vLLM's reason
            row.update(evaluate(s, traffic, slo, concurrency=concurrency, rate=rate, spec=spec,
                                calibration=cal))
        except InputError as exc:
            row.update(kv_tokens=0, max_concurrency=0, concurrency=0, throughput_tokens_per_s=0.0,
                       requests_per_s=0.0, ttft_p50_s=None, ttft_p99_s=None, tpot_p50_s=None,
                       tpot_p99_s=None, dollars_per_million_tokens=None, meets_slo=False,
                       binding=f"invalid: {exc}")
        if param == "max_model_len" and isinstance(v, int) and v < need:
            row["binding"] = f"truncates p99 requests ({need:.0f} tokens); " + row["binding"]
            row["meets_slo"] = False if row["meets_slo"] is not None else None
            row["truncates"] = True
        rows.append(row)
    pick = recommended if param in ("max_num_seqs", "gpu_memory_utilization", "max_model_len",
                                    "max_num_batched_tokens") else _best(rows, objective)
    for row in rows:
        row["recommended"] = row["value"] == pick
    return {"param": param, "objective": objective, "recommended": pick,
            "basis": "calibrated" if cal is not None else "prior", "rows": rows}


def _best(rows: list[dict[str, Any]], objective: str) -> Any:
    ok = [r for r in rows if r.get("meets_slo") is not False and r.get("throughput_tokens_per_s")]
    if not ok:
        return None
    if objective == "latency":
        best = min(ok, key=lambda r: (r["tpot_p99_s"] if r["tpot_p99_s"] is not None else math.inf))
    elif objective == "throughput":
        best = max(ok, key=lambda r: r["throughput_tokens_per_s"])
    else:
        best = min(ok, key=lambda r: r["dollars_per_million_tokens"] or math.inf)
    return best["value"]


def concurrency_curve(setup: Any, traffic: Traffic, slo: SLO, *, mark: int | None = None,
                      spec: Any = None, calibration: Any = None) -> list[dict[str, Any]]:
    """Throughput and latency vs closed-loop concurrency, 1 .. capacity (+ the marked point)."""
    cap = max(capacity(setup, traffic, calibration), 1)
    points = {1}
    c = 2
    while c < cap:
        points.add(c)
        c *= 2
    points.add(cap)
    if mark:
        points.add(int(mark))
    out = []
    for c in sorted(points):
        row = evaluate(setup, traffic, slo, concurrency=c, spec=spec, calibration=calibration)
        row["concurrency"] = c
        row["recommended"] = c == mark
        out.append(row)
    return out


__all__ = ["PARAMS", "capacity", "concurrency_curve", "default_values", "evaluate", "sweep",
           "tpot_p99_s", "KV_MARGIN", "capture_size_floor"]
