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
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

from exporter.drift.inputs import DriftInput, Prediction
from exporter.config import TargetSpec
from exporter.errors import InputError
from exporter.model import optimizer, perf, resolve_gpu, resolve_model
from exporter.model.optimizer import Tier
from exporter.model.architectures import ModelArch
from exporter.model.gpus import GPU, tier_names
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup
from exporter.model.spec_decode import SpecConfig, gain
from exporter.model.traffic import SLO, Traffic
from exporter.parse.version import Version, read_version

GIB = 1024**3


@dataclass(frozen=True)
class Resolved:
    model: ModelArch | None
    gpu: GPU | None
    model_id: str | None
    missing: tuple[str, ...]
    notes: tuple[str, ...]


def resolve_hints(model_candidates: list[str], gpu_hint: str | None) -> Resolved:
    """First model name that the catalog (or a local config.json) knows, and the GPU hint."""

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


@dataclass(frozen=True)
class Identity:
    """Who a (target, served model) is: every hint (config, file_sd labels, scan flags,
    `/v1/models` root) resolved once. The catalog model and GPU are None when unknown, with the
    missing hint named in `resolved`."""

    target: str
    model_name: str
    resolved: Resolved
    tp: int = 1
    pp: int = 1
    quantization: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @property
    def gpu(self) -> str | None:
        return self.resolved.gpu.name if self.resolved.gpu is not None else None


def identify(spec: TargetSpec, model_name: str, root: str | None = None) -> Identity:
    """The target spec's hints (its fields, else its labels) resolved for one served model."""
    labels = spec.labels or {}

    def hint(name: str) -> Any:
        return getattr(spec, name, None) or labels.get(name)

    def hint_int(name: str) -> int | None:
        v = hint(name)
        try:
            return int(v) if v else None
        except (TypeError, ValueError):
            return None
    candidates = [spec.model, labels.get("model"), model_name, root]
    return Identity(spec.url, model_name, resolve_hints([c for c in candidates if c], hint("gpu")),
                    tp=hint_int("tp") or 1, pp=hint_int("pp") or 1, quantization=hint("quantization"),
                    max_num_seqs=hint_int("max_num_seqs"), max_num_batched_tokens=hint_int("max_num_batched_tokens"))


def predict_for(ident: Identity, x: DriftInput, *, vllm_version: str | None,
                spec_per_position: tuple[float, ...] | None, prices: Mapping[str, float],
                calibration: perf.Calibration | None = None) -> Prediction:
    """The prediction seam: given who the target is and what was observed, what the model says
    (KV capacity, TPOT at the observed load, spec-decode gains, tiers), with its `basis`."""
    traffic = {"prompt_mean": x.prompt_mean, "output_mean": x.output_mean, "prompt_p99": x.prompt_p99,
               "output_p99": x.output_p99, "arrival_rps": x.arrival_rps,
               "prefix_hit_ratio": x.prefix_hit_ratio, "running_mean": x.running_mean,
               "spec_k": x.spec_k}
    return predict(ident.resolved, tp=ident.tp, pp=ident.pp, quantization=ident.quantization,
                   cache_dtype=x.cache_dtype, gpu_memory_utilization=x.gpu_memory_utilization,
                   max_model_len=x.max_model_len, max_num_seqs=x.max_num_seqs,
                   max_num_batched_tokens=x.max_num_batched_tokens, block_size=x.block_size,
                   vllm_version=vllm_version, slo={"ttft": x.slo_ttft_s, "tpot": x.slo_tpot_s}, prices=prices,
                   traffic={**_rounded(traffic), "spec_per_position": spec_per_position},
                   calibration=calibration)


def setup_for(ident: Identity, x: DriftInput, vllm_version: str | None) -> Setup | None:
    """The calculator's setup of this target (None when the model or GPU is unknown, or the
    calculator refuses it): what `predict_for` predicts from, for calibration."""
    res = ident.resolved
    if res.model is None or res.gpu is None:
        return None
    try:
        return _setup(res.model, res.gpu, int(ident.tp), int(ident.pp), ident.quantization,
                      _kv_dtype(x.cache_dtype), x.gpu_memory_utilization,
                      int(x.max_model_len) if x.max_model_len else None, x.max_num_seqs,
                      x.max_num_batched_tokens, int(x.block_size) if x.block_size else None,
                      read_version(vllm_version))
    except InputError:
        return None


def _rounded(traffic: dict[str, float | None]) -> dict[str, float | None]:
    """Snap the traffic to a geometric grid of 10% steps, so the calculator's caches (tier
    ranking is the costly part) hit across windows of steady traffic."""
    out = {}
    for k, v in traffic.items():
        if v is None or v <= 0:
            out[k] = v
        else:
            out[k] = float(f"{1.1 ** round(math.log(v) / math.log(1.1)):.4g}")
    return out


@lru_cache(maxsize=512)
def _setup(model: ModelArch, gpu: GPU, tp: int, pp: int, quantization: str | None, kv_dtype: str,
           util: float | None, max_model_len: int | None, max_num_seqs: int | None,
           mnbt: int | None, block_size: int | None, version: tuple | None):
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
            slo: Mapping[str, float | None], prices: Mapping[str, float],
            calibration: perf.Calibration | None = None) -> Prediction:
    """Everything the model can say about this setup at the observed traffic; fields it cannot
    compute stay None, with a note."""
    notes = list(res.notes)
    if res.model is None or res.gpu is None:
        return Prediction(notes=tuple(notes))

    try:
        setup = _setup(res.model, res.gpu, int(tp), int(pp), quantization, _kv_dtype(cache_dtype),
                       gpu_memory_utilization, int(max_model_len) if max_model_len else None,
                       max_num_seqs, max_num_batched_tokens, int(block_size) if block_size else None,
                       read_version(vllm_version))
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
    pred.update(_performance(setup, traffic, slo, prices, notes, calibration))
    return Prediction(**pred, notes=tuple(notes))


