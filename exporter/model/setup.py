"""One vLLM deployment as the model sees it: architecture, GPU, parallelism and engine flags.

Why: every prediction (KV capacity, step time, the optimiser) is a function of the same dozen
engine settings, and vLLM fills the ones a user leaves out with defaults that changed across
releases. `Setup.build` applies those defaults for the chosen version once, so the rest of the
model reads plain resolved values.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from exporter.errors import InputError
from exporter.parse.version import Version, format_version, read_version
from exporter.model.architectures import (DTYPE_BYTES, ModelArch, normalize_quantization,
                                          resolve_model)
from exporter.model.gpus import GPU, resolve_gpu
from exporter.model import drafter
from exporter.model.drafter import Speculative

# Version milestones (vLLM releases) that change capacity accounting. Sources:
# ../shared/reference/perf-model.md section 1.1 "Version history".
V1_DEFAULT = (0, 8, 0)          # V1 engine on by default; before: V0, logs "# GPU blocks"
# ... except on NVIDIA GPUs below compute capability 8.0 (Volta, Turing), where `_is_v1_supported_oracle`
# fell back to V0 ("Compute Capability < 8.0") until V1 ran there on FlexAttention (vllm PR #23614,
# merged Aug 26 2025, first in 0.10.2)
V1_BEFORE_AMPERE = (0, 10, 2)
# V0's chunked prefill by itself for max_model_len > 32k (arg_utils.py, read in the 0.5.0-0.8.5
# wheels): from 0.5.3; not with prefix caching until 0.6.1; not for multimodal models from 0.6.2;
# not for MLA models from 0.8.0
V0_LONG_CONTEXT_CHUNKED = (0, 5, 3)
V0_LONG_CHUNKED_WITH_PREFIX_CACHING = (0, 6, 1)
V0_LONG_CHUNKED_NOT_MULTIMODAL = (0, 6, 2)
V0_LONG_CHUNKED_NOT_MLA = (0, 8, 0)
# V0's token budget when chunked prefill is on and none is given (SchedulerConfig in vllm/config.py,
# read in the 0.6.3.post1, 0.6.4.post1, 0.6.5, 0.6.6 and 0.7.3 wheels): 512 through 0.6.4.post1,
# 2048 from 0.6.5 ("a balance between ITL and TTFT")
V0_CHUNKED_BUDGET_2048 = (0, 6, 5)
BATCH_DEFAULTS_BY_GPU = (0, 9, 0)  # get_batch_defaults: 8192/1024 on >=70 GiB non-A100 GPUs (vllm PR #17885, May 2025)
SMALL_SAMPLER = (0, 17, 0)      # profiled activation cut ~60% (llm-d-planner PR #205 blog)
# V1's dummy sampler ran FlashInfer's top-k/top-p kernel (no sort of the vocabulary) where FlashInfer
# was installed (vLLM's images) from the release that adapted to FlashInfer 0.2.3's sampler API
# (vllm PR #15777; 0.9.x logs still print "disabled because FlashInfer>=v0.2.3", 0.10.1.1 and 0.11.0
# print "Using FlashInfer for top-p & top-k sampling") until it was disabled by default (vllm PR
# #26859, Oct 15 2025, first in 0.11.1): its profiled peak is the small sampler's
FLASHINFER_SAMPLER = ((0, 10, 1), (0, 11, 1))
# VLLM_USE_FLASHINFER_SAMPLER decides it where FlashInfer is installed, as vLLM reads it (unset: the
# window above; 0: the PyTorch sort, as a `pip install vllm` without the `flashinfer` extra of
# 0.10.1 / 0.11.0 runs: "FlashInfer is not available", public L4 and RTX 3090 logs at 0.11.0; 1: on,
# from the release that took FlashInfer 0.2.3's API, whose sampler a 0.9.0.1 image ran)
FLASHINFER_SAMPLER_API = (0, 9, 0)
UTIL_092 = (0, 20, 0)           # default gpu_memory_utilization 0.9 -> 0.92 (vllm PR #38284; config/cache.py of 0.20.0)
KV_FROM_CHECKPOINT = (0, 13, 0)  # `--kv-cache-dtype auto` follows the checkpoint's KV scheme (vllm PR #29980, merged Dec 2025) [release inferred from the merge date]
# the CUDA-graph memory estimate subtracted from the pool: measured from 0.18.0 but applied only under
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default from 0.20.0 (envs.py; vllm PR #41099)
CUDAGRAPH_ESTIMATE = (0, 20, 0)
KV_CACHE_MEMORY_BYTES = (0, 10, 2)  # --kv-cache-memory-bytes (vllm PR #21489): absent from 0.10.1's cache_config_info (sim/eras.py)
# Nemotron-H keeps its Mamba temporal state in the config's `mamba_ssm_cache_dtype` (before: the
# model dtype; vllm PR #29978, NemotronHForCausalLMConfig from 0.13.0), float16 when the config
# names none, float32 from 0.20.0 (vllm PR #39032; models/config.py of each release)
NEMOTRON_SSM_FROM_CONFIG = (0, 13, 0)
NEMOTRON_SSM_FLOAT32 = (0, 20, 0)
# prefix caching on by default for hybrid (Mamba / linear-attention) models, with Mamba cache mode
# 'align' (vllm PR #50991, merged Aug 2026; in 0.28.0 per vllm-metal PR #651's support matrix)
HYBRID_PREFIX_CACHING = (0, 28, 0)
# in 'align' mode a Mamba2 mixer keeps one more block per request, a prefill checkpoint
# (mamba_mixer2.py get_kv_cache_spec: num_prefill_checkpoint_blocks=1; vllm PR #57329): first in
# 0.32.0 (the field exists from 0.29.0, set by no Mamba2 mixer before 0.32.0)
MAMBA2_PREFILL_CHECKPOINT = (0, 32, 0)
# a LongRoPE model's default max_model_len is its original_max_position_embeddings (4096 for
# Phi-3/3.5/4-mini 128k) instead of max_position_embeddings: vllm PR #27431, merged 2025-10-23,
# in _get_and_verify_max_len ("to avoid performance degradation for shorter sequences") [release
# inferred from the merge date: 0.11.0 was cut before it]
LONGROPE_SHORT_DEFAULT = (0, 11, 1)
# "GPU KV cache size" = max_concurrency x max_model_len (vllm PR #40694; _report_kv_cache_config
# of 0.20.1; 0.20.0 still logs num_blocks // groups x block_size)
TOKENS_FROM_CONCURRENCY = (0, 20, 1)
# Under data parallelism a MoE layer's experts see every DP rank's tokens (the naive dispatch's
# multicast before 0.11, all-gather from it; fused_moe/layer.py `do_naive_dispatch_combine`,
# all2all_utils / prepare_finalize), so the profile run's MoE workspace is sized for dp x
# max_num_batched_tokens tokens, cut at VLLM_FUSED_MOE_CHUNK_SIZE: 32768 until 0.11 (fused_moe.py
# `M = min(num_tokens, CHUNK_SIZE)`), 16384 from 0.12, where the DP+EP profile run allocates that
# worst case whatever the tokens (modular_kernel.py "Force worst-case allocation in profiling run");
# from 0.18 the workspace is the tokens that arrive, uncut. Read in the 0.10.1, 0.11.0, 0.12.0-0.17.0
# and 0.19.0 wheels. A row of vllm-project/recipes PR #12 (Qwen3-Coder-480B-FP8, dp 8 + EP) is the check.
MOE_CHUNK_32K_UNTIL = (0, 12, 0)
MOE_CHUNK_16K_UNTIL = (0, 18, 0)
# From 0.14.0 get_kv_cache_configs checked that one max_model_len request fits against the KV groups
# of the whole model (every worker's layers merged) and the least memory any worker has (vllm PR
# #29431): under pipeline parallelism a stage holding 1/pp of the layers was asked to hold all of
# them, and vLLM refused ("To serve at least one request with the models's max seq len ...") a
# length its stages held (vllm issue #32105). 0.17.0 checks each worker's own layers (vllm PR #33698);
# read in the 0.13.0, 0.14.0, 0.16.0 and 0.17.0 wheels.
PP_WHOLE_MODEL_CHECK = ((0, 14, 0), (0, 17, 0))
# the scheduler runs one step ahead of the GPU by default (async scheduling: config/scheduler.py's
# `async_scheduling` None, resolved on in config/vllm.py, from 0.14.0; the CPU platform turns it
# off); from 0.26.0 a sliding-window or chunked-local request is sized at startup for the tokens
# of every batch in flight, not one (`max_in_flight_tokens` = max_concurrent_batches x
# max_num_batched_tokens in SlidingWindowSpec / ChunkedLocalAttentionSpec; vllm PR #47728)
ASYNC_SCHEDULING_DEFAULT = (0, 14, 0)
IN_FLIGHT_WINDOWS = (0, 26, 0)
# the V2 model runner, default from 0.26.0 for generate models that are neither MoE nor hybrid,
# keeps pp + 1 batches in flight under async scheduling (the V1 runner pp)
V2_RUNNER_DEFAULT = (0, 26, 0)
# the attention block raised to cover a recurrent-state page is a multiple of the kernel block
# alignment: 16 (FlashAttention's multiple) before 0.20.0, 32 on Blackwell (10.x) for heads of 256
# before 0.18.0 (FlashInfer; model_executor/models/config.py of 0.13-0.19); from 0.20.0 the
# backend's smallest kernel block or the configured block size, whichever is larger
# (platforms/interface.py: 128 on the CPU backend, 16 on a GPU at the default block size)
STATE_ALIGN_TO_BLOCK = (0, 20, 0)
BLACKWELL_HD256_ALIGN_UNTIL = (0, 18, 0)
DEFAULT_VLLM_VERSION: Version = (0, 19, 0)  # the release the calculator is calibrated on
# V0's accounting of memory outside the model's tensors, read in the 0.2.4-0.7.2 wheels
# (vllm/worker/worker.py): 0.2.5-0.3.0 and 0.6.4/0.6.4.post1 charged everything on the device
# after the profile run ("Check for any memory left around that may have been allocated on the gpu
# outside of `torch`"): the CUDA context, NCCL's init buffers, other processes; 0.3.1-0.6.3 charged
# the free memory the profile run took since the worker started (after the context, before NCCL:
# NCCL and torch's reserved cache count, the context does not); 0.2.4 only torch's allocated peak;
# from 0.6.5 `memory_profiling` counts the non-torch growth since a baseline. The calculator charges a
# context's worth below 0.6.4, which the free-memory releases spend on torch's reserved slack (three
# TP1 startups of an RTX A6000 at 0.4.1-0.4.2 sit within 0.8 % with it), and sizes 0.6.4.x as profiled:
# its RTX 3090 startups print 0.35 GiB of non-torch memory but an activation peak ~0.2 GiB below the
# model's, and land within 3 % that way [a known gap: each term is off, the sum is not].
DEVICE_WIDE_NON_TORCH_BEFORE = (0, 6, 4)
# the first release whose V0 worker charges `memory_profiling`'s non-torch growth since a baseline
V0_MEMORY_PROFILING = (0, 6, 5)
# The V1 worker did the same until it reused V0's `memory_profiling` (vllm PR #19312, first in
# 0.9.1; read in the 0.9.0 and 0.9.1 wheels): 0.8.0-0.9.0's determine_available_memory in
# vllm/v1/worker/gpu_worker.py adds "mem_get_info used - torch allocated" after the profile run to
# torch's peak. From 0.9.1 the baseline is a MemorySnapshot taken once the CUDA context exists,
# before the distributed init (so NCCL's init buffers still count, the context does not).
V1_DEVICE_WIDE_NON_TORCH_BEFORE = (0, 9, 1)
# With that snapshot the V1 worker refuses to start when the device's free memory is under
# gpu_memory_utilization x total ("Free memory on device (F/T GiB) on startup is less than desired
# GPU memory utilization (U, R GiB). Decrease GPU memory utilization or reduce GPU memory used by
# other processes.", gpu_worker.py init_device; read in the 0.9.1, 0.10.x, 0.11.0 and 0.15.0
# wheels, absent from 0.9.0's); the snapshot follows NCCL's initialisation from 0.11.0 (before it
# through 0.10.2), so a TP rank's NCCL buffers are no longer free by then
V1_FREE_MEMORY_CHECK = V1_DEVICE_WIDE_NON_TORCH_BEFORE
V1_SNAPSHOT_AFTER_NCCL = (0, 11, 0)

_DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
           "fp16": "float16", "half": "float16", "float32": "float32", "fp32": "float32",
           "float": "float32"}
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")   # vLLM's MambaDType (bfloat16 from 0.22.0)
_KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8",
              "fp8_ds_mla": "fp8_ds_mla", "bfloat16": "bfloat16", "float16": "float16"}


def nvidia_capability(dev: GPU) -> int | None:
    """An NVIDIA device's compute capability as vLLM compares it (8.6 -> 86); None for other
    vendors and rows that do not give it."""
    if dev.vendor != "nvidia" or not dev.compute_capability:
        return None
    try:
        major, minor = (int(x) for x in dev.compute_capability.split(".")[:2])
    except ValueError:
        return None
    return major * 10 + minor


def runs_v0(version: Version, dev: GPU, spec: Speculative | None = None, use_v1: bool | None = None) -> bool:
    """Whether the deployment runs the V0 engine: the release's choice on this device (and for a
    separate draft model, drafter.runs_on_v0), or VLLM_USE_V1=0 where V0 still ships (`Setup.build`
    refuses it from 0.11, as vLLM does)."""
    if use_v1 is False:
        return True
    return engine_is_v0(version, dev) or drafter.runs_on_v0(spec, version)


def engine_is_v0(version: Version, dev: GPU) -> bool:
    """Whether vLLM `version` runs the V0 engine on `dev`: every release before V1_DEFAULT, and on
    NVIDIA GPUs below compute capability 8.0 those before V1_BEFORE_AMPERE (V1 fell back to V0)."""
    if version < V1_DEFAULT:
        return True
    cc = nvidia_capability(dev)
    return version < V1_BEFORE_AMPERE and cc is not None and cc < 80


def parse_version(text: str | tuple | None) -> Version:
    """'0.19.0', 'v0.11.2', '0.6.4.post1' -> (0, 19, 0); None -> the default. A build from the main
    branch ('nightly', 'nightly-<commit>', 'main', 'latest', as images and benchmark tables name
    them) has no release number: it follows the newest release modelled, the default."""
    if text is None or text == "":
        return DEFAULT_VLLM_VERSION
    if isinstance(text, str) and text.strip().lower().split("-")[0] in ("nightly", "main", "latest"):
        return DEFAULT_VLLM_VERSION
    version = read_version(text)
    if version is None:
        raise InputError(f"--vllm-version: cannot read {text!r} (expected X.Y.Z)")
    return version


@dataclass(frozen=True)
class Setup:
    """A resolved deployment: every field has its effective value (no 'auto' except kv dtype)."""

    model: ModelArch
    gpu: GPU
    tp: int
    pp: int
    dtype: str                       # activation/weight dtype: bfloat16 | float16 | float32
    quantization: str | None         # weight quantization scheme, None for native dtype
    kv_cache_dtype: str              # "auto" (= dtype) | "fp8" | ...
    gpu_memory_utilization: float
    gpu_memory_gib: float            # effective total memory per GPU
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    vllm_version: Version
    enable_chunked_prefill: bool = True
    dp: int = 1                      # data-parallel engines (--data-parallel-size)
    expert_parallel: bool = False    # --enable-expert-parallel: whole experts per rank
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes: the pool per GPU, as given
    num_gpu_blocks_override: int | None = None  # --num-gpu-blocks-override: the pool in blocks, as given
    enforce_eager: bool = False      # --enforce-eager: no CUDA graphs (no graph pool; kernels launched one by one)
    # --enable-prefix-caching, as resolved: V1's default, except hybrid models before 0.28
    enable_prefix_caching: bool = True
    # --[no-]async-scheduling, as resolved: the release's default on a GPU
    async_scheduling: bool = False
    # --mamba-cache-dtype / --mamba-ssm-cache-dtype: the recurrent state's conv and temporal
    # dtypes ("auto": the model dtype, and for the temporal state what the model's config hook
    # names, Nemotron-H's and Qwen3.5's; see state_bytes)
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    # multimodal models (vision.py): --limit-mm-per-prompt as (modality, count) pairs (() is
    # vLLM's default), --skip-mm-profiling, and the image processor's max_pixels
    # (--mm-processor-kwargs) where the tower resizes by it (Qwen-VL)
    mm_limits: tuple[tuple[str, int], ...] = ()
    skip_mm_profiling: bool = False
    mm_max_pixels: int | None = None
    # VLLM_USE_FLASHINFER_SAMPLER as the server's environment sets it (None: unset, the release's
    # default where FlashInfer is installed, FLASHINFER_SAMPLER)
    flashinfer_sampler: bool | None = None
    # --speculative-config: the drafter whose weights and KV pages the pool pays for (drafter.py);
    # None without speculative decoding
    speculative: Speculative | None = None
    # --cpu-offload-gb: GiB of each rank's decoder-layer weights held in pinned host memory and
    # read through UVA every step (kv_cache.offloaded_bytes)
    cpu_offload_gb: float = 0.0
    # GiB other processes already hold on each GPU when the server starts (a desktop, another
    # server sharing the device): kv_cache.startup_refusal and non_torch_bytes
    gpu_memory_in_use_gib: float = 0.0
    # --enable-lora: the adapters the engine holds at once (--max-loras; 0 without LoRA), their
    # largest rank (--max-lora-rank) and --fully-sharded-loras: vLLM preallocates a stacked A and
    # B buffer of every linear layer for them (kv_cache.lora_bytes)
    max_loras: int = 0
    max_lora_rank: int = 16
    fully_sharded_loras: bool = False
    # VLLM_USE_V1 as the server's environment sets it (None: unset, the release's engine); 0
    # runs V0 on 0.8-0.10, where V1 is the default (fine-tuning stacks set it: Unsloth's loader)
    use_v1: bool | None = None

    @property
    def flashinfer_sampling(self) -> bool:
        """Whether V1's dummy sampler runs FlashInfer's top-k/top-p kernel (no sort of the
        vocabulary: the small sampler's peak). Only on CUDA: ROCm and the other platforms sample
        natively (`TopKTopPSampler.__init__`: `current_platform.is_cuda()` before any FlashInfer)."""
        if self.v0 or self.gpu.vendor != "nvidia":
            return False
        if self.flashinfer_sampler is None:
            return FLASHINFER_SAMPLER[0] <= self.vllm_version < FLASHINFER_SAMPLER[1]
        return self.flashinfer_sampler and self.vllm_version >= FLASHINFER_SAMPLER_API

    @property
    def moe_ranks(self) -> int:
        """GPUs one MoE layer's experts are spread over: vLLM flattens TP across DP for the
        fused-MoE layer (`FusedMoEParallelConfig.make`: tp_size = dp x tp), with or without EP."""
        return self.tp * self.dp

    @property
    def v0(self) -> bool:
        return runs_v0(self.vllm_version, self.gpu, self.speculative, self.use_v1)

    @property
    def num_gpus(self) -> int:
        """GPUs of one engine (one data-parallel rank)."""
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def kv_dtype_bytes(self) -> int:
        if self.kv_cache_dtype == "auto":
            return DTYPE_BYTES[self.dtype]
        return DTYPE_BYTES.get(self.kv_cache_dtype, 1)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def state_bytes(self) -> int:
        """One request's recurrent state in one Mamba / linear-attention layer on one rank, in
        the dtypes this release and `--dtype` give it (0 without such layers)."""
        st = self.model.state
        if st is None:
            return 0
        # vLLM's _mamba_state_dtype: the conv state in mamba_cache_dtype (auto: the model's), the
        # temporal state in mamba_ssm_cache_dtype, which a model's config hook fills in when it
        # is auto (Nemotron-H, Qwen3.5), else the conv state's
        conv = self.dtype_bytes if self.mamba_cache_dtype == "auto" else DTYPE_BYTES[self.mamba_cache_dtype]
        temporal = conv
        if self.mamba_ssm_cache_dtype != "auto":
            temporal = DTYPE_BYTES[self.mamba_ssm_cache_dtype]
        elif st.ssm_dtype_from_config and self.vllm_version >= NEMOTRON_SSM_FROM_CONFIG:
            name = st.ssm_dtype_from_config if isinstance(st.ssm_dtype_from_config, str) else (
                "float32" if self.vllm_version >= NEMOTRON_SSM_FLOAT32 else "float16")
            temporal = DTYPE_BYTES.get(name, 4)
        return st.bytes_per_rank(self.tp, conv_bytes=conv, temporal_bytes=temporal)

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled that a sliding-window or chunked-local request is
        sized for at startup (`VllmConfig.max_in_flight_tokens`): one batch before 0.26.0; from
        it, a batch per step in flight: 2 under async scheduling at PP 1, else the pipeline's PP
        batches (PP + 1 with the V2 runner under async scheduling)."""
        if self.vllm_version < IN_FLIGHT_WINDOWS:
            return self.max_num_batched_tokens
        if self.pp == 1:
            batches = 2 if self.async_scheduling else 1
        else:
            v2 = not self.model.is_moe and self.model.state is None and self.vllm_version >= V2_RUNNER_DEFAULT
            batches = self.pp + (1 if v2 and self.async_scheduling else 0)
        return batches * self.max_num_batched_tokens

    @property
    def cudagraph_estimate_subtracted(self) -> bool:
        return self.vllm_version >= CUDAGRAPH_ESTIMATE

    def with_(self, **changes) -> "Setup":
        """A copy with some fields changed (e.g. the optimiser trying another max_num_seqs)."""
        return replace(self, **changes)

    def rebuilt(self, model: ModelArch | None = None, **changes) -> "Setup":
        """This deployment built again with some flags changed, every other flag kept: for a
        change that alters what vLLM derives (TP, KV dtype, quantization), where `with_` would
        keep stale derived values."""
        flags = dict(tp=self.tp, pp=self.pp, dtype=self.dtype, quantization=self.quantization,
                     kv_cache_dtype=self.kv_cache_dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                     gpu_memory_gib=self.gpu_memory_gib, max_model_len=self.max_model_len,
                     max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                     block_size=self.block_size, vllm_version=self.vllm_version, dp=self.dp,
                     expert_parallel=self.expert_parallel, kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                     num_gpu_blocks_override=self.num_gpu_blocks_override, enforce_eager=self.enforce_eager,
                     enable_chunked_prefill=self.enable_chunked_prefill,
                     enable_prefix_caching=self.enable_prefix_caching,
                     async_scheduling=self.async_scheduling, mamba_cache_dtype=self.mamba_cache_dtype,
                     mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype, mm_limits=self.mm_limits,
                     skip_mm_profiling=self.skip_mm_profiling, mm_max_pixels=self.mm_max_pixels,
                     flashinfer_sampler=self.flashinfer_sampler, speculative_config=self.speculative,
                     cpu_offload_gb=self.cpu_offload_gb, gpu_memory_in_use_gib=self.gpu_memory_in_use_gib,
                     max_loras=self.max_loras,
                     max_lora_rank=self.max_lora_rank, fully_sharded_loras=self.fully_sharded_loras,
                     use_v1=self.use_v1)
        return Setup.build(model or self.model, self.gpu, **{**flags, **changes})

    @classmethod
    def build(cls, model: str | ModelArch, gpu: str | GPU, *, tp: int = 1, pp: int = 1,
              dtype: str = "auto", quantization: str | None = None, kv_cache_dtype: str | None = "auto",
              gpu_memory_utilization: float | None = None, gpu_memory_gib: float | None = None,
              max_model_len: int | None = None, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None, block_size: int | None = None,
              vllm_version: str | tuple | None = None, dp: int = 1,
              expert_parallel: bool = False, kv_cache_memory_bytes: int | None = None,
              num_gpu_blocks_override: int | None = None, enforce_eager: bool = False,
              enable_chunked_prefill: bool | None = None,
              enable_prefix_caching: bool | None = None,
              async_scheduling: bool | None = None, mamba_cache_dtype: str | None = None,
              mamba_ssm_cache_dtype: str | None = None,
              mm_limits: Mapping[str, int] | tuple[tuple[str, int], ...] | None = None,
              skip_mm_profiling: bool = False, mm_max_pixels: int | None = None,
              flashinfer_sampler: bool | None = None,
              speculative_config: "str | Mapping | Speculative | None" = None,
              cpu_offload_gb: float | None = None, gpu_memory_in_use_gib: float | None = None,
              max_loras: int | None = None,
              max_lora_rank: int | None = None, fully_sharded_loras: bool = False,
              use_v1: bool | None = None) -> "Setup":
        """Resolve names and fill in vLLM's defaults of the given version. `kv_cache_dtype=None`
        (calc without `--kv-cache-dtype`): the cache such a deployment is run with
        (`deployed_kv_dtype`); "auto": vLLM's own resolution of `--kv-cache-dtype auto`."""
        arch = resolve_model(model) if isinstance(model, str) else model
        dev = resolve_gpu(gpu) if isinstance(gpu, str) else gpu
        version = parse_version(vllm_version)
        if tp < 1 or pp < 1 or dp < 1:
            raise InputError(f"--tp/--pp/--data-parallel must be >= 1 (got tp={tp}, pp={pp}, dp={dp})")
        if pp > arch.num_layers:
            raise InputError(f"--pp {pp} exceeds the model's {arch.num_layers} layers")
        refusal = tp_refusal(arch, tp)
        if refusal:
            raise InputError(refusal)
        d = _DTYPES.get((dtype or "auto").lower())
        if d is None:
            raise InputError(f"--dtype: unknown dtype {dtype!r}; one of {', '.join(sorted(_DTYPES))}")
        if d == "auto":
            d = arch.native_dtype if arch.native_dtype in ("bfloat16", "float16") else "bfloat16"
        if d == "bfloat16" and dev.bf16_tflops == 0 and dev.vendor == "nvidia":
            d = "float16"  # vLLM falls back to fp16 on GPUs without bf16 (compute capability < 8)
        kv = _KV_DTYPES.get((kv_cache_dtype or "auto").lower())
        if kv is None and kv_cache_dtype is not None:
            raise InputError(f"--kv-cache-dtype: unknown {kv_cache_dtype!r}; one of auto, fp8")
        if quantization and quantization.strip().lower() in ("compressed-tensors", "compressed_tensors"):
            quant = arch.quantization or "w8a8"  # the checkpoint's own scheme says which
        elif quantization and quantization.strip().lower().startswith("fp8"):
            quant = "fp8"
        elif quantization and quantization.strip().lower() == "fp4" and arch.quantization == "mxfp4":
            quant = "mxfp4"  # FP4 of an MXFP4 checkpoint (gpt-oss) is its own format, not NVFP4
        else:
            quant = normalize_quantization(quantization) if quantization else arch.quantization
        check_device(dev, dtype=_DTYPES.get((dtype or "auto").lower()), quantization=quant)
        if kv_cache_dtype is None:
            kv = deployed_kv_dtype(arch, quant if quantization else None)
        kv = _resolve_kv_dtype(kv, arch, version, quant)
        util = gpu_memory_utilization
        if util is None:
            util = 0.92 if version >= UTIL_092 else 0.9
        if not 0 < util <= 1:
            raise InputError(f"--gpu-memory-utilization must be in (0, 1] (got {util})")
        mem = dev.memory_gib if gpu_memory_gib is None else float(gpu_memory_gib)
        if mem <= 0:
            raise InputError(f"--gpu-memory-gib must be positive (got {mem})")
        # None, or -1 (`--max-model-len auto`, which the caller fits to the pool): the model's own
        if max_model_len is not None and max_model_len != -1 and max_model_len < 1:
            raise InputError(f"--max-model-len must be positive, or auto / -1 (got {max_model_len})")
        mml = arch.max_position_embeddings if max_model_len in (None, -1) else int(max_model_len)
        if max_model_len is None and arch.longrope_original_max_len and version >= LONGROPE_SHORT_DEFAULT:
            mml = min(mml, arch.longrope_original_max_len)
        spec = None
        if speculative_config is not None:
            spec = speculative_config if isinstance(speculative_config, Speculative) \
                else drafter.from_flag(speculative_config, resolve=_catalog_draft)
        if use_v1 is False and version >= drafter.V0_REMOVED:
            # 0.11's API server asserts envs.VLLM_USE_V1 (vllm/engine/llm_engine.py is V1's)
            raise InputError(f"VLLM_USE_V1=0: vLLM {format_version(version)} ships no V0 engine "
                             f"(removed in {format_version(drafter.V0_REMOVED)})")
        if use_v1 and version < V1_DEFAULT:
            raise InputError(f"VLLM_USE_V1=1: the V1 engine of vLLM {format_version(version)} (an alpha before "
                             f"its {format_version(V1_DEFAULT)} default) is not modelled")
        if use_v1 and runs_v0(version, dev, spec):
            # create_engine_config: "If VLLM_USE_V1=1 ... raise error for unsupported features"
            # (a device or a drafter V1 did not support yet)
            raise InputError(f"VLLM_USE_V1=1: vLLM {format_version(version)} runs this deployment on V0 only")
        v0 = runs_v0(version, dev, spec, use_v1)
        if v0:
            seqs = max_num_seqs or 256
            # V0 turned chunked prefill on by itself only for contexts > 32k, and not for models
            # with a sliding window, multimodal models or (late V0) MLA (vllm/engine/arg_utils.py
            # create_engine_config: "Chunked prefill is enabled by default for models with
            # max_model_len > 32K", guarded by `not use_sliding_window`, `is_multimodal_model`,
            # `use_mla`; each guard from its release, V0_LONG_CHUNKED_*). Without it the
            # profile run is ONE prefill of max(max_model_len, 2048) tokens, whose activations can
            # leave little for the KV cache.
            chunked = (version >= V0_LONG_CONTEXT_CHUNKED and mml > 32768 and not arch.sliding_window
                       and not (arch.extra_params and version >= V0_LONG_CHUNKED_NOT_MULTIMODAL)
                       and not (arch.attention == "mla" and version >= V0_LONG_CHUNKED_NOT_MLA)
                       and not (enable_prefix_caching and version < V0_LONG_CHUNKED_WITH_PREFIX_CACHING)
                       ) if enable_chunked_prefill is None else enable_chunked_prefill
            budget = 2048 if version >= V0_CHUNKED_BUDGET_2048 else 512
            mnbt = max_num_batched_tokens or (budget if chunked else max(mml, 2048))
        else:
            chunked = True if enable_chunked_prefill is None else enable_chunked_prefill
            # vLLM decides on the memory the device reports, so an overridden total counts
            large = (mem >= 70 and "a100" not in dev.name.lower()
                     and version >= BATCH_DEFAULTS_BY_GPU)
            seqs = max_num_seqs or (1024 if large else 256)
            default = 8192 if large else 2048
            # without chunked prefill one step must hold a whole prompt (arg_utils raises the
            # default to max_model_len)
            mnbt = max_num_batched_tokens or (default if chunked else max(mml, default))
        if max_num_batched_tokens and not max_num_seqs:
            # a server running with this budget runs at most that many sequences (vLLM refuses a
            # budget below max_num_seqs): a default above it is not what such a server has
            seqs = min(seqs, mnbt)
        if max_num_batched_tokens:
            # vLLM's scheduler config refuses these at startup (SchedulerConfig verify_max_model_len /
            # V0 _verify_args); a default max_num_batched_tokens is vLLM's to reconcile
            if mnbt < seqs:
                raise InputError(f"max_num_batched_tokens ({mnbt}) must be greater than or equal to "
                                 f"max_num_seqs ({seqs}): vLLM refuses to start")
            if not chunked and mnbt < mml:
                raise InputError(f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}) "
                                 f"without chunked prefill (vLLM {format_version(version)}): vLLM refuses "
                                 f"to start; raise --max-num-batched-tokens or lower --max-model-len")
        bs = int(block_size) if block_size else 16
        if bs < 1:
            raise InputError(f"--block-size must be positive (got {bs})")
        if kv_cache_memory_bytes is not None and kv_cache_memory_bytes < 1:
            raise InputError(f"--kv-cache-memory-bytes must be positive (got {kv_cache_memory_bytes})")
        if num_gpu_blocks_override is not None and num_gpu_blocks_override < 1:
            raise InputError(f"--num-gpu-blocks-override must be positive (got {num_gpu_blocks_override})")
        mamba = {}
        for flag, value in (("mamba_cache_dtype", mamba_cache_dtype), ("mamba_ssm_cache_dtype", mamba_ssm_cache_dtype)):
            name = str(value or "auto").strip().lower()
            if name not in MAMBA_DTYPES:
                raise InputError(f"--{flag.replace('_', '-')}: unknown {value!r}; one of {', '.join(MAMBA_DTYPES)}")
            mamba[flag] = name
        limits = tuple(sorted((str(m), int(c)) for m, c in dict(mm_limits or {}).items()))
        for modality, count in limits:
            if count < 0:
                raise InputError(f"--limit-mm-per-prompt: {modality} must be >= 0 (got {count})")
        if mm_max_pixels is not None and mm_max_pixels < 1:
            raise InputError(f"--mm-processor-kwargs: max_pixels must be positive (got {mm_max_pixels})")
        offload = float(cpu_offload_gb or 0.0)
        if offload < 0:
            raise InputError(f"--cpu-offload-gb must be >= 0 (got {cpu_offload_gb})")
        in_use = float(gpu_memory_in_use_gib or 0.0)
        if not 0 <= in_use < mem:
            raise InputError(f"--gpu-memory-in-use must be >= 0 and below the GPU's {mem:g} GiB (got {in_use:g})")
        if spec is not None:
            drafter.validate(spec, arch, tp=int(tp), pp=int(pp), v0=v0, version=version)
        loras = int(max_loras or 0)
        rank = int(max_lora_rank or 16)
        if loras < 0 or rank < 1:
            raise InputError(f"--max-loras must be >= 1 and --max-lora-rank >= 1 (got {max_loras}, {max_lora_rank})")
        return cls(model=arch, gpu=dev, tp=int(tp), pp=int(pp), dtype=d, quantization=quant,
                   kv_cache_dtype=kv, gpu_memory_utilization=float(util), gpu_memory_gib=mem,
                   max_model_len=mml, max_num_seqs=int(seqs), max_num_batched_tokens=int(mnbt),
                   block_size=bs, vllm_version=version, enable_chunked_prefill=chunked,
                   dp=int(dp), expert_parallel=bool(expert_parallel) and arch.is_moe,
                   kv_cache_memory_bytes=int(kv_cache_memory_bytes) if kv_cache_memory_bytes else None,
                   num_gpu_blocks_override=int(num_gpu_blocks_override) if num_gpu_blocks_override else None,
                   enforce_eager=bool(enforce_eager),
                   # off for an attention-free model (Mamba, Mamba2) on every release: vLLM
                   # 0.32's startup says enable_prefix_caching=False for them
                   enable_prefix_caching=(not v0 and arch.attention_layers > 0
                                          and (arch.state is None or version >= HYBRID_PREFIX_CACHING))
                   if enable_prefix_caching is None else bool(enable_prefix_caching),
                   async_scheduling=version >= ASYNC_SCHEDULING_DEFAULT
                   if async_scheduling is None else bool(async_scheduling), **mamba,
                   mm_limits=limits, skip_mm_profiling=bool(skip_mm_profiling),
                   mm_max_pixels=int(mm_max_pixels) if mm_max_pixels else None,
                   flashinfer_sampler=None if flashinfer_sampler is None else bool(flashinfer_sampler),
                   speculative=spec, cpu_offload_gb=offload, gpu_memory_in_use_gib=in_use,
                   max_loras=loras, max_lora_rank=rank,
                   fully_sharded_loras=bool(fully_sharded_loras) and loras > 0,
                   use_v1=None if use_v1 is None else bool(use_v1))


