"""The `observed` object of `scan --json` and `/api/v1/findings`.

Why here: it is the one place where a Snapshot (instantaneous gauges, lifetime counters, the
served configuration) and a window summary (rates and quantiles) meet, with a fixed rule for
each key: latency quantiles and ratios come from the window when it has a pair of snapshots
with traffic between them, else from the lifetime (cumulative) histograms of the latest
snapshot; `latency_source` says which. Missing signals are None, never 0.
"""
from __future__ import annotations

import math
from typing import Any

from exporter.parse.snapshot import Snapshot
from exporter.window.window import Observed, Quantiles

__all__ = ["OBSERVED_KEYS", "observed_signals"]

OBSERVED_KEYS = (
    "kv_cache_usage", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
    "prompt_tokens_total", "generation_tokens_total", "prefix_cache_hit_ratio",
    "spec_decode_acceptance_rate", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "num_gpu_blocks", "block_size", "kv_cache_tokens", "gpu_memory_utilization",
    "enable_prefix_caching", "cache_dtype", "max_model_len",
)


def _num(v: float | None) -> float | None:
    """v, or None for None, NaN and +-Inf (v - v is 0 for every finite number, NaN otherwise)."""
    return v if v is None or v - v == 0 else None


def _window_ok(observed: Observed | None) -> bool:
    return observed is not None and observed.samples >= 2 and observed.duration_s > 0


def observed_signals(snapshot: Snapshot, observed: Observed | None = None, *,
                     max_model_len: int | None = None) -> dict[str, Any]:
    """Every `observed` key of the findings contract (`OBSERVED_KEYS`, None when absent), plus
    extra keys: window rates (`*_per_s`), more quantiles, gauge means/maxima, the era and
    version guess."""
    g, c, h, cfg = snapshot.gauges, snapshot.counters, snapshot.histograms, snapshot.config
    window = _window_ok(observed)
    out: dict[str, Any] = {
        "kv_cache_usage": _num(g.get("kv_cache_usage")),
        "num_requests_running": _num(g.get("num_requests_running")),
        "num_requests_waiting": _num(g.get("num_requests_waiting")),
        "num_requests_waiting_deferred": _num(g.get("num_requests_waiting_deferred")),
        "num_preemptions_total": _num(c.get("num_preemptions_total")),
        "prompt_tokens_total": _num(c.get("prompt_tokens_total")),
        "generation_tokens_total": _num(c.get("generation_tokens_total")),
    }

    # ratios: the window's when it saw traffic, else lifetime
    hit_ratio = observed.prefix_cache_hit_ratio if window else None
    if hit_ratio is None:
        q, hits = c.get("prefix_cache_queries_total"), c.get("prefix_cache_hits_total")
        if q and hits is not None and q > 0:
            hit_ratio = hits / q
        elif q is None and (v0 := g.get("prefix_cache_hit_rate")) is not None and v0 >= 0:
            hit_ratio = v0  # V0 gauge, -1 when prefix caching is off
    out["prefix_cache_hit_ratio"] = _num(hit_ratio)
    acc_rate = observed.spec_decode_acceptance_rate if window else None
    if acc_rate is None:
        drafted = c.get("spec_decode_num_draft_tokens_total")
        accepted = c.get("spec_decode_num_accepted_tokens_total")
        if drafted and accepted is not None and drafted > 0:
            acc_rate = accepted / drafted
    out["spec_decode_acceptance_rate"] = _num(acc_rate)

    # latency: window quantiles when the window had observations, else lifetime histograms
    source = None
    ttft = tpot = itl = queue = e2e = None
    tpot_source = None
    if window and observed.ttft is not None:
        ttft, itl, queue, e2e = observed.ttft, observed.itl, observed.queue_time, observed.e2e
        tpot, tpot_source = observed.tpot, observed.tpot_source
        source = "window"
    else:
        ttft = Quantiles.of(h.get("ttft_seconds"))
        itl = Quantiles.of(h.get("itl_seconds"))
        queue = Quantiles.of(h.get("queue_time_seconds"))
        e2e = Quantiles.of(h.get("e2e_seconds"))
        if "tpot_seconds" in h:
            tpot, tpot_source = Quantiles.of(h["tpot_seconds"]), "request_tpot"
        elif "itl_seconds" in h:
            tpot, tpot_source = itl, "itl"
        if any(x is not None for x in (ttft, itl, tpot, queue, e2e)):
            source = "cumulative"
    for name, q in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("queue_time", queue), ("e2e", e2e)):
        out[f"{name}_p50_s"] = _num(q.p50) if q else None
        out[f"{name}_p90_s"] = _num(q.p90) if q else None
        out[f"{name}_p99_s"] = _num(q.p99) if q else None
        out[f"{name}_mean_s"] = _num(q.mean) if q else None
    out["tpot_source"] = tpot_source
    out["latency_source"] = source

    # configuration the server reports
    out["num_gpu_blocks"] = cfg.num_gpu_blocks
    out["block_size"] = cfg.block_size
    out["kv_cache_tokens"] = snapshot.kv_cache_tokens()
    out["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    out["enable_prefix_caching"] = cfg.enable_prefix_caching
    out["cache_dtype"] = cfg.cache_dtype
    out["max_model_len"] = max_model_len
    out["kv_cache_max_concurrency"] = cfg.kv_cache_max_concurrency
    out["sliding_window"] = cfg.sliding_window
    # the largest finite request_prompt_tokens bucket: vLLM builds them up to max_model_len
    prompt_hist = h.get("prompt_tokens")
    finite = [b for b in (prompt_hist.bounds if prompt_hist else ()) if math.isfinite(b)]
    out["request_tokens_bucket_max"] = int(finite[-1]) if finite else None

    # identity
    out["engine_era"] = snapshot.engine_era
    out["engines"] = snapshot.engines
    out["sleep_level"] = snapshot.sleep_level
    out["vllm_version_guess"] = snapshot.version_guess
    out["num_requests_swapped"] = _num(g.get("num_requests_swapped"))
    out["request_success_total"] = _num(c.get("request_success_total"))

    # window
    if observed is not None:
        out["window_seconds"] = observed.duration_s
        out["window_samples"] = observed.samples
        out["counter_reset"] = observed.reset
        for key in ("requests_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
                    "preemptions_per_s", "engine_steps_per_s", "finished_length_share",
                    "spec_decode_mean_acceptance_length", "kv_usage_mean", "kv_usage_max",
                    "running_mean", "running_max", "waiting_mean", "waiting_max",
                    "waiting_deferred_mean", "max_running_seen"):
            out[key] = _num(getattr(observed, key))
        # a generated length cannot exceed the largest max_tokens requested nor the context:
        # interpolation inside a wide bucket must not report longer requests than could exist
        cap = min((c for c in (observed.max_tokens_top, max_model_len) if c), default=None)
        for name, q in (("prompt_len", observed.prompt_len), ("generation_len", observed.generation_len)):
            for stat in ("mean", "p50", "p90", "p99"):
                v = _num(getattr(q, stat)) if q else None
                if v is not None and cap is not None and name == "generation_len" and stat != "mean":
                    v = min(v, float(cap))
                out[f"{name}_{stat}"] = v
        out["max_tokens_top_bucket"] = _num(observed.max_tokens_top)
    return out