# Without configured SLOs the tier comparison uses these interactive-chat defaults (documented in
# docs/scores.md; `slo:` in the config or per target overrides them).
DEFAULT_SLO = {"ttft": 2.0, "tpot": 0.150}


def _performance(setup: Setup, traffic: Mapping[str, float | None], slo: Mapping[str, float | None],
                 prices: Mapping[str, float], notes: list[str],
                 calibration: perf.Calibration | None = None) -> dict[str, Any]:
    """TPOT at the observed load, the replica's sustainable rate at the SLOs, the spec-decode
    speed-up and the tier ranking, from `exporter.model.perf` and `exporter.model.optimizer`."""
    out: dict[str, Any] = {}

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
                            want_table=slo.get("tpot") is not None, calibration=calibration))
    except (InputError, ArithmeticError, ValueError) as exc:
        notes.append(f"calculator latency: {exc}")
    if tr.arrival_rate_rps:
        try:
            tiers = _rank(setup.model, _coarse(tr), s, tuple(sorted(prices.items())), setup.quantization,
                          setup.kv_cache_dtype, setup.vllm_version, setup.gpu.name)
            # meets_slo None: no SLO given, every tier serves
            out["tiers"] = tuple(t for t in tiers if t.meets_slo is not False)
        except (InputError, ArithmeticError, ValueError) as exc:
            notes.append(f"calculator tiers: {exc}")
    return out


def _coarse(tr: Traffic) -> Traffic:
    """The traffic on a 25% grid for the tier ranking (the costly call): tiers are priced in whole
    GPUs and replicas, so finer changes rarely move the answer, and steady traffic hits the cache."""

    def snap(v: float | None) -> float | None:
        if v is None or v <= 0:
            return v
        return float(f"{1.25 ** math.ceil(math.log(v) / math.log(1.25) - 1e-9):.4g}")
    return replace(tr, prompt_tokens_mean=max(1.0, snap(tr.prompt_tokens_mean)),
                    output_tokens_mean=max(1.0, snap(tr.output_tokens_mean)),
                    prompt_tokens_p99=snap(tr.prompt_tokens_p99), output_tokens_p99=snap(tr.output_tokens_p99),
                    arrival_rate_rps=snap(tr.arrival_rate_rps),
                    prefix_hit_ratio=min(0.9, round(tr.prefix_hit_ratio, 1)))


# GeForce cards: their licence excludes datacenter deployment, so a datacenter server is never
# told to move to one (a server already on one may be told to move between them).
CONSUMER_GPUS = ("RTX-3090-24GB", "RTX-4090-24GB")


def _latency(setup: Setup, tr: Traffic, s: SLO, running: float | None, k: float | None,
             per_pos: tuple[float, ...] | None, draft_cost: float | None, want_table: bool,
             calibration: perf.Calibration | None = None) -> dict[str, Any]:
    """The latency side, in cached pieces: the costly ones (SLO-feasible capacity, TPOT per
    batch) on the coarse traffic grid, TPOT at the running batch on the fine one. `calibration`:
    this server's fitted step-time factors (on a coarse grid too, so steady pools hit the cache)."""
    out: dict[str, Any] = {}
    coarse = _coarse(tr)
    if running and running >= 1:
        out["tpot_s"] = _tpot(setup, coarse, max(1, int(round(running))), calibration)
    if want_table:
        out["tpot_at"] = dict(_tpot_table(setup, coarse, calibration))
    rate, b_cap = _capacity(setup, coarse, s, calibration)
    out["current_max_rps"] = rate
    out["capacity_batch"] = b_cap
    if not k and running:
        out["spec_missed_speedup"] = _missed_gain(setup, coarse, max(1, int(round(running))))
    if k and k >= 1:
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
def _missed_gain(setup: Setup, tr: Traffic, batch: int) -> float:
    ctx = tr.prompt_tokens_mean + tr.output_tokens_mean / 2.0
    return float(gain(setup, SpecConfig(**ASSUMED_SPEC), batch, ctx).speedup)


@lru_cache(maxsize=1024)
def _tpot(setup: Setup, tr: Traffic, batch: int, cal: perf.Calibration | None = None) -> float:
    return float(perf.predict(setup, tr, concurrency=batch, calibration=cal).tpot_s)


@lru_cache(maxsize=256)
def _tpot_table(setup: Setup, tr: Traffic, cal: perf.Calibration | None = None) -> tuple[tuple[int, float], ...]:
    return tuple((b, float(perf.predict(setup, tr, concurrency=b, calibration=cal).tpot_s))
                 for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512) if b <= setup.max_num_seqs)


@lru_cache(maxsize=256)
def _capacity(setup: Setup, tr: Traffic, s: SLO, cal: perf.Calibration | None = None) -> tuple[float | None, int | None]:
    rate, b_cap, _, _ = optimizer.replica_capacity(setup, tr, s, calibration=cal)
    return (float(rate) if rate > 0 else None), (int(b_cap) if b_cap else None)


@lru_cache(maxsize=256)
def _rank(model: ModelArch, tr: Traffic, slo: SLO, prices: tuple[tuple[str, float], ...],
          quantization: str | None, kv_dtype: str, version: Version, current_gpu: str) -> tuple[Tier, ...]:
    gpus = [g for g in tier_names() if current_gpu in CONSUMER_GPUS or g not in CONSUMER_GPUS]
    return tuple(optimizer.rank_tiers(model, tr, slo, gpus=gpus, prices=dict(prices), quantization=quantization,
                                      kv_cache_dtype=kv_dtype, vllm_version=version))