# The least NVIDIA compute capability each weight scheme's kernels run on (vLLM's
# `get_min_capability` of the quantization config): FP8 and MXFP4 through Marlin's weight-only
# kernels from Ampere (8.0), AWQ and int8 W8A8 from Turing (7.5), GPTQ from Pascal (6.0)
MIN_CAPABILITY = {"fp8": 80, "mxfp4": 80, "awq": 75, "w8a8": 75, "gptq": 60}


def check_device(dev: GPU, *, dtype: str | None, quantization: str | None) -> None:
    """Refuse what vLLM refuses on this NVIDIA device: an explicit bfloat16 below compute
    capability 8.0 (`check_if_supports_dtype`; `auto` falls back to float16 there, which
    `Setup.build` does), and a weight scheme whose kernels need a newer GPU (`verify_quantization`:
    "The quantization method fp8 is not supported for the current GPU")."""
    cc = nvidia_capability(dev)
    if cc is None:
        return
    if dtype == "bfloat16" and cc < 80:
        raise InputError(f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0; "
                         f"{dev.name} has {dev.compute_capability}: vLLM refuses --dtype bfloat16 there "
                         f"(use --dtype half)")
    need = MIN_CAPABILITY.get(quantization or "")
    if need and cc < need:
        raise InputError(f"The quantization method {quantization} is not supported for {dev.name}: minimum "
                         f"capability {need}, current capability {cc} (vLLM refuses to start)")


