"""The typed, era-independent view of one vLLM engine's `/metrics` at one instant.

Everything downstream (windows, drift scoring, export) reads these objects, never raw metric
names: the mapping from every vLLM era's names to the canonical keys below lives in
`exporter.parse.canonical` alone.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate
from operator import gt, sub
from dataclasses import dataclass, field
from typing import Mapping

from exporter.parse.cache_config import CacheConfig, read_cache_config

_NEGATIVE = (0.0).__gt__   # c -> c < 0 for int and float counts (False for NaN, as the comparison is)

# Canonical keys. Gauges are instantaneous values (summed over data-parallel engines, except
# kv_cache_usage which is the max); counters are monotonic totals summed over engines.
GAUGES = (
    "kv_cache_usage",          # fraction 0..1 (kv_cache_usage_perc / gpu_cache_usage_perc)
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_swapped",    # V0 only
    "prefix_cache_hit_rate",   # V0 gauge, -1 when disabled
    # 0.20+ (num_requests_waiting_by_reason): waiting for a batch slot or KV blocks, and waiting on
    # anything else (`deferred`: LoRA budget, KV transfer in disaggregated serving, blocked)
    "num_requests_waiting_capacity",
    "num_requests_waiting_deferred",
)
COUNTERS = (
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",   # all finished_reason values
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
)
HISTOGRAMS = (
    "ttft_seconds",            # time_to_first_token_seconds
    "itl_seconds",             # inter_token_latency_seconds / time_per_output_token_seconds
    "tpot_seconds",            # request_time_per_output_token_seconds (0.11+)
    "e2e_seconds",
    "queue_time_seconds",
    "prefill_time_seconds",
    "decode_time_seconds",
    "inference_time_seconds",
    "prompt_tokens",           # request_prompt_tokens
    "generation_tokens",       # request_generation_tokens
    "iteration_tokens",        # iteration_tokens_total
    "max_tokens_param",        # request_params_max_tokens
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: cumulative counts at upper bounds read from the scrape (the last
    bound is +Inf when the exposition is complete)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0
    count: float = 0.0

    def delta(self, earlier: "Histogram") -> "Histogram | None":
        """This histogram minus an earlier one of the same series; None when the bucket layout
        changed or a count went down (a reset): the caller then starts afresh."""
        if earlier.bounds != self.bounds:
            return None
        counts = tuple(map(sub, self.counts, earlier.counts))
        if any(map(_NEGATIVE, counts)) or self.count < earlier.count:
            return None
        return Histogram(self.bounds, counts, self.sum - earlier.sum, self.count - earlier.count)

    def quantile(self, q: float) -> float | None:
        """Prometheus `histogram_quantile` semantics: linear interpolation inside the bucket, the
        highest finite bound when the rank falls in +Inf. None when there are no observations."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: tuple[float, ...]) -> list[float | None]:
        """`quantile` for each of `qs`, the buckets read once. As Prometheus does, the counts
        are made monotonic first (a torn scrape can leave a bucket below the one before it),
        then each rank's bucket is found by binary search."""
        counts, bounds = self.counts, self.bounds
        if not counts or not bounds:
            return [None] * len(qs)
        total = counts[-1]
        if total <= 0 or math.isnan(total):
            return [None] * len(qs)
        if any(map(gt, counts, counts[1:])):
            counts = tuple(accumulate(counts, max))
        n = len(bounds)
        out: list[float | None] = []
        for q in qs:
            rank = q * total
            i = bisect_left(counts, rank)
            if i >= n:
                out.append(bounds[-1])
                continue
            bound, count = bounds[i], counts[i]
            prev_bound, prev_count = (bounds[i - 1], counts[i - 1]) if i else (0.0, 0.0)
            if math.isinf(bound):
                out.append(prev_bound)
            elif count == prev_count or (prev_bound == 0.0 and bound <= 0):
                out.append(bound)
            else:
                out.append(prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count))
        return out

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def top_populated(self) -> float | None:
        """Upper bound of the highest finite bucket that gained observations (None: none)."""
        prev, top = 0.0, None
        for bound, count in zip(self.bounds, self.counts):
            if count > prev and math.isfinite(bound):
                top = bound
            prev = count
        return top


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of one served model on one target, canonicalised across vLLM eras.

    Missing signals are absent from the mappings (never zero): an old server without
    `num_preemptions_total` has no such key, and findings that need it say so.
    """

    target: str
    model_name: str
    timestamp: float                       # scrape time, unix seconds
    engine_era: str                        # "v0" or "v1"
    engines: int = 1                       # distinct data-parallel `engine` label values
    gauges: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[str, float] = field(default_factory=dict)
    finished_by_reason: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    cache_config: Mapping[str, str] = field(default_factory=dict)   # cache_config_info labels
    spec_accepted_per_pos: tuple[float, ...] = ()
    start_time: float | None = None        # earliest `_created` of a canonical series: engine start
    families: frozenset[str] = frozenset() # vllm: family names seen (for "unavailable: needs X")
    # Added by the canonicaliser (defaults keep older constructors working):
    version_guess: str | None = None       # from the names/labels seen, e.g. ">=0.10.1,<0.10.2"
    notes: tuple[str, ...] = ()            # what could not be canonicalised, and why
    # vLLM sleep mode (`vllm:engine_sleep_state`, 0.11.1+): 0 awake, 1 weights offloaded to CPU,
    # 2 weights and KV cache discarded; None when the server does not say
    sleep_level: int | None = None

    @property
    def config(self) -> CacheConfig:
        """The cache config, typed (`exporter.parse.cache_config`)."""
        return read_cache_config(self.cache_config)

    def kv_cache_tokens(self) -> int | None:
        """One engine's KV capacity in tokens: `kv_cache_size_tokens` (0.24+, hybrid-aware, per
        engine), else num_gpu_blocks x block_size over the engines: with data parallelism the
        frontend sums every engine's blocks into the one `num_gpu_blocks` each engine's
        cache_config_info carries (v1/engine/core_client.py; a real DP=2 capture shows 192
        blocks on each engine of 96)."""
        cfg = self.config
        if cfg.kv_cache_size_tokens is not None:
            return cfg.kv_cache_size_tokens
        if cfg.num_gpu_blocks is not None and cfg.block_size is not None:
            return cfg.num_gpu_blocks // max(1, self.engines) * cfg.block_size
        return None
