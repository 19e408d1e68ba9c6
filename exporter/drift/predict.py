"""The calculator's view of one target: resolve the hints into a `Setup` and ask the model for
KV capacity, TPOT at the observed load, the speculative-decoding speed-up and the cheapest GPU
tier meeting the same SLOs.

Why separate from the rules: this is the only place the drift engine calls `exporter.model`, and
the only place that can fail on an unknown model or GPU; it turns those failures into
`missing_hints` and notes (the rules then say which hint to give) instead of exceptions.
Everything here is pure (no I/O except the packaged catalogs), so it is cached per setup.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from exporter.drift.inputs import Prediction, TierOption
from exporter.errors import InputError

GIB = 1024**3


@dataclass(frozen=True)
class Resolved:
    model: Any | None          # ModelArch
    gpu: Any | None            # GPU
    model_id: str | None
    missing: tuple[str, ...]
    notes: tuple[str, ...]


def resolve_hints(model_candidates: list[str], gpu_hint: str | None) -> Resolved:
    """First model name that the catalog (or a local config.json) knows, and the GPU hint."""
    from exporter.model import resolve_gpu, resolve_model

    notes: list[str] = []
    missing: list[str] = []
    arch = model_id = None
    tried = [c for c in dict.fromkeys(model_candidates) if c]
    for cand in tried:
        try:
            arch = resolve_model(cand)
            model_id = cand
            break
        except InputError:
            continue
    if arch is None:
        missing.append("model")
        notes.append(f"model unknown to the catalog ({', '.join(tried) or 'no name'}): set "
                     f"targets[].model in the config or a `model` label in file_sd (scan: --model) to a "
                     f"catalog id or a local config.json")
    gpu = None
    if gpu_hint:
        try:
            gpu = resolve_gpu(gpu_hint)
        except InputError as exc:
            missing.append("gpu")
            notes.append(f"gpu hint {gpu_hint!r} unknown: {exc}")
    else:
        missing.append("gpu")
        notes.append("GPU unknown (vLLM does not export it): set targets[].gpu in the config or a "
                     "`gpu` label in file_sd (scan: --gpu) for capacity, latency and tier predictions")
    return Resolved(arch, gpu, model_id, tuple(missing), tuple(notes))


def _version(text: str | None):
    from exporter.model.setup import parse_version
    try:
        return parse_version(text)
    except InputError:
        return None


@lru_cache(maxsize=512)
def _setup(model: Any, gpu: Any, tp: int, pp: int, quantization: str | None, kv_dtype: str,
           util: float | None, max_model_len: int | None, max_num_seqs: int | None,
           mnbt: int | None, block_size: int | None, version: tuple | None):
    from exporter.model.setup import Setup
    return Setup.build(model, gpu, tp=tp, pp=pp, quantization=quantization, kv_cache_dtype=kv_dtype,
                       gpu_memory_utilization=util, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
                       block_size=block_size, vllm_version=version)


def _kv_dtype(cache_dtype: str | None) -> str:
    d = (cache_dtype or "auto").lower()
    return "fp8" if d.startswith("fp8") else ("auto" if d in ("auto", "none", "") else d)


def predict(res: Resolved, *, tp: int, pp: int, quantization: str | None, cache_dtype: str | None,
            gpu_memory_utilization: float | None, max_model_len: float | None,
            max_num_seqs: int | None, max_num_batched_tokens: int | None, block_size: float | None,
            vllm_version: str | None, traffic: Mapping[str, float | None],
            slo: Mapping[str, float | None], prices: Mapping[str, float]) -> Prediction:
    """Everything the model can say about this setup at the observed traffic; fields it cannot
    compute stay None, with a note."""
    notes = list(res.notes)
    if res.model is None or res.gpu is None:
        return Prediction(notes=tuple(notes))
    from exporter.model.kv_cache import kv_capacity

    try:
        setup = _setup(res.model, res.gpu, int(tp), int(pp), quantization, _kv_dtype(cache_dtype),
                       gpu_memory_utilization, int(max_model_len) if max_model_len else None,
                       max_num_seqs, max_num_batched_tokens, int(block_size) if block_size else None,
                       _version(vllm_version))
        cap = kv_capacity(setup, check_fits=False)
    except InputError as exc:
        notes.append(f"calculator: {exc}")
        return Prediction(notes=tuple(notes))
    price = prices.get(res.gpu.name, res.gpu.dollars_per_hour)
    cost = price * setup.num_gpus
    fp8 = res.gpu.fp8_tflops > 0 or res.gpu.vendor == "amd"
    pred: dict[str, Any] = dict(kv_cache_tokens=float(cap.tokens), kv_bytes_per_token=float(cap.bytes_per_token),
                                kv_cache_gib=cap.memory.kv_cache_gib, gpu_memory_gib=setup.gpu_memory_gib,
                                fp8_kv_supported=fp8, current_cost_per_hour=cost)
    pred.update(_performance(setup, traffic, slo, prices, notes))
    return Prediction(**pred, notes=tuple(notes))


def _performance(setup, traffic: Mapping[str, float | None], slo: Mapping[str, float | None],
                 prices: Mapping[str, float], notes: list[str]) -> dict[str, Any]:
    """TPOT at the observed load and per batch, sustainable rate and tier ranking, from the
    performance model and optimiser when they are available in this build."""
    out: dict[str, Any] = {}
    try:
        from exporter.model import perf
        from exporter.model.traffic import SLO, Traffic
    except ImportError:
        return out
    prompt, output = traffic.get("prompt_mean"), traffic.get("output_mean")
    if not prompt or not output or prompt < 1 or output < 1:
        return out
    try:
        tr = Traffic(prompt_tokens_mean=float(prompt), output_tokens_mean=float(output),
                     prompt_tokens_p99=traffic.get("prompt_p99"), output_tokens_p99=traffic.get("output_p99"),
                     arrival_rate_rps=traffic.get("arrival_rps") or None,
                     prefix_hit_ratio=min(0.99, max(0.0, traffic.get("prefix_hit_ratio") or 0.0)))
        s = SLO(ttft_p99_s=slo.get("ttft"), tpot_p99_s=slo.get("tpot"))
    except InputError as exc:
        notes.append(f"calculator traffic: {exc}")
        return out
    predict_fn = getattr(perf, "predict", None)
    if predict_fn is not None:
        try:
            running = traffic.get("running_mean")
            if running and running >= 1:
                p = predict_fn(setup, tr, concurrency=max(1, int(round(running))))
                out["tpot_s"] = float(getattr(p, "tpot_s"))
            for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512):
                p = predict_fn(setup, tr, concurrency=b)
                out.setdefault("tpot_at", {})[b] = float(getattr(p, "tpot_s"))
        except (InputError, AttributeError, TypeError, ValueError, ZeroDivisionError) as exc:
            notes.append(f"calculator latency: {exc}")
    try:
        from exporter.model import optimizer  # type: ignore[attr-defined]
    except ImportError:
        optimizer = None
    if optimizer is not None and hasattr(optimizer, "rank_tiers") and tr.arrival_rate_rps:
        try:
            tiers = optimizer.rank_tiers(setup, tr, s, prices=dict(prices))
            out["tiers"] = tuple(_tier(t) for t in tiers if _tier(t).meets_slo)
            cur = [t for t in tiers if _tier(t).gpu == setup.gpu.name and _tier(t).tp == setup.tp]
            if cur:
                c = _tier(cur[0])
                out["current_meets_slo"] = c.meets_slo and c.replicas <= 1
        except (InputError, TypeError, ValueError, AttributeError) as exc:
            notes.append(f"calculator tiers: {exc}")
    return out


def _tier(t: Any) -> TierOption:
    get = (lambda k: t.get(k)) if isinstance(t, Mapping) else (lambda k: getattr(t, k, None))
    return TierOption(gpu=str(get("gpu")), tp=int(get("tp") or 1), replicas=int(get("replicas") or 1),
                      dollars_per_hour=float(get("dollars_per_hour") or 0.0), meets_slo=bool(get("meets_slo")))