def tp_refusal(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM refuses this tensor-parallel size, or None: the attention heads must divide evenly
    (`ModelConfig.verify_with_parallel_config`: "Total number of attention heads (32) must be
    divisible by tensor parallel size (3)."), and so must the KV heads, or TP be a multiple of
    them, each rank then holding a replica (`QKVParallelLinear` asserts one or the other). MLA
    keeps one latent KV head, replicated on every rank. An attention-free model (Mamba) has no
    attention heads to divide."""
    if tp <= 1 or arch.num_heads <= 0 or arch.attention_layers == 0:
        return None
    if arch.num_heads % tp:
        return (f"Total number of attention heads ({arch.num_heads}) must be divisible by tensor "
                f"parallel size ({tp}): vLLM refuses to start {arch.name} at --tp {tp}")
    for kv in sorted({arch.num_kv_heads, *(s.kv_heads for s in arch.kind_shapes)}):  # every layer kind's
        if kv > 0 and (tp % kv if tp >= kv else kv % tp):
            return (f"{arch.name}'s {kv} KV heads cannot be split over tensor parallel size {tp} "
                    f"(vLLM needs one to divide the other): vLLM refuses to start it at --tp {tp}")
    return None


FP8_KV_DEPLOYED = ("fp8", "nvfp4", "mxfp4")   # weight formats deployed with an FP8 KV cache


def deployed_kv_dtype(arch: ModelArch, quantization: str | None) -> str:
    """The KV cache dtype assumed when none is given: FP8 for a deployment described as FP8 or
    FP4 weights (`--quantization`), vLLM's own `auto` otherwise.

    Such deployments are served and benchmarked with an FP8 cache: NVIDIA's ModelOpt checkpoints
    (nvidia/*-FP8, *-NVFP4) carry `kv_cache_quant_algo: FP8`, and aiconfigurator's harness passes
    `--kv-cache-dtype fp8` for every FP8, FP8-block and NVFP4 checkpoint it measures. The
    measured latency tables mostly say so: at a full pool the runs hold the concurrency of an
    FP8 cache, not a BF16 one (../shared Llama-3.1-70B FP8 TP1 H200 8192/1024 c=32: TTFT 3.1 s
    measured, 2.9 s predicted with an FP8 pool, 25.9 s with BF16; the shared table's TTFT over
    258 rows 17.4 -> 14.3 %, aiconfigurator's 820 held-out rows 34.9 -> 21.5 %). Not all: the
    shared rows of the same model on 2 x H100 saturate as a 16-bit pool would, which only
    measured rows can tell (`calibrate.choose_kv_cache`, `calc --calibrate`).

    vLLM's own default differs for a runtime `--quantization fp8` of a BF16 checkpoint (it keeps
    a BF16 cache: see `_resolve_kv_dtype`); pass `--kv-cache-dtype auto` to ask for that. An
    MXFP4 model's own checkpoint (gpt-oss) names no KV scheme and its recipes keep the default."""
    if quantization in FP8_KV_DEPLOYED and not (arch.quantization == "mxfp4"
                                                and quantization in ("mxfp4", "nvfp4")):
        return "fp8"
    return "auto"


def _resolve_kv_dtype(kv: str, arch: ModelArch, version: Version, quant: str | None = None) -> str:
    """The KV cache dtype vLLM uses for `--kv-cache-dtype kv`. `auto` on vLLM >= 0.13 takes the
    checkpoint's KV scheme when it names one (ModelOpt `kv_cache_quant_algo`, compressed-tensors
    `kv_cache_scheme`: vllm PR #29980/#30785, `resolve_kv_cache_dtype_string` in
    vllm/utils/torch_utils.py); otherwise, and before 0.13, `auto` is the model dtype. A runtime
    `--quantization fp8` of a BF16 checkpoint names no KV scheme and keeps a BF16 cache
    (measured: Llama-3.1-8B on H100, vLLM 0.19, 529,248 KV tokens against 476,016 unquantized:
    only the weights shrank).

    NVFP4 of a model whose own checkpoint is not NVFP4 can only be a pre-quantized checkpoint
    (vLLM has no runtime FP4 quantization), and those are ModelOpt's (nvidia/*-NVFP4), whose
    `hf_quant_config.json` names `kv_cache_quant_algo: FP8` (as nvidia/Qwen3-30B-A3B-NVFP4's does,
    vllm issue #34752; read when that file is at hand, `resolve.with_quant_companion`): an FP8
    cache. Measured: aiconfigurator's NVFP4 runs on B200 hold the concurrency an FP8 pool holds
    and a BF16 one does not
    (MiniMax-M2.5 TP2 8192/1024 at c=128: TTFT 0.97 s measured, 0.68 s predicted with the FP8
    pool, 11.3 s with a BF16 one)."""
    if kv == "auto" and version >= KV_FROM_CHECKPOINT:
        if arch.kv_cache_quant:
            return arch.kv_cache_quant
        if quant == "nvfp4" and arch.quantization not in ("nvfp4", "mxfp4"):
            return "fp8"    # (an MXFP4 model's "fp4" is its own checkpoint: gpt-oss, no KV scheme)
    return kv


def make_setup(model: str | ModelArch, gpu: str | GPU, **kwargs) -> Setup:
    """Functional spelling of `Setup.build`."""
    return Setup.build(model, gpu, **kwargs)


def lora_slots(enable_lora: bool | None, max_loras: int | None) -> int:
    """The adapters a server holds at once (`Setup.max_loras`) from its flags: `--max-loras`
    (vLLM's default 1) only with `--enable-lora`, which vLLM ignores it without; 0 without LoRA."""
    return (max_loras or 1) if enable_lora else 0


def _catalog_draft(name: str) -> ModelArch | None:
    """A draft model named in --speculative-config, from the built-in catalog (calc and the
    daemon pass a Speculative resolved through the full chain instead)."""
    try:
        return resolve_model(name)
    except InputError:
        return None
