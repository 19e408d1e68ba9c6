"""The calculator's view of one target: resolve the hints into a `Setup` and ask the model for
KV capacity, TPOT at the observed load, the speculative-decoding speed-up and the cheapest GPU
tier meeting the same SLOs.

Why separate from the rules: this is the only place the drift engine calls `exporter.model`, and
the only place that can fail on an unknown model or GPU; it turns those failures into
`missing_hints` and notes (the rules then say which hint to give) instead of exceptions.
Everything here is pure (no I/O except the packaged catalogs), so it is cached per setup.
"""
from __future__ import annotations

import math
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
    pending: bool = False      # the model's config is still being looked up: ask again later


def resolve_hints(model_candidates: list[str | None], gpu_hint: str | None, *,
                  served_name: str | None = None, root: str | None = None, hub: Any = None) -> Resolved:
    """The model through exporter/model/resolve.py (hints, then the /v1/models root and served
    name, the HF cache, the Hub, the catalog), and the GPU hint. A Hub lookup runs in the
    background: until it answers the model is missing with a note saying so."""
    from exporter.model import resolve_gpu
    from exporter.model.resolve import HubSettings, resolve_model_nowait

    notes: list[str] = []
    missing: list[str] = []
    arch = model_id = None
    hints = [c for c in dict.fromkeys(model_candidates) if c and c not in (served_name, root)]
    tried = [*hints, *(n for n in (root, served_name) if n)]
    pending = False
    try:
        # without settings from the config (scan, tests): no network, the local sources only
        found = resolve_model_nowait(hints, served_name, root, settings=hub or HubSettings(offline=True))
    except InputError as exc:
        found = None
        missing.append("model")
        notes.append(f"model unknown ({', '.join(tried) or 'no name'}): {exc}; mount the model volume or "
                     f"HF cache into the sidecar, allow Hub access, or set targets[].model / a `model` "
                     f"label in file_sd (scan: --model) to a catalog id or a local config.json")
    else:
        if found is None:
            pending = True
            missing.append("model")
            notes.append(f"model config of {', '.join(tried)} is being looked up on the Hub (or set "
                         f"targets[].model / a `model` label to a catalog id or a local config.json)")
        else:
            arch, model_id = found.arch, found.name
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
    if found is not None:  # after the missing-hint notes, which come first
        notes.append(f"model config: {found.describe()}")
    return Resolved(arch, gpu, model_id, tuple(missing), tuple(notes), pending=pending)


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
                                fp8_kv_supported=fp8, current_cost_per_hour=cost,
                                default_max_num_seqs=None if max_num_seqs else setup.max_num_seqs)
    pred.update(_performance(setup, traffic, slo, prices, notes))
    return Prediction(**pred, notes=tuple(notes))


# Without configured SLOs the tier comparison uses these interactive-chat defaults (documented in
# docs/scores.md; `slo:` in the config or per target overrides them).
DEFAULT_SLO = {"ttft": 2.0, "tpot": 0.150}


def _performance(setup, traffic: Mapping[str, float | None], slo: Mapping[str, float | None],
                 prices: Mapping[str, float], notes: list[str]) -> dict[str, Any]:
    """TPOT at the observed load, the replica's sustainable rate at the SLOs, the spec-decode
    speed-up and the tier ranking, from `exporter.model.perf` and `exporter.model.optimizer`."""
    out: dict[str, Any] = {}
    from exporter.model.traffic import SLO, Traffic

    prompt, output = traffic.get("prompt_mean"), traffic.get("output_mean")
    if not prompt or not output or prompt < 1 or output < 1:
        return out
    try:
        tr = Traffic(prompt_tokens_mean=float(prompt), output_tokens_mean=float(output),
                     prompt_tokens_p99=traffic.get("prompt_p99"), output_tokens_p99=traffic.get("output_p99"),
                     arrival_rate_rps=traffic.get("arrival_rps") or None,
                     prefix_hit_ratio=min(0.99, max(0.0, traffic.get("prefix_hit_ratio") or 0.0)))
        s = SLO(ttft_p99_s=slo.get("ttft") or DEFAULT_SLO["ttft"], tpot_p99_s=slo.get("tpot") or DEFAULT_SLO["tpot"])
    except InputError as exc:
        notes.append(f"calculator traffic: {exc}")
        return out
    try:
        per_pos = traffic.get("spec_per_position")
        out.update(_latency(setup, tr, s, traffic.get("running_mean"), traffic.get("spec_k"),
                            tuple(per_pos) if per_pos else None, traffic.get("spec_draft_cost"),
                            want_table=slo.get("tpot") is not None))
    except (InputError, ArithmeticError, ValueError) as exc:
        notes.append(f"calculator latency: {exc}")
    if tr.arrival_rate_rps:
        try:
            tiers = _rank(setup.model, _coarse(tr), s, tuple(sorted(prices.items())), setup.quantization,
                          setup.kv_cache_dtype, setup.vllm_version, setup.gpu.name)
            out["tiers"] = tuple(_tier(t) for t in tiers if t.meets_slo is not False)  # None: no SLO given, every tier serves
        except (InputError, ArithmeticError, ValueError) as exc:
            notes.append(f"calculator tiers: {exc}")
    return out


