"""Every `vllm:` metric name of every vLLM era, and what it means canonically.

This module is data: the canonicaliser reads it to map names to `Snapshot` keys, to prefer the
new name when a server exposes both (deprecated names stay visible for a release or two, hidden
ones come back with `--show-hidden-metrics-for-version`), to tell the V0 engine from V1, and to
guess the vLLM version from what a scrape holds when `/version` is not available.

Source of every range: `../shared/reference/vllm-metrics.md`, Appendix A (V1 logger, AST scan of
each released wheel 0.7.0 ... 0.33.0) and Appendix B (V0 engine, wheels 0.5.5 ... 0.11.0), with the
renames of §3.3 and the `cache_config_info` label history of §2.9. `first`/`last` are released
versions whose wheel contains the name (0.21.0 is missing from that scan, so "0.22.0" may mean
0.21.0). Counters are listed by their exposed sample name (always `..._total`), histograms by
their base name.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from exporter.parse.version import Version, format_version, read_version

V0, V1 = "v0", "v1"


@dataclass(frozen=True, slots=True)
class MetricName:
    exposed: str              # sample name (counters with _total) or histogram base name
    kind: str                 # "gauge" | "counter" | "histogram"
    era: str                  # "v0" or "v1": which engine's metrics code declares it
    first: str                # first released version with it
    last: str | None = None   # last released version with it (None: still in 0.33.0)
    key: str | None = None    # canonical key in Snapshot (None: known, not canonicalised)
    rank: int = 0             # several names for one key: the lowest rank present wins
    always: bool = False      # always exposed by a complete V1 scrape from `first` on
                              # (so its absence bounds the version from above)


def _v1(exposed, kind, first, last=None, key=None, rank=0, always=False):
    return MetricName(exposed, kind, V1, first, last, key, rank, always)


def _v0(exposed, kind, first, last="0.11.0", key=None, rank=0):
    return MetricName(exposed, kind, V0, first, last, key, rank)


G, C, H = "gauge", "counter", "histogram"

# V1 engine (`vllm/v1/metrics/loggers.py`, `v1/spec_decode/metrics.py`, `v1/metrics/perf.py`).
# The 0.9.0 code rename `vllm:x_total` -> `vllm:x` does not change the exposed name.
V1_NAMES: tuple[MetricName, ...] = (
    _v1("vllm:num_requests_running", G, "0.7.1", key="num_requests_running"),
    _v1("vllm:num_requests_waiting", G, "0.7.1", key="num_requests_waiting"),
    _v1("vllm:num_requests_waiting_by_reason", G, "0.20.0"),
    _v1("vllm:num_requests_kv_fetch_by_stage", G, "0.32.0"),
    _v1("vllm:kv_cache_usage_perc", G, "0.9.2", key="kv_cache_usage", always=True),
    # DEPRECATED help 0.9.2-0.10.2, hidden 0.11.x, removed 0.12.0
    _v1("vllm:gpu_cache_usage_perc", G, "0.7.1", "0.11.2", key="kv_cache_usage", rank=1),
    _v1("vllm:engine_sleep_state", G, "0.11.1"),
    _v1("vllm:lora_requests_info", G, "0.8.0"),
    _v1("vllm:cache_config_info", G, "0.8.0", always=True),
    _v1("vllm:prompt_tokens_total", C, "0.7.1", key="prompt_tokens_total"),
    _v1("vllm:generation_tokens_total", C, "0.7.1", key="generation_tokens_total"),
    _v1("vllm:prompt_tokens_by_source_total", C, "0.16.0"),
    _v1("vllm:prompt_tokens_cached_total", C, "0.16.0"),
    _v1("vllm:prompt_tokens_cached_by_source_total", C, "0.32.0"),
    _v1("vllm:prompt_tokens_recomputed_total", C, "0.16.0", "0.19.1"),
    _v1("vllm:request_success_total", C, "0.7.2", key="request_success_total"),
    _v1("vllm:num_preemptions_total", C, "0.8.0", key="num_preemptions_total", always=True),
    _v1("vllm:corrupted_requests_total", C, "0.11.1"),
    _v1("vllm:watermark_requests_total", C, "0.32.0"),
    _v1("vllm:admission_rejections_total", C, "0.32.0"),
    _v1("vllm:prefix_cache_queries_total", C, "0.9.2", key="prefix_cache_queries_total", always=True),
    _v1("vllm:prefix_cache_hits_total", C, "0.9.2", key="prefix_cache_hits_total", always=True),
    # counted blocks in 0.7.3-0.8.5, tokens from 0.9.0; DEPRECATED 0.9.2-0.10.2, hidden 0.11.x
    _v1("vllm:gpu_prefix_cache_queries_total", C, "0.7.3", "0.11.2", key="prefix_cache_queries_total", rank=1),
    _v1("vllm:gpu_prefix_cache_hits_total", C, "0.7.3", "0.11.2", key="prefix_cache_hits_total", rank=1),
    _v1("vllm:external_prefix_cache_queries_total", C, "0.11.1"),
    _v1("vllm:external_prefix_cache_hits_total", C, "0.11.1"),
    _v1("vllm:mm_cache_queries_total", C, "0.11.1"),
    _v1("vllm:mm_cache_hits_total", C, "0.11.1"),
    _v1("vllm:spec_decode_num_drafts_total", C, "0.8.5", key="spec_decode_num_drafts_total"),
    _v1("vllm:spec_decode_num_draft_tokens_total", C, "0.8.3", key="spec_decode_num_draft_tokens_total"),
    _v1("vllm:spec_decode_num_accepted_tokens_total", C, "0.8.3", key="spec_decode_num_accepted_tokens_total"),
    _v1("vllm:spec_decode_num_accepted_tokens_per_pos_total", C, "0.8.5", key="spec_accepted_per_pos"),
    _v1("vllm:diffusion_num_denoising_steps_total", C, "0.24.0"),
    _v1("vllm:diffusion_num_canvas_positions_total", C, "0.24.0"),
    _v1("vllm:diffusion_num_committed_tokens_total", C, "0.24.0"),
    _v1("vllm:estimated_flops_per_gpu_total", C, "0.17.0"),
    _v1("vllm:estimated_read_bytes_per_gpu_total", C, "0.17.0"),
    _v1("vllm:estimated_write_bytes_per_gpu_total", C, "0.17.0"),
    _v1("vllm:time_to_first_token_seconds", H, "0.7.1", key="ttft_seconds"),
    _v1("vllm:inter_token_latency_seconds", H, "0.10.2", key="itl_seconds", always=True),
    # same samples as inter_token_latency; DEPRECATED 0.10.2-0.11.2, hidden 0.12-0.14, gone 0.15
    _v1("vllm:time_per_output_token_seconds", H, "0.7.1", "0.14.1", key="itl_seconds", rank=1),
    _v1("vllm:request_time_per_output_token_seconds", H, "0.11.0", key="tpot_seconds", always=True),
    _v1("vllm:e2e_request_latency_seconds", H, "0.7.3", key="e2e_seconds", always=True),
    _v1("vllm:request_queue_time_seconds", H, "0.7.3", key="queue_time_seconds", always=True),
    _v1("vllm:request_prefill_time_seconds", H, "0.7.3", key="prefill_time_seconds"),
    _v1("vllm:request_decode_time_seconds", H, "0.7.3", key="decode_time_seconds"),
    _v1("vllm:request_inference_time_seconds", H, "0.7.3", key="inference_time_seconds"),
    _v1("vllm:request_prompt_tokens", H, "0.7.1", key="prompt_tokens"),
    _v1("vllm:request_generation_tokens", H, "0.7.1", key="generation_tokens"),
    _v1("vllm:iteration_tokens_total", H, "0.7.3", key="iteration_tokens", always=True),
    _v1("vllm:request_params_max_tokens", H, "0.8.0", key="max_tokens_param", always=True),
    _v1("vllm:request_max_num_generation_tokens", H, "0.8.0", always=True),
    _v1("vllm:request_params_n", H, "0.8.0", always=True),
    _v1("vllm:request_prefill_kv_computed_tokens", H, "0.13.0"),
    _v1("vllm:request_num_preemptions", H, "0.30.0"),
    _v1("vllm:kv_block_lifetime_seconds", H, "0.12.0"),
    _v1("vllm:kv_block_idle_before_evict_seconds", H, "0.12.0"),
    _v1("vllm:kv_block_reuse_gap_seconds", H, "0.12.0"),
)

# V0 engine (`vllm/engine/metrics.py`); the OpenAI server ran it by default up to 0.7.x and as a
# fallback up to 0.10.x. Hidden names (0.8.3-0.9.0.1) need --show-hidden-metrics-for-version.
V0_NAMES: tuple[MetricName, ...] = (
    _v0("vllm:num_requests_running", G, "0.5.5", key="num_requests_running"),
    _v0("vllm:num_requests_waiting", G, "0.5.5", key="num_requests_waiting"),
    _v0("vllm:num_requests_swapped", G, "0.5.5", "0.9.0.1", key="num_requests_swapped"),
    _v0("vllm:gpu_cache_usage_perc", G, "0.5.5", key="kv_cache_usage"),
    _v0("vllm:cpu_cache_usage_perc", G, "0.5.5", "0.9.0.1"),
    _v0("vllm:gpu_prefix_cache_hit_rate", G, "0.5.5", "0.9.0.1", key="prefix_cache_hit_rate"),
    _v0("vllm:cpu_prefix_cache_hit_rate", G, "0.5.5", "0.9.0.1"),
    _v0("vllm:avg_prompt_throughput_toks_per_s", G, "0.5.5", "0.6.6"),
    _v0("vllm:avg_generation_throughput_toks_per_s", G, "0.5.5", "0.6.6"),
    _v0("vllm:cache_config_info", G, "0.5.5"),
    _v0("vllm:lora_requests_info", G, "0.6.4"),
    _v0("vllm:spec_decode_draft_acceptance_rate", G, "0.5.5", "0.9.2"),
    _v0("vllm:spec_decode_efficiency", G, "0.5.5", "0.9.2"),
    _v0("vllm:num_preemptions_total", C, "0.5.5", key="num_preemptions_total"),
    _v0("vllm:prompt_tokens_total", C, "0.5.5", key="prompt_tokens_total"),
    _v0("vllm:generation_tokens_total", C, "0.5.5", key="generation_tokens_total"),
    _v0("vllm:tokens_total", C, "0.6.4", "0.7.3"),
    _v0("vllm:request_success_total", C, "0.5.5", key="request_success_total"),
    _v0("vllm:spec_decode_num_accepted_tokens_total", C, "0.5.5", "0.9.2",
        key="spec_decode_num_accepted_tokens_total"),
    _v0("vllm:spec_decode_num_draft_tokens_total", C, "0.5.5", "0.9.2",
        key="spec_decode_num_draft_tokens_total"),
    _v0("vllm:spec_decode_num_emitted_tokens_total", C, "0.5.5", "0.9.2"),
    _v0("vllm:time_to_first_token_seconds", H, "0.5.5", key="ttft_seconds"),
    _v0("vllm:inter_token_latency_seconds", H, "0.10.2", key="itl_seconds"),
    _v0("vllm:time_per_output_token_seconds", H, "0.5.5", key="itl_seconds", rank=1),
    _v0("vllm:e2e_request_latency_seconds", H, "0.5.5", key="e2e_seconds"),
    _v0("vllm:request_queue_time_seconds", H, "0.6.4", key="queue_time_seconds"),
    _v0("vllm:time_in_queue_requests", H, "0.6.4", "0.9.0.1", key="queue_time_seconds", rank=1),
    _v0("vllm:request_prefill_time_seconds", H, "0.6.4", key="prefill_time_seconds"),
    _v0("vllm:request_decode_time_seconds", H, "0.6.4", key="decode_time_seconds"),
    _v0("vllm:request_inference_time_seconds", H, "0.6.4", key="inference_time_seconds"),
    _v0("vllm:request_prompt_tokens", H, "0.5.5", key="prompt_tokens"),
    _v0("vllm:request_generation_tokens", H, "0.5.5", key="generation_tokens"),
    _v0("vllm:iteration_tokens_total", H, "0.6.4", key="iteration_tokens"),
    _v0("vllm:request_params_max_tokens", H, "0.6.4", key="max_tokens_param"),
    _v0("vllm:request_max_num_generation_tokens", H, "0.6.4"),
    _v0("vllm:request_params_n", H, "0.5.5"),
    _v0("vllm:request_params_best_of", H, "0.5.5", "0.6.2"),
    _v0("vllm:model_forward_time_milliseconds", H, "0.6.4", "0.9.0.1"),
    _v0("vllm:model_execute_time_milliseconds", H, "0.6.4", "0.9.0.1"),
)

BY_ERA: dict[str, dict[str, MetricName]] = {
    V1: {m.exposed: m for m in V1_NAMES},
    V0: {m.exposed: m for m in V0_NAMES},
}

# Names only one engine ever declared: their presence tells the era (§3.1).
V0_ONLY = frozenset(BY_ERA[V0]) - frozenset(BY_ERA[V1])
# HELP of vllm:num_requests_running (§3.1).
V1_RUNNING_HELP = "Number of requests in model execution batches."
V0_RUNNING_HELP = "Number of requests currently running on GPU."

# `cache_config_info` labels by version (§2.9): (first, last) released versions carrying it.
# The label set is complete on every scrape, so a missing label that was never removed bounds
# the version from above too.
CACHE_CONFIG_LABELS: dict[str, tuple[str, str | None]] = {
    "is_attention_free": ("0.6.3", None),
    "calculate_kv_scales": ("0.7.0", "0.27.0"),
    "prefix_caching_hash_algo": ("0.8.3", None),
    "swap_space": ("0.8.5", "0.17.1"),
    "cpu_kvcache_space_bytes": ("0.9.2", "0.19.1"),
    "mamba_page_size_padded": ("0.10.0", None),
    "mamba_cache_dtype": ("0.10.1", None),
    "kv_sharing_fast_prefill": ("0.10.1", None),
    "kv_cache_memory_bytes": ("0.10.2", None),
    "swap_space_bytes": ("0.5.5", "0.11.0"),
    "kv_offloading_backend": ("0.11.1", None),
    "mamba_cache_mode": ("0.15.0", None),
    "user_specified_block_size": ("0.18.0", None),
    "kv_cache_size_tokens": ("0.24.0", None),
    "kv_cache_max_concurrency": ("0.24.0", None),
    "skip_page_size_padded": ("0.25.0", None),
    "kv_cache_layout": ("0.29.0", None),
    "effective_attention_block_size": ("0.31.0", None),
    "cache_hit_alignment_tokens": ("0.32.0", None),
    "simple_cpu_offload_num_blocks": ("0.33.0", None),
}

# The production-stack router re-exports vllm:-prefixed metrics with a `server` label (§6.2;
# production-stack `src/vllm_router/services/metrics_service/__init__.py`); these names exist
# only there. Listed as exposed (counters with _total) and as family names without it, because a
# freshly started router shows only HELP/TYPE lines (labelled metrics without children).
ROUTER_ONLY = frozenset((
    "vllm:current_qps", "vllm:avg_decoding_length", "vllm:num_prefill_requests",
    "vllm:num_decoding_requests", "vllm:healthy_pods_total", "vllm:avg_latency", "vllm:avg_itl",
    "vllm:num_incoming_requests_total", "vllm:num_incoming_requests",
    "vllm:routing_decisions_total", "vllm:routing_decisions",
    "vllm:input_tokens_total", "vllm:input_tokens", "vllm:output_tokens_total", "vllm:output_tokens",
    "vllm:request_errors_total", "vllm:request_errors", "vllm:request_latency_seconds",
))
ROUTER_LABEL = "server"


def version_tuple(v: str) -> Version:
    got = read_version(v)
    if got is None:
        raise ValueError(f"not a vLLM version: {v!r}")
    return got


@dataclass(frozen=True, slots=True)
class VersionRange:
    """What the scrape proves about the vLLM version: low <= v, and v <= high (or v < high)."""

    low: str | None = None
    high: str | None = None
    high_exclusive: bool = False

    def __str__(self) -> str:
        parts = []
        if self.low:
            parts.append(f">={self.low}")
        if self.high:
            parts.append(f"{'<' if self.high_exclusive else '<='}{self.high}")
        return ",".join(parts)

    def contains(self, version: str) -> bool:
        v = version_tuple(version)
        if self.low and v < version_tuple(self.low):
            return False
        if self.high:
            h = version_tuple(self.high)
            return v < h if self.high_exclusive else v <= h
        return True


@lru_cache(maxsize=512)
def guess_version(names: frozenset[str], era: str,
                  cache_labels: frozenset[str] | None,
                  complete: bool) -> VersionRange:
    """Bound the version from the names present (and, for a complete V1 scrape, the always-on
    names absent) and from the `cache_config_info` label set."""
    low: Version | tuple[()] = ()
    high: Version | None = None
    high_excl = False

    def lower(v: str) -> None:
        nonlocal low
        low = max(low, version_tuple(v))

    def upper(v: str, exclusive: bool) -> None:
        nonlocal high, high_excl
        t = version_tuple(v)
        if high is None or t < high or (t == high and exclusive and not high_excl):
            high, high_excl = t, exclusive

    table = BY_ERA[era]
    for name in names:
        m = table.get(name)
        if m is None:
            continue
        lower(m.first)
        if m.last:
            upper(m.last, False)
    if era == V1 and complete:
        for m in V1_NAMES:
            if m.always and m.exposed not in names:
                upper(m.first, True)
    if cache_labels:
        for label, (first, last) in CACHE_CONFIG_LABELS.items():
            if label in cache_labels:
                lower(first)
                if last:
                    upper(last, False)
            elif last is None:  # absent and never removed: older than its introduction
                upper(first, True)
    if era == V1:
        lower("0.7.1")
    if high is not None and low and (high < low or (high == low and high_excl)):
        return VersionRange()  # contradictory evidence (a patched build?): claim nothing
    return VersionRange(format_version(low) if low else None,
                        format_version(high) if high is not None else None, high_excl)
