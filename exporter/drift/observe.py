"""From the window summary, the latest snapshot, `/v1/models` and the target's hints to one
`DriftInput`; and the rule for "is there enough data to judge".

Why here and not in the window: these are the drift engine's choices (which quantile stands for
"the shared-prefix floor", how max_num_seqs is inferred, what counts as too little data), kept
next to the rules that depend on them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from exporter.config import SLO
from exporter.drift.inputs import DriftInput
from exporter.drift.predict import Identity
from exporter.model.backends import backend_of
from exporter.parse.snapshot import Histogram, Snapshot
from exporter.parse.version import read_version
from exporter.parse.metadata import Metadata
from exporter.parse.numbers import finite_float

MIN_COVER = 0.5          # share of the window the data must cover
LIFETIME_MIN_REQUESTS = 50   # finished requests before a server's lifetime shapes stand in for a window
MIN_SAMPLES = 3


def _q(quantiles: Any, name: str) -> float | None:
    return None if quantiles is None else finite_float(getattr(quantiles, name, None))


def _top_populated(h: Histogram | None) -> float | None:
    return None if h is None else h.top_populated()


@dataclass(frozen=True)
class _Shape:
    """A lifetime histogram's quantiles, read like the window's (`_q`)."""

    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, h: Histogram) -> "_Shape":
        return cls(h.mean(), *h.quantiles((0.5, 0.99)))


def _bucket_of(h: Histogram | None, value: float | None) -> tuple[float, float] | None:
    """The (lower, upper] bucket holding `value`."""
    if h is None or value is None:
        return None
    lo = 0.0
    for bound in h.bounds:
        if value <= bound:
            return lo, bound
        lo = bound
    return None


COARSE = 0.5    # a quantile whose bucket is wider than half its value is only known to that bucket


def _coarse(name: str, h: Histogram | None, value: float | None) -> str | None:
    b = _bucket_of(h, value)
    if b is None or value is None or value <= 0 or not math.isfinite(b[1]):
        return None
    lo, hi = b
    if hi - lo > COARSE * value:
        return f"{name} in ({lo:g}, {hi:g}]"
    return None


def context_share(length_share: float | None, mml: float | None, prompt_mean: float | None,
                  prompt_p99: float | None, gen: Histogram | None, maxtok: Histogram | None) -> float | None:
    """The share of finished requests that max_model_len can have stopped: vLLM counts both a
    request's own `max_tokens` and the context limit as `finished_reason="length"`.

    With `request_params_max_tokens`: none could reach the context when even the longest prompt
    plus the largest requested max_tokens stays under 90% of max_model_len; and when the requests
    generated all they asked for (generated tokens = requested max_tokens, to 2%) with prompt +
    max_tokens on average under 90% of the context, they stopped on their own max_tokens (a
    request sent without max_tokens gets max_model_len - prompt, and would sum to the context).
    Without that histogram the length share stands as it is (None: unknown)."""
    if length_share is None:
        return None
    if maxtok is None or not maxtok.count or mml is None:
        return length_share
    top = _top_populated(maxtok)
    top = min(top, mml) if top is not None else None
    if top is not None and prompt_p99 is not None and prompt_p99 + top < 0.9 * mml:
        return 0.0
    mt_mean = maxtok.mean()
    gen_mean = gen.mean() if gen is not None and gen.count else None
    if (mt_mean and gen_mean is not None and gen_mean >= 0.98 * mt_mean and prompt_mean is not None
            and prompt_mean + mt_mean < 0.9 * mml):
        return 0.0
    return length_share


def build_input(ident: Identity, obs: Any, latest: Snapshot, metadata: Metadata | None,
                observed: Mapping[str, Any], slo: SLO | None, window_s: float, window: Any = None,
                hists: Mapping[str, Histogram | None] | None = None) -> DriftInput:
    """`obs` is the window's summary, `hists` the histogram deltas it computed
    (`Window.summary(now, hists)`)."""
    cc = latest.config
    engines = max(1, int(latest.engines or 1))
    bs = finite_float(cc.block_size)
    tokens = finite_float(latest.kv_cache_tokens())
    kv_mem = cc.kv_cache_memory_bytes
    mml = finite_float(observed.get("max_model_len"))
    if mml is None:
        mml = finite_float(cc.max_model_len)

    hists = hists or {}
    prompt_hist = hists.get("prompt_tokens")
    gen_hist = hists.get("generation_tokens")
    maxtok_hist = hists.get("max_tokens_param")
    maxtok_top = _top_populated(maxtok_hist)
    steps_hist = hists.get("iteration_tokens")
    per_pos = getattr(obs, "spec_decode_acceptance_per_pos", ()) or ()
    mean_len = finite_float(getattr(obs, "spec_decode_mean_acceptance_length", None))
    spec_k = finite_float(getattr(obs, "spec_decode_draft_length", None))
    if spec_k is None and per_pos:
        spec_k = float(len(per_pos))
    prompt = getattr(obs, "prompt_len", None)
    gen = getattr(obs, "generation_len", None)
    length_share = finite_float(getattr(obs, "finished_length_share", None))
    lifetime = False
    samples = int(getattr(obs, "samples", 0) or 0)
    covered = finite_float(getattr(obs, "duration_s", 0.0)) or 0.0
    win = float(getattr(window, "duration", window_s) if window is not None else window_s)
    if samples < MIN_SAMPLES or covered < MIN_COVER * win:
        # the window cannot judge yet (one scrape, a new target, a reset): the request shapes the
        # server has seen since it started (its cumulative histograms) stand in, once at least 50
        # requests finished and more than in the window
        hp, hg = latest.histograms.get("prompt_tokens"), latest.histograms.get("generation_tokens")
        in_window = getattr(gen, "count", 0) or 0
        if (hp is not None and hg is not None and (hg.count or 0) >= LIFETIME_MIN_REQUESTS
                and (hg.count or 0) > in_window):
            lifetime = True
            prompt, gen = _Shape.of(hp), _Shape.of(hg)
            prompt_hist, gen_hist = hp, hg
            maxtok_hist = latest.histograms.get("max_tokens_param")
            maxtok_top = _top_populated(maxtok_hist)
            done = latest.counters.get("request_success_total")
            length = latest.finished_by_reason.get("length")
            if done and length is not None:
                length_share = length / done
    tpot = getattr(obs, "tpot", None)
    ttft = getattr(obs, "ttft", None)
    queue = getattr(obs, "queue_time", None)
    # a generated length cannot exceed what was asked for, nor prompt+output the context:
    # interpolation inside a wide bucket must not invent longer requests
    out_p99 = _q(gen, "p99")
    coarse = [c for c in (_coarse("output p99", gen_hist, out_p99),
                          _coarse("prompt p99", prompt_hist, _q(prompt, "p99"))) if c]
    if out_p99 is not None and maxtok_top is not None:
        out_p99 = min(out_p99, maxtok_top)
    if out_p99 is not None and mml is not None:
        out_p99 = min(out_p99, mml)

    def per_engine(name: str) -> float | None:
        """A server total (rate, running or waiting count) as one engine's share: the load
        balancer spreads requests over the engines, each with its own batch and pool."""
        v = finite_float(getattr(obs, name, None))
        return None if v is None else v / engines
    backend = backend_of(version=metadata.vllm_version if metadata else None, metric_names=latest.families,
                         cache_config=latest.cache_config, device=ident.device_hint)

    return DriftInput(
        target=ident.target, model_name=ident.model_name, era=latest.engine_era, engines=engines,
        sleep_level=latest.sleep_level,
        vllm_version=read_version(metadata.vllm_version if metadata else None),
        window_s=float(getattr(window, "duration", window_s) if window is not None else window_s),
        covered_s=finite_float(getattr(obs, "duration_s", 0.0)) or 0.0, samples=int(getattr(obs, "samples", 0) or 0),
        history_s=finite_float(getattr(obs, "history_s", 0.0)) or 0.0,
        reset=bool(getattr(obs, "reset", False)),
        arrival_rps=per_engine("requests_per_s"),
        prompt_tps=per_engine("prompt_tokens_per_s"),
        generation_tps=per_engine("generation_tokens_per_s"),
        preemptions_ps=per_engine("preemptions_per_s"),
        steps_ps=per_engine("engine_steps_per_s"),
        prompt_mean=_q(prompt, "mean"), prompt_p50=_q(prompt, "p50"), prompt_p99=_q(prompt, "p99"),
        prompt_p25=finite_float(prompt_hist.quantile(0.25)) if prompt_hist is not None else None,
        output_mean=_q(gen, "mean"), output_p99=out_p99,
        length_share=length_share,
        context_length_share=context_share(length_share, mml, _q(prompt, "mean"), _q(prompt, "p99"),
                                           gen_hist, maxtok_hist),
        max_tokens_mean=maxtok_hist.mean() if maxtok_hist is not None and maxtok_hist.count else None,
        max_tokens_top=maxtok_top, coarse=tuple(coarse), lifetime_shapes=lifetime,
        prefix_hit_ratio=finite_float(getattr(obs, "prefix_cache_hit_ratio", None)),
        spec_acceptance=finite_float(getattr(obs, "spec_decode_acceptance_rate", None)),
        spec_mean_accepted=None if mean_len is None else mean_len - 1.0,
        spec_k=spec_k, iteration_tokens_max=_top_populated(steps_hist),
        kv_usage_mean=finite_float(getattr(obs, "kv_usage_mean", None)), kv_usage_max=finite_float(getattr(obs, "kv_usage_max", None)),
        running_mean=per_engine("running_mean"), running_max=per_engine("running_max"),
        waiting_mean=per_engine("waiting_mean"), waiting_max=per_engine("waiting_max"),
        ttft_p50=_q(ttft, "p50"), ttft_p99=_q(ttft, "p99"), tpot_p50=_q(tpot, "p50"), tpot_p99=_q(tpot, "p99"),
        queue_p99=_q(queue, "p99"), e2e_mean=_q(getattr(obs, "e2e", None), "mean"),
        itl_mean=_q(getattr(obs, "itl", None) or tpot, "mean"),
        block_size=bs, kv_cache_tokens=tokens,
        gpu_memory_utilization=cc.gpu_memory_utilization, enable_prefix_caching=cc.enable_prefix_caching,
        cache_dtype=cc.cache_dtype, mamba_cache_dtype=cc.mamba_cache_dtype,
        mamba_ssm_cache_dtype=cc.mamba_ssm_cache_dtype,
        max_model_len=mml, kv_cache_memory_gib=(kv_mem / 2**30 if kv_mem else None),
        pool_fixed_by=("--num-gpu-blocks-override" if cc.num_gpu_blocks_override else
                       "--kv-cache-memory-bytes" if kv_mem else None),
        # vLLM flattens TP across DP for the fused-MoE layer: the hint, else the engines shown
        gpu=ident.gpu, tp=ident.tp, pp=ident.pp, dp=max(1, ident.dp or engines), model=ident.resolved.model_id,
        missing_hints=ident.resolved.missing, backend=backend.kind, backend_evidence=backend.evidence,
        observation_only=backend.observation_only,
        max_running_seen=per_engine("max_running_seen"),
        max_num_seqs=ident.max_num_seqs, max_num_batched_tokens=ident.max_num_batched_tokens,
        slo_ttft_s=slo.ttft_p99 if slo else None, slo_tpot_s=slo.tpot_p99 if slo else None,
        families=frozenset(set(latest.gauges) | set(latest.counters) | set(latest.histograms)),
    )


def sufficiency(x: DriftInput, *, one_shot: bool = False) -> tuple[bool, str]:
    """Enough data to judge: the window covers at least half its length with a few scrapes.
    A counter reset restarts the window, so right after a restart this is false. A one-shot
    diagnosis (`scan`) judges from any pair of snapshots with time between them."""
    if one_shot:
        if x.samples >= 2 and x.covered_s > 0:
            return True, ""
        return False, ("insufficient data: one snapshot has no rates; give a second with --after FILE "
                       "(files) or --interval SECONDS (URLs)")
    need = MIN_COVER * x.window_s
    if x.samples < MIN_SAMPLES or x.covered_s < need:
        why = (f"insufficient data: the window holds {x.covered_s:.0f} s in {x.samples} scrapes; "
               f"findings need {need:.0f} s" + (" (a counter reset restarted it)" if x.reset else ""))
        return False, why
    return True, ""


MIN_REQUESTS = 3


def low_traffic(x: DriftInput) -> str:
    """Non-empty (the reason) when too few requests ran in the window to judge the settings."""
    finished = (x.arrival_rps or 0.0) * x.covered_s
    if finished >= MIN_REQUESTS or (x.running_mean or 0.0) >= 1.0:
        return ""
    return (f"insufficient data: {finished:.0f} requests finished and {x.running_mean or 0:.1f} ran on "
            f"average in the last {x.covered_s:.0f} s; settings are judged from {MIN_REQUESTS} requests up")