def _coarse(tr: Any) -> Any:
    """The traffic on a 25% grid for the tier ranking (the costly call): tiers are priced in whole
    GPUs and replicas, so finer changes rarely move the answer, and steady traffic hits the cache."""
    from dataclasses import replace as _replace

    def snap(v: float | None) -> float | None:
        if v is None or v <= 0:
            return v
        return float(f"{1.25 ** math.ceil(math.log(v) / math.log(1.25) - 1e-9):.4g}")
    return _replace(tr, prompt_tokens_mean=max(1.0, snap(tr.prompt_tokens_mean)),
                    output_tokens_mean=max(1.0, snap(tr.output_tokens_mean)),
                    prompt_tokens_p99=snap(tr.prompt_tokens_p99), output_tokens_p99=snap(tr.output_tokens_p99),
                    arrival_rate_rps=snap(tr.arrival_rate_rps),
                    prefix_hit_ratio=min(0.9, round(tr.prefix_hit_ratio, 1)))


# GeForce cards: their licence excludes datacenter deployment, so a datacenter server is never
# told to move to one (a server already on one may be told to move between them).
CONSUMER_GPUS = ("RTX-3090-24GB", "RTX-4090-24GB")


def _latency(setup: Any, tr: Any, s: Any, running: float | None, k: float | None,
             per_pos: tuple[float, ...] | None, draft_cost: float | None, want_table: bool) -> dict[str, Any]:
    """The latency side, in cached pieces: the costly ones (SLO-feasible capacity, TPOT per
    batch) on the coarse traffic grid, TPOT at the running batch on the fine one."""
    out: dict[str, Any] = {}
    coarse = _coarse(tr)
    if running and running >= 1:
        out["tpot_s"] = _tpot(setup, coarse, max(1, int(round(running))))
    if want_table:
        out["tpot_at"] = dict(_tpot_table(setup, coarse))
    rate, b_cap = _capacity(setup, coarse, s)
    out["current_max_rps"] = rate
    out["capacity_batch"] = b_cap
    if not k and running:
        out["spec_missed_speedup"] = _missed_gain(setup, coarse, max(1, int(round(running))))
    if k and k >= 1:
        from exporter.model.spec_decode import SpecConfig, gain
        spec = SpecConfig(num_tokens=int(round(k)), alpha=0.0, per_position=per_pos, draft_cost=draft_cost)
        ctx = tr.prompt_tokens_mean + tr.output_tokens_mean / 2.0
        out["spec_speedup"] = float(gain(setup, spec, int(max(1, round(running or 1))), ctx).speedup)
        if b_cap:
            out["spec_speedup_at_capacity"] = float(gain(setup, spec, int(b_cap), ctx).speedup)
    return out


# What speculation would plausibly give a server that runs without it: EAGLE-style drafting of 3
# tokens at a per-token acceptance of 0.6, a middling figure for chat traffic [assumed; the
# real acceptance of this traffic is only known once it runs, hence the finding stays `info`
# unless a TPOT SLO is being missed].
ASSUMED_SPEC = {"num_tokens": 3, "alpha": 0.6, "method": "eagle"}


@lru_cache(maxsize=1024)
def _missed_gain(setup: Any, tr: Any, batch: int) -> float:
    from exporter.model.spec_decode import SpecConfig, gain
    ctx = tr.prompt_tokens_mean + tr.output_tokens_mean / 2.0
    return float(gain(setup, SpecConfig(**ASSUMED_SPEC), batch, ctx).speedup)


@lru_cache(maxsize=1024)
def _tpot(setup: Any, tr: Any, batch: int) -> float:
    from exporter.model import perf
    return float(perf.predict(setup, tr, concurrency=batch).tpot_s)


@lru_cache(maxsize=256)
def _tpot_table(setup: Any, tr: Any) -> tuple[tuple[int, float], ...]:
    from exporter.model import perf
    return tuple((b, float(perf.predict(setup, tr, concurrency=b).tpot_s))
                 for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512) if b <= setup.max_num_seqs)


@lru_cache(maxsize=256)
def _capacity(setup: Any, tr: Any, s: Any) -> tuple[float | None, int | None]:
    from exporter.model import optimizer
    rate, b_cap, _, _ = optimizer.replica_capacity(setup, tr, s)
    return (float(rate) if rate > 0 else None), (int(b_cap) if b_cap else None)


@lru_cache(maxsize=256)
def _rank(model: Any, tr: Any, slo: Any, prices: tuple, quantization: str | None, kv_dtype: str,
          version: tuple, current_gpu: str) -> tuple:
    from exporter.model import optimizer
    from exporter.model.gpus import tier_names
    gpus = [g for g in tier_names() if current_gpu in CONSUMER_GPUS or g not in CONSUMER_GPUS]
    return tuple(optimizer.rank_tiers(model, tr, slo, gpus=gpus, prices=dict(prices), quantization=quantization,
                                      kv_cache_dtype=kv_dtype, vllm_version=version))


def _tier(t: Any) -> TierOption:
    """`exporter.model.optimizer.Tier` -> the drift engine's own small value."""
    return TierOption(gpu=t.gpu, tp=int(t.tp), replicas=int(t.replicas),
                      dollars_per_hour=float(t.dollars_per_hour), meets_slo=t.meets_slo is not False)
