"""The calculator's view of one target: resolve the hints into a `Setup` and ask the model for
KV capacity, TPOT at the observed load, the speculative-decoding speed-up and the cheapest GPU
tier meeting the same SLOs.

Why separate from the rules: this is the only place the drift engine calls `exporter.model`, and
the only place that can fail on an unknown model or GPU; it turns those failures into
`missing_hints` and notes (the rules then say which hint to give) instead of exceptions.
Everything here is pure (no I/O except the packaged catalogs, and a model's config.json read by
exporter/model/resolve.py: local files at once, the Hub in a worker thread), so it is cached per
setup.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, Mapping

from exporter.drift.inputs import DriftInput, Prediction
from exporter.config import TargetSpec
from exporter.discovery.vllm_args import gib, mm_limits, speculative_label
from exporter.errors import InputError
from exporter.model import optimizer, perf, resolve_gpu
from exporter.model.optimizer import Tier
from exporter.model.architectures import ModelArch
from exporter.model.gpus import GPU, find_gpu, generic_gpu, gpu_names, non_gpu_kind, tier_names
from exporter.model.kv_cache import kv_capacity
from exporter.model.resolve import HubSettings, resolve_model, resolve_model_nowait
from exporter.model.setup import Setup, lora_slots
from exporter.model.spec_decode import ASSUMED_SPEC, SpecConfig, gain
from exporter.model.traffic import SLO, Traffic
from exporter.model.vision import encoder_profile
from exporter.parse.cache_config import label_bool
from exporter.parse.version import Version, read_version

GIB = 1024**3


@dataclass(frozen=True)
class Resolved:
    model: ModelArch | None
    gpu: GPU | None
    model_id: str | None
    missing: tuple[str, ...]
    notes: tuple[str, ...]
    pending: bool = False      # the model's config is still being looked up: ask again later


def resolve_hints(model_candidates: list[str | None], gpu_hint: str | None, *,
                  served_name: str | None = None, root: str | None = None, hub: Any = None,
                  wait: bool = False) -> Resolved:
    """The model through exporter/model/resolve.py (hints, then the /v1/models root and served
    name, the HF cache, the Hub, the catalog), and the GPU hint. A Hub lookup runs in the
    background (unless `wait`, for one-shot callers): until it answers the model is missing with a
    note saying so and `pending` set."""

    notes: list[str] = []
    missing: list[str] = []
    arch = model_id = None
    hints = [c for c in dict.fromkeys(model_candidates) if c and c not in (served_name, root)]
    tried = [*hints, *(n for n in (root, served_name) if n)]
    pending = False
    try:
        # without settings from the config (scan, tests): no network, the local sources only
        lookup = resolve_model if wait else resolve_model_nowait
        found = lookup(hints, served_name, root, settings=hub or HubSettings(offline=True))
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
    if gpu_hint and non_gpu_kind(gpu_hint):
        notes.append(f"device {gpu_hint!r} is a {non_gpu_kind(gpu_hint)} device: observation findings only "
                     f"(no GPU model, tier or cost findings)")
    elif gpu_hint:
        try:
            gpu = resolve_gpu(gpu_hint)
        except InputError as exc:
            missing.append("gpu")
            notes.append(f"gpu hint {gpu_hint!r} unknown: {exc}; KV findings come from the server's own "
                         f"pool, step-time and tier findings need a catalog row (a `gpus:` entry)")
    else:
        missing.append("gpu")
        notes.append("GPU unknown (vLLM does not export it): set targets[].gpu in the config or a "
                     "`gpu` label in file_sd (scan: --gpu) for capacity, latency and tier predictions")
    if found is not None:  # after the missing-hint notes, which come first
        notes.append(f"model config: {found.describe()}")
    return Resolved(arch, gpu, model_id, tuple(missing), tuple(notes), pending=pending)


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
    device_hint: str | None = None      # the GPU/device hint as given (for the backend verdict)
    enforce_eager: bool = False         # the server runs --enforce-eager (no CUDA graphs)
    dp: int | None = None               # --data-parallel-size hint (else the engines the metrics show)
    expert_parallel: bool = False       # --enable-expert-parallel: whole experts per rank
    async_scheduling: bool | None = None  # --[no-]async-scheduling (None: the release's default)
    # multimodal startup profile: --limit-mm-per-prompt, --skip-mm-profiling, the image
    # processor's max_pixels (--mm-processor-kwargs)
    mm_limits: tuple[tuple[str, int], ...] = ()
    skip_mm_profiling: bool = False
    mm_max_pixels: int | None = None
    speculative_config: str | None = None   # --speculative-config, its JSON as a label carries it
    cpu_offload_gb: float = 0.0             # --cpu-offload-gb
    max_loras: int = 0                      # --enable-lora's --max-loras (0: no LoRA)
    max_lora_rank: int | None = None
    fully_sharded_loras: bool = False

    @property
    def gpu(self) -> str | None:
        return self.resolved.gpu.name if self.resolved.gpu is not None else None


def identify(spec: TargetSpec, model_name: str, root: str | None = None, *,
             hub: HubSettings | None = None, wait: bool = False) -> Identity:
    """The target spec's hints (its fields, else its labels) resolved for one served model: the
    model through exporter/model/resolve.py (hints, /v1/models root, served name, HF cache, Hub
    when `hub` allows it, catalog). `identity.resolved.pending` while a Hub lookup runs."""
    labels = spec.labels or {}

    def hint(name: str) -> Any:
        return getattr(spec, name, None) or labels.get(name)

    def hint_int(name: str) -> int | None:
        v = hint(name)
        try:
            return int(v) if v else None
        except (TypeError, ValueError):
            return None
    res = resolve_hints([spec.model, labels.get("model")], hint("gpu"), served_name=model_name, root=root,
                        hub=hub, wait=wait)
    return Identity(spec.url, model_name, res,
                    tp=hint_int("tp") or 1, pp=hint_int("pp") or 1, quantization=hint("quantization"),
                    max_num_seqs=hint_int("max_num_seqs"), max_num_batched_tokens=hint_int("max_num_batched_tokens"),
                    device_hint=hint("gpu") or None,
                    enforce_eager=label_bool(hint("enforce_eager")) is True, dp=hint_int("dp"),
                    expert_parallel=label_bool(hint("expert_parallel")) is True,
                    # False is a statement here (--no-async-scheduling), not an absent hint
                    async_scheduling=label_bool(spec.async_scheduling if spec.async_scheduling is not None
                                               else labels.get("async_scheduling")),
                    mm_limits=_mm_limits(hint("limit_mm_per_prompt")),
                    skip_mm_profiling=label_bool(hint("skip_mm_profiling")) is True,
                    mm_max_pixels=hint_int("mm_max_pixels"),
                    speculative_config=_speculative_hint(hint("speculative_config")),
                    cpu_offload_gb=_gib_hint(hint("cpu_offload_gb")),
                    max_loras=lora_slots(label_bool(hint("enable_lora")) is True, hint_int("max_loras")),
                    max_lora_rank=hint_int("max_lora_rank"),
                    fully_sharded_loras=label_bool(hint("fully_sharded_loras")) is True)


def _gib_hint(value: Any) -> float:
    """A `cpu_offload_gb` hint in GiB (`vllm_args.gib`); 0 when absent, unreadable or negative
    (vLLM's default)."""
    try:
        return gib(str(value)) if value else 0.0
    except ValueError:
        return 0.0


def _speculative_hint(value: Any) -> str | None:
    """A `speculative_config` hint as its compact JSON; None when absent or not a JSON object
    (the server's pool is then predicted without a drafter)."""
    if not value:
        return None
    try:
        return speculative_label(str(value))
    except ValueError:
        return None


def _mm_limits(value: Any) -> tuple[tuple[str, int], ...]:
    """A `limit_mm_per_prompt` hint (`image=2,video=0` or vLLM's JSON) as (modality, count) pairs;
    () when absent or unreadable (vLLM's default then)."""
    if not value:
        return ()
    try:
        return tuple(sorted(mm_limits(str(value)).items()))
    except ValueError:
        return ()


@dataclass(frozen=True)
class ServerFlags:
    """The engine flags a server runs with, as far as the daemon knows them: its hints (config,
    file_sd labels, pod arguments, scan flags) and what its `cache_config_info` reports. None: vLLM's
    default for the release. Hashable, so the calculator's caches key on it."""

    # named as Setup.build's keywords, which `build` passes them to
    tp: int = 1
    pp: int = 1
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    vllm_version: Version | None = None
    enforce_eager: bool = False
    dp: int = 1
    expert_parallel: bool = False
    enable_prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    mm_limits: tuple[tuple[str, int], ...] = ()
    skip_mm_profiling: bool = False
    mm_max_pixels: int | None = None
    speculative_config: str | None = None
    cpu_offload_gb: float = 0.0
    max_loras: int = 0
    max_lora_rank: int | None = None
    fully_sharded_loras: bool = False

    def build(self, model: ModelArch, gpu: GPU) -> Setup:
        flags = {f.name: getattr(self, f.name) for f in fields(self)}
        try:
            return Setup.build(model, gpu, **flags)
        except InputError as exc:
            if not self.speculative_config or not str(exc).startswith("--speculative-config"):
                raise
            # a drafter this model does not describe (an EAGLE head of an MLA model without its
            # config, ...): the server's own pool still tells the KV capacity
            return Setup.build(model, gpu, **{**flags, "speculative_config": None})


def server_flags(ident: Identity, x: DriftInput, vllm_version: str | None) -> ServerFlags:
    """The flags of this target: its identity's hints and what its metrics report."""
    return ServerFlags(tp=int(ident.tp), pp=int(ident.pp), quantization=ident.quantization,
                       kv_cache_dtype=_kv_dtype(x.cache_dtype), gpu_memory_utilization=x.gpu_memory_utilization,
                       max_model_len=int(x.max_model_len) if x.max_model_len else None,
                       max_num_seqs=x.max_num_seqs, max_num_batched_tokens=x.max_num_batched_tokens,
                       block_size=int(x.block_size) if x.block_size else None,
                       vllm_version=read_version(vllm_version), enforce_eager=ident.enforce_eager, dp=int(x.dp),
                       expert_parallel=ident.expert_parallel, enable_prefix_caching=x.enable_prefix_caching,
                       async_scheduling=ident.async_scheduling, mamba_cache_dtype=x.mamba_cache_dtype,
                       mamba_ssm_cache_dtype=x.mamba_ssm_cache_dtype, mm_limits=ident.mm_limits,
                       skip_mm_profiling=ident.skip_mm_profiling, mm_max_pixels=ident.mm_max_pixels,
                       speculative_config=ident.speculative_config, cpu_offload_gb=ident.cpu_offload_gb,
                       max_loras=ident.max_loras, max_lora_rank=ident.max_lora_rank,
                       fully_sharded_loras=ident.fully_sharded_loras)


def predict_for(ident: Identity, x: DriftInput, *, vllm_version: str | None,
                spec_per_position: tuple[float, ...] | None, prices: Mapping[str, float],
                calibration: perf.Calibration | None = None) -> Prediction:
    """The prediction seam: given who the target is and what was observed, what the model says
    (KV capacity, TPOT at the observed load, spec-decode gains, tiers), with its `basis`.

    A server on a non-GPU backend (`x.observation_only`) gets no prediction: its findings are
    what the metrics show. A GPU hint the server's own KV pool contradicts (`hint_mismatch`)
    yields no prediction either, only the mismatch and the GPU the pool points to."""
    if x.observation_only:
        return Prediction(notes=(f"vLLM on {x.backend} ({'; '.join(x.backend_evidence)}): observation "
                                 f"findings only (KV pressure, preemptions, queueing), no GPU-tier or "
                                 f"$/hour findings",))
    traffic = {"prompt_mean": x.prompt_mean, "output_mean": x.output_mean, "prompt_p99": x.prompt_p99,
               "output_p99": x.output_p99, "arrival_rps": x.arrival_rps,
               "prefix_hit_ratio": x.prefix_hit_ratio, "running_mean": x.running_mean,
               "spec_k": x.spec_k}
    flags = server_flags(ident, x, vllm_version)
    return predict(described(ident, x, vllm_version), flags, slo={"ttft": x.slo_ttft_s, "tpot": x.slo_tpot_s},
                        prices=prices, traffic={**_rounded(traffic), "spec_per_position": spec_per_position},
                        # a pool given by --kv-cache-memory-bytes / --num-gpu-blocks-override says
                        # nothing about the GPU behind it
                        observed_kv_tokens=None if x.pool_fixed_by else x.kv_cache_tokens,
                        calibration=calibration)


def described(ident: Identity, x: DriftInput, vllm_version: str | None) -> Resolved:
    """The target's resolved hints, with a GPU hint that has no catalog row described from the
    server's own KV pool (`_described_gpu`: a generic, unprofiled device)."""
    res = ident.resolved
    hint = ident.device_hint
    if (res.gpu is None and res.model is not None and hint and x.kv_cache_tokens and not non_gpu_kind(hint)
            and not x.observation_only):
        gpu = _described_gpu(res.model, server_flags(ident, x, vllm_version), float(f"{x.kv_cache_tokens:.4g}"),
                             hint)
        if gpu is not None:
            res = replace(res, gpu=gpu, notes=res.notes + (
                f"{hint!r} has no catalog row: described as a generic {gpu.memory_gib:.0f} GiB device (memory "
                f"inferred from the server's KV pool); step-time predictions are an unprofiled prior until "
                f"calibrated",))
    return res


def setup_for(ident: Identity, x: DriftInput, vllm_version: str | None) -> Setup | None:
    """The calculator's setup of this target (None when the model or GPU is unknown, or the
    calculator refuses it): what `predict_for` predicts from, for calibration."""
    if x.observation_only:
        return None
    res = described(ident, x, vllm_version)
    if res.model is None or res.gpu is None:
        return None
    try:
        return _setup(res.model, res.gpu, server_flags(ident, x, vllm_version))
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
def _setup(model: ModelArch, gpu: GPU, flags: ServerFlags) -> Setup:
    return flags.build(model, gpu)


def _kv_dtype(cache_dtype: str | None) -> str:
    d = (cache_dtype or "auto").lower()
    return "fp8" if d.startswith("fp8") else ("auto" if d in ("auto", "none", "") else d)


def predict(res: Resolved, flags: ServerFlags, *, traffic: Mapping[str, float | None],
            slo: Mapping[str, float | None], prices: Mapping[str, float],
            observed_kv_tokens: float | None = None,
            calibration: perf.Calibration | None = None) -> Prediction:
    """Everything the model can say about this setup at the observed traffic; fields it cannot
    compute stay None, with a note.

    A device described from the server (`described`: a GPU hint with no catalog row) is a generic
    prior: basis "unprofiled", and step-time findings stay `info` on it until calibrated."""
    notes = list(res.notes)
    if res.model is None or res.gpu is None:
        return Prediction(notes=tuple(notes))

    try:
        setup = _setup(res.model, res.gpu, flags)
        cap = _pool(setup)
    except InputError as exc:
        notes.append(f"calculator: {exc}")
        return Prediction(notes=tuple(notes))
    if observed_kv_tokens and cap.tokens > 0 and cap.bytes_per_token > 0 and not res.gpu.unprofiled:
        ratio = observed_kv_tokens / cap.tokens
        off_gib = abs(observed_kv_tokens - cap.tokens) * cap.pool_bytes_per_token / GIB
        if off_gib > MISMATCH_SHARE * setup.gpu_memory_gib:
            smaller = _smaller_mm_profile(res.model, res.gpu, flags, observed_kv_tokens)
            if smaller is not None:
                flags, setup, cap, note = smaller
                notes.append(note)
                off_gib = 0.0
        if off_gib > MISMATCH_SHARE * setup.gpu_memory_gib:
            # the probe of other devices never runs eager: a graph pool belongs to every GPU
            likely = _likely_gpu(res.model, replace(flags, enforce_eager=False),
                                 float(f"{observed_kv_tokens:.3g}"), res.gpu.name)
            notes.append(f"the server's KV pool ({observed_kv_tokens:,.0f} tokens) is {ratio:.2f}x what "
                         f"{res.gpu.name} x{flags.tp} would hold for this model ({off_gib:.1f} GiB per GPU apart): "
                         f"the GPU hint looks wrong" + (f" (the pool fits {' or '.join(likely)})" if likely else "")
                         + "; nothing is scored from the hinted hardware")
            return Prediction(hint_mismatch=(likely, round(ratio, 4)), hinted_gpu=res.gpu.name,
                              notes=tuple(notes))
    price = prices.get(res.gpu.name, res.gpu.dollars_per_hour)
    cost = price * setup.num_gpus
    fp8 = res.gpu.fp8_tflops > 0 or res.gpu.vendor == "amd"
    pred: dict[str, Any] = dict(kv_cache_tokens=float(cap.tokens), kv_bytes_per_token=float(cap.bytes_per_token),
                                kv_cache_gib=cap.memory.kv_cache_gib, gpu_memory_gib=setup.gpu_memory_gib,
                                fp8_kv_supported=fp8, current_cost_per_hour=cost,
                                default_max_num_seqs=None if flags.max_num_seqs else setup.max_num_seqs)
    pred.update(_performance(setup, traffic, slo, prices, notes, calibration))
    if res.gpu.unprofiled:
        pred["basis"] = "unprofiled"
    return Prediction(**pred, notes=tuple(notes))


# The observed KV pool and the hinted GPU's predicted pool differ by more than this share of the
# GPU's memory: the hinted GPU cannot be the one serving. Compared in memory, not as a ratio: when
# the pool is a small remainder (an 8B model on 24 GB at 0.75) a 1 GiB error in activations is a
# 5x ratio but no sign of another device; the calculator's memory error is a few percent of the
# card (tests/model/test_kv_cache.py), an H100 hint on an L4 server is 60% of it.
MISMATCH_SHARE = 0.20


def _smaller_mm_profile(model: ModelArch, gpu: GPU, flags: ServerFlags, observed: float
                        ) -> tuple[ServerFlags, Setup, Any, str] | None:
    """A multimodal server whose pool is far above what vLLM's default startup profile leaves
    (a dummy video of gigabytes, or many images) was most likely started with a smaller one
    (`--limit-mm-per-prompt`, `--mm-processor-kwargs`, `--skip-mm-profiling`) that the daemon was
    not told: the flags, setup, pool and a note of the smaller profile that explains the observed
    pool within the mismatch margin, or None (then the GPU hint is what looks wrong)."""
    if model.vision is None or flags.skip_mm_profiling:
        return None
    default = encoder_profile(_setup(model, gpu, flags))
    tried = []
    for alt in (replace(flags, mm_limits=tuple(sorted({**dict(flags.mm_limits), "video": 0}.items()))),
                replace(flags, skip_mm_profiling=True)):
        try:
            setup = _setup(model, gpu, alt)
            cap = _pool(setup)
        except InputError:
            continue
        if default is None or encoder_profile(setup) == default or cap.tokens <= 0:
            continue
        off = abs(observed - cap.tokens) * cap.pool_bytes_per_token / GIB
        if off <= MISMATCH_SHARE * setup.gpu_memory_gib:
            tried.append((off, alt, setup, cap))
    if not tried:
        return None
    _, alt, setup, cap = min(tried, key=lambda t: t[0])
    what = ("no dummy video (--limit-mm-per-prompt video=0?)" if alt.mm_limits != flags.mm_limits
            else "no multimodal encoder (--skip-mm-profiling?)")
    return alt, setup, cap, (f"the server's KV pool ({observed:,.0f} tokens) is what {gpu.name} holds with "
                             f"{what} in vLLM's startup profile, not with the default one ({default.describe()}); "
                             f"predicted as such: give the server's multimodal flags as labels (limit_mm_per_prompt, "
                             f"mm_max_pixels, skip_mm_profiling) to say it")


@lru_cache(maxsize=512)
def _pool(setup: Setup):
    """The pool a setup gets: the same for every evaluation of a server until its config changes
    (kv_capacity walks the model's layers: ~0.15 ms, an eighth of an evaluation)."""
    return kv_capacity(setup, check_fits=False)


@lru_cache(maxsize=256)
def _described_gpu(model: ModelArch, flags: ServerFlags, observed: float, name: str) -> GPU | None:
    """A generic device whose memory makes this model's predicted pool the observed one: what the
    model needs beside the pool (weights, activations, graphs), probed on a large device with the
    server's own flags, plus the observed tokens at the probe's pool bytes per token (which the
    flags decide for hybrids and sliding windows: max_model_len, prefix caching), over the memory
    utilisation."""
    try:
        for probe_gib in (80.0, 640.0):      # a model too large for the first probe leaves it no pool
            probe = generic_gpu(probe_gib, name=name)
            setup = _setup(model, probe, flags)
            cap = kv_capacity(setup, check_fits=False)
            if cap.tokens > 0:
                break
        else:
            return None
        used = setup.gpu_memory_utilization * setup.gpu_memory_gib
        beside = used - cap.memory.kv_cache_gib
        memory = (beside + observed * cap.pool_bytes_per_token / GIB) / setup.gpu_memory_utilization
        return generic_gpu(round(memory, 1), name=name) if memory > 0 else None
    except (InputError, ArithmeticError, ValueError, TypeError):
        return None


@lru_cache(maxsize=256)
def _likely_gpu(model: ModelArch, flags: ServerFlags, observed: float, hinted: str) -> tuple[str, ...]:
    """The catalog GPUs whose predicted pool for this model is closest to the observed one (within
    10% of their memory), best first; cards of one memory class (L4, A30, RTX 4090) hold alike
    pools, so all of them within 3 points of the best are named."""
    scored = []
    for name in gpu_names():
        if name == hinted:
            continue
        gpu = find_gpu(name)
        try:
            setup = _setup(model, gpu, flags)
            cap = kv_capacity(setup, check_fits=False)
        except (InputError, ArithmeticError, ValueError, TypeError):
            continue
        if cap.tokens <= 0:
            continue
        e = abs(observed - cap.tokens) * cap.pool_bytes_per_token / GIB / gpu.memory_gib
        if e < 0.10:
            scored.append((e, not gpu.tier, name))
    scored.sort()
    return tuple(n for e, _, n in scored if e <= scored[0][0] + 0.03)[:6] if scored else ()


# Without configured SLOs the tier comparison uses these interactive-chat defaults (documented in
# docs/scores.md; `slo:` in the config or per target overrides them).
DEFAULT_SLO = {"ttft": 2.0, "tpot": 0.150}


# Without a configured SLO, the latency a target is held to (and that the latency alerts compare
# its p99 with) is what its hardware should deliver at its observed load, with this margin, and
# never tighter than the defaults above: an 8B model on an L4 is not paged for missing an H100's
# inter-token latency.
EXPECTED_MARGIN = 1.5


def slo_of(x: DriftInput, pred: Prediction | None = None) -> dict[str, dict[str, Any]]:
    """The p99 latency objectives a target is held to, as the report's `slo_seconds` /
    `slo_source` (exported as `vllm_drift_slo_seconds{metric,quantile,source}`): the configured
    SLO; else the model's expected p99 at the observed load x `EXPECTED_MARGIN` when it has one
    (source "expected"; "tpot" then covers the inter-token gaps the alerts read), else the default."""
    seconds, source = {}, {}
    expected = {"ttft": pred.expected_ttft_p99_s if pred else None,
                "tpot": pred.expected_itl_p99_s if pred else None}
    for metric, given in (("ttft", x.slo_ttft_s), ("tpot", x.slo_tpot_s)):
        if given:
            seconds[metric], source[metric] = float(given), "configured"
        elif expected[metric] and math.isfinite(expected[metric]):
            seconds[metric] = max(DEFAULT_SLO[metric], EXPECTED_MARGIN * float(expected[metric]))
            source[metric] = "expected"
        else:
            seconds[metric], source[metric] = DEFAULT_SLO[metric], "default"
    return {"slo_seconds": seconds, "slo_source": source}


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
        # the drafter the server was started with, where its --speculative-config is known
        method = setup.speculative.method if setup.speculative is not None else "eagle"
        spec = SpecConfig(num_tokens=int(round(k)), alpha=0.0, per_position=per_pos, draft_cost=draft_cost,
                          method=method)
        ctx = tr.prompt_tokens_mean + tr.output_tokens_mean / 2.0
        out["spec_speedup"] = float(gain(setup, spec, int(max(1, round(running or 1))), ctx).speedup)
        if b_cap:
            out["spec_speedup_at_capacity"] = float(gain(setup, spec, int(b_cap), ctx).speedup)
    return out


# What speculation would plausibly give a server that runs without it: the one shared assumption
# (exporter.model.spec_decode.ASSUMED_SPEC); the finding stays `info` unless a TPOT SLO is missed.


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
