"""KV-cache capacity exactly as vLLM accounts for it, per version era.

Why: "GPU KV cache size: N tokens" decides how many requests a server can hold, and every
recommendation the daemon makes about max_num_seqs, max_model_len or the GPU tier rests on it.
vLLM computes it in two steps, and so do we:

1. the pool per GPU = gpu_memory_utilization x total memory - (weights + profiled peak
   activation + non-torch memory [+ the CUDA-graph estimate, default from v0.21]); the non-KV
   terms are modelled from first principles with a few constants calibrated on measured
   startups (../shared/fixtures/kv-memory-breakdown.csv; see CALIBRATION below);
2. the page arithmetic of `vllm/v1/core/kv_cache_utils.py` and `kv_cache_interface.py`: bytes per
   block per layer by attention kind (full/GQA split over TP, MLA replicated on every TP rank,
   sliding window, chunked local, Mamba state), hybrid models grouped into equal-size groups
   sharing one pool (with padding layers), num_blocks = pool // (page x group size), then the
   minimum over TP ranks and PP stages. V0 (< 0.8) logged "# GPU blocks" from the same pool.

Where it is weak: every constant comes from H100 runs of vLLM 0.19 (plus four late-2025 rows),
so GPUs with vLLM's small batch defaults (256 sequences, 2048-token chunks), the V0 era, the
v0.21+ CUDA-graph estimate and non-NVSwitch TP are physics-based extrapolations; the
multimodal encoder's share of the profile run (vision.py) is modelled for the V1 engine and the
Qwen-VL, Gemma 3, Mistral 3, Llama 4 and LLaVA towers.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from exporter.errors import InputError
from exporter.model.architectures import (CHUNKED, FFN, FULL, LINEAR, MAMBA,
                                          QUANT_BYTES_PER_PARAM, SLIDING, ModelArch, unquantized_parts)
from exporter.model.setup import (BLACKWELL_HD256_ALIGN_UNTIL, DEVICE_WIDE_NON_TORCH_BEFORE,
                                   MAMBA2_PREFILL_CHECKPOINT, MOE_CHUNK_16K_UNTIL,
                                   MOE_CHUNK_32K_UNTIL, PP_WHOLE_MODEL_CHECK, SMALL_SAMPLER,
                                   STATE_ALIGN_TO_BLOCK, TOKENS_FROM_CONCURRENCY,
                                   V0_MEMORY_PROFILING, V1_DEVICE_WIDE_NON_TORCH_BEFORE,
                                   V1_FREE_MEMORY_CHECK, V1_SNAPSHOT_AFTER_NCCL, Setup)
from exporter.model.vision import SKIP_MM_PROFILING_FROM, encoder_profile
from exporter.model import drafter
from exporter.parse.version import format_version

GIB = 1024**3

# ---- calibration -------------------------------------------------------------------------
# Each constant is physical (bytes per element of a tensor the profile run allocates, or a
# fixed buffer) and was fitted on kv-memory-breakdown.csv (vLLM 0.19, H100) with rows held out
# (benchmarks/accuracy_kv.py prints the held-out error). Not per model, not per row.
CALIBRATION = {
    # dummy sampler run over min(max_num_seqs, max_num_batched_tokens) rows of fp32 logits:
    # bytes per (row x vocab) element at the peak (logits, probs, sorted copy, indices...)
    # beyond the logits themselves in the model dtype (so fp32 models cost 2 B more)
    "sampler_bytes_per_logit": 13.4,          # >= 0.17 (Llama 1024x128256 -> 1.89 GiB)
    "sampler_bytes_per_logit_pre017": 36.9,   # < 0.17 (Qwen3-0.6B 5.56, Llama 4.76 GiB)
    # forward pass over max_num_batched_tokens, bytes per token: per MLP-intermediate channel on
    # this rank (the gate/up output, 4 B, and the activation's output, 2 B: split over TP) and
    # per hidden channel (four 16-bit hidden-wide tensors alive at the MLP: its input, the
    # residual, the normed copy, the down projection's output: whole on every rank). Read off two
    # public forward-bound profiles: Qwen2.5-7B at TP1 on a V100 (0.8.5,
    # 32,768 tokens: 4.35 GiB logged) and Llama-3.1-8B at TP8 on MI300X (0.6.4, 131,072 tokens:
    # 5.34 GiB, peak_torch_memory minus the weights) give 6.0 and 8.0. One per-intermediate
    # constant (8.2 B, the hidden part folded in at TP1's ratio) put the TP8 peak at 1.79 GiB
    "forward_bytes_per_token_inter": 6.0,
    "forward_bytes_per_token_hidden": 8.0,
    # fused-MoE workspace that stays cached after the forward: bytes per (token x top-k x
    # (2*expert_inter/tp + hidden))
    "moe_workspace_bytes": 2.0,
    # non-torch memory growth during profiling (NCCL/custom all-reduce buffers, workspaces), GiB
    "non_torch_single_gib": 0.25,
    "non_torch_single_pre017_gib": 0.13,  # llm-d-benchmark late-2025 rows
    # V0 from 0.6.5 (`memory_profiling`: the growth since the worker's baseline) on one GPU: public
    # logs print 0.03-0.05 GiB on T4s (0.7.1-0.9.2, eight Unsloth notebook runs of
    # unslothai/notebooks) and an RTX 4060, 0.05 on an A10, 0.06-0.10 on an RTX 3090, 4090 / 4090 D
    # and A100-40GB: their median. V1's compiled graphs on an H100 grow 0.13
    "non_torch_single_v0_gib": 0.05,
    "non_torch_tp_pre017_gib": 0.55,      # the same, TP2 on H100 (NVSwitch: NCCL's NVLS buffers)
    # TP ranks without NVLS (PCIe, bridges, A100's NVLink 3) before 0.17: the pools of the two TP2
    # servers of one A100 0.10.1 sweep (github.com/dennislee22/vLLM-benchmarking, custom
    # all-reduce off) put it at 0.11 and 0.09 GiB; 0.55 made those pools 0.45 GiB small
    "non_torch_tp_no_nvls_pre017_gib": 0.10,
    "non_torch_pp_gib": 0.07,
    "non_torch_tp_nvswitch_gib": 2.12,   # NCCL NVLS buffers on NVSwitch systems (H100/H200/B200)
    "non_torch_tp_pcie_gib": 0.45,       # PCIe / NVLink-bridge GPUs: no NVLS [estimate]
    # charged below 0.6.4 (setup.DEVICE_WIDE_NON_TORCH_BEFORE): a CUDA context's worth (init_used_gib
    # of a TP1 row in kv-memory-breakdown.csv, 0.51) and NCCL's init buffers (init_used 1.53 at TP2
    # minus the context)
    "cuda_context_gib": 0.51,
    # NCCL's NVLS buffers (NVSwitch systems) only: on PCIe and NVLink 3 its init buffers are small
    # enough to sit inside the 0.10 GiB of non_torch_tp_no_nvls_pre017_gib (a 0.7.2 V0 log of two
    # PCIe RTX 4090s: 0.25 GiB of non-torch memory at TP2, context excluded)
    "nccl_init_gib": 1.02,
    # V1 0.8.0-0.9.0 counted the device too (setup.V1_DEVICE_WIDE_NON_TORCH_BEFORE): the context
    # of those releases' stacks, from public startups on consumer Ampere/Ada cards: a 0.6.4 V0
    # RTX 3090 log prints non_torch_memory=0.35 GiB with the context (0.22 over the growth), and
    # V1 0.8.4 on an RTX 3090 (Qwen2.5-7B, TP1) and 0.8.5 on an RTX 4090 D (Qwen2.5-0.5B) leave
    # 0.19 and 0.32 GiB unexplained without it
    "cuda_context_v1_pre091_gib": 0.24,
    # share of a multimodal tower's weights every TP rank holds in full (patch embeddings,
    # norms, position tables, layers without a TP split); Kimi-VL and Mistral-Small w8a8 at TP2
    "tower_replicated_share": 0.3,
    # CUDA-graph memory estimate subtracted from v0.21 (median of cudagraph_estimated_gib)
    "cudagraph_single_gib": 0.84,
    "cudagraph_tp_gib": 1.60,
    "cudagraph_pp_gib": 0.52,
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory as vLLM's startup log reports it, for the limiting rank (GiB)."""

    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    kv_cache_gib: float
    requested_gib: float


@dataclass(frozen=True)
class KVCapacity:
    """What vLLM logs at startup for a setup."""

    bytes_per_token: int        # KV bytes per token per GPU (full-attention equivalent)
    tokens: int                 # "GPU KV cache size: N tokens"
    gpu_blocks: int             # num_blocks (V0: "# GPU blocks")
    max_concurrency: float      # "Maximum concurrency for max_model_len tokens per request"
    memory: MemoryBreakdown
    block_size: int
    num_groups: int             # KV cache groups (1 unless hybrid)
    blocks_per_request: int     # blocks one max_model_len request needs
    # blocks vLLM's "one max_model_len request fits" check compares with: gpu_blocks, except where
    # it counted the whole model's layers on one pipeline stage (setup.PP_WHOLE_MODEL_CHECK)
    fit_blocks: int

    @property
    def fits(self) -> bool:
        """Whether vLLM starts with this max_model_len (it refuses when one request does not fit)."""
        return self.blocks_per_request <= self.fit_blocks

    @property
    def pool_bytes_per_token(self) -> float:
        """Pool bytes behind each token of `tokens` on one GPU: `bytes_per_token` for a uniform
        model; more for hybrids (state blocks) and less for sliding windows, whose token count is
        requests x max_model_len. Tokens grow in proportion to the pool at fixed flags."""
        return self.memory.kv_cache_gib * GIB / self.tokens if self.tokens > 0 else float(self.bytes_per_token)


# ---- per-layer pages ------------------------------------------------------------------------

def kv_heads_per_rank(model: ModelArch, tp: int, kind: str = FULL) -> int:
    """GQA heads split across TP ranks; with more ranks than heads each rank keeps one."""
    if model.attention == "mla":
        return 1
    return max(1, model.kv_shape(kind).kv_heads // tp)


def token_bytes_per_layer(setup: Setup, kind: str = FULL) -> int:
    """KV bytes one token occupies in one attention layer of `kind` on one GPU."""
    m, b = setup.model, setup.kv_dtype_bytes
    if m.attention == "mla":
        # one latent, replicated on every rank; with DeepSeek sparse attention the indexer's key
        # beside it in the same group (UniformTypeKVCacheSpecs: the pages of a layer's two caches
        # are summed)
        if setup.kv_cache_dtype == "fp8_ds_mla":
            return 656 + m.indexer_cache_bytes
        return (m.kv_lora_rank + m.qk_rope_head_dim) * b + m.indexer_cache_bytes
    shape = m.kv_shape(kind)
    return kv_heads_per_rank(m, setup.tp, kind) * (shape.head_dim + shape.v_head_dim) * b


def bytes_per_token(setup: Setup) -> int:
    """KV bytes per token per GPU, summed over the attention layers that hold a cache on one PP
    stage (layers of different shapes at their mean).

    Llama-3.1-8B bf16 TP1: 2 x 32 layers x 8 heads x 128 x 2 B = 131072."""
    per_layer = [token_bytes_per_layer(setup, t) for t in setup.model.cache_layer_types
                 if t not in (MAMBA, LINEAR)]
    if not per_layer:
        return 0
    return (sum(per_layer) * math.ceil(len(per_layer) / setup.pp) // len(per_layer)
            + drafter.kv_token_bytes(setup))


def _max_tokens_per_layer(setup: Setup, kind: str) -> int:
    """Token slots one request of max_model_len can hold in one layer of this kind (vLLM's
    `max_memory_usage_bytes` / page, in tokens, before block rounding)."""
    m, L = setup.model, setup.max_model_len
    if kind == SLIDING and m.sliding_window:
        return min(m.sliding_window - 1 + setup.max_in_flight_tokens, L)
    if kind == CHUNKED and m.attention_chunk_size:
        return min(m.attention_chunk_size + setup.max_in_flight_tokens, L)
    return L


@dataclass(frozen=True)
class _Groups:
    page_bytes: int          # bytes per block per layer (uniform across groups)
    group_size: int          # layers per group (= tensors sharing the pool)
    kinds: tuple[str, ...]   # kind of each group
    block_size: int          # tokens per block of the groups with the largest page (the smallest)
    # tokens per block of kinds whose page was raised to page_bytes by a larger block
    raised: tuple[tuple[str, int], ...] = ()

    def block_size_of(self, kind: str) -> int:
        return dict(self.raised).get(kind, self.block_size)


def kv_groups(setup: Setup) -> _Groups:
    """vLLM's grouping: one group for uniform models; for hybrids, buckets by kind split into
    groups of G layers (G = smallest bucket, or the largest when max < 1.5 x min), padded.
    Kinds with a smaller page than the largest (Gemma 4's full layers: 4 KV heads x 512 beside
    16 x 256) take a block size raised by the ratio, or keep theirs and pad the page when the
    ratio is not whole (unify_kv_cache_spec_page_size)."""
    m = setup.model
    types = m.cache_layer_types       # MLP-only and KV-shared layers hold no cache
    if setup.speculative is not None and drafter.draft_layers(setup) and drafter.same_page_as_target(setup):
        # the drafter's attention layers (an EAGLE head's, the MTP layers) are full-attention
        # layers of the target's page in the same pool (drafter.py)
        types = types + (FULL,) * drafter.draft_layers(setup)
    if setup.v0:  # V0 had no hybrid allocator: every attention layer is sized for full context
        types = tuple(FULL if t in (SLIDING, CHUNKED) else t for t in types)
    counts = Counter(types)
    bs = setup.block_size
    per_token = {t: token_bytes_per_layer(setup, t) for t in counts if t not in (MAMBA, LINEAR)} \
        or {FULL: token_bytes_per_layer(setup)}
    if not set(counts) - {MAMBA, LINEAR}:
        # attention-free (Mamba, Mamba2): one group of every layer, its page one request's state,
        # its block max_model_len long (mamba_block_size without prefix caching, which vLLM
        # keeps off for these models)
        return _Groups(setup.state_bytes(), sum(counts.values()), (types[0],), setup.max_model_len, ())
    widest = max(per_token.values())
    page = bs * widest
    if MAMBA in counts or LINEAR in counts:
        # attention block size is raised until its page covers the recurrent state page (one
        # rank's: vLLM splits the state's channels and heads over TP like the KV heads)
        state = setup.state_bytes()
        if state > page:
            align = _state_block_alignment(setup)
            bs = align * math.ceil(state / (align * widest))
            page = bs * widest
    raised = tuple((t, bs * (widest // b)) for t, b in per_token.items() if b < widest and widest % b == 0)
    if len(counts) == 1:
        return _Groups(page, counts[types[0]], (types[0],), bs, raised)
    lo, hi = min(counts.values()), max(counts.values())
    g = hi if hi < 1.5 * lo else lo
    kinds: list[str] = []
    for kind, n in counts.items():
        kinds += [kind] * math.ceil(n / g)
    return _Groups(page, g, tuple(kinds), bs, raised)


def _state_block_alignment(setup: Setup) -> int:
    """Tokens the attention block is a multiple of when vLLM raises it to cover a recurrent-state
    page (`update_block_size_for_backend`; see setup.STATE_ALIGN_TO_BLOCK)."""
    if setup.vllm_version >= STATE_ALIGN_TO_BLOCK:
        return max(16, setup.block_size)
    if (setup.vllm_version < BLACKWELL_HD256_ALIGN_UNTIL and setup.model.head_dim == 256
            and setup.gpu.compute_capability.startswith("10.")):
        return 32
    return 16


# ---- non-KV memory --------------------------------------------------------------------------

def _stage_layers(num_layers: int, pp: int) -> list[int]:
    """vLLM's split of decoder layers over PP stages (`get_pp_indices`): even, and the
    remainder goes to the stages before the last one (which also holds the lm_head)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def _expert_share(setup: Setup) -> float:
    """Share of one MoE layer's routed-expert weights the limiting rank holds.

    vLLM spreads the experts over tp x dp ranks (`FusedMoEParallelConfig.make` flattens TP
    across DP). Without --enable-expert-parallel each expert is tensor-split (1/(tp*dp) of
    every expert); with it each rank owns whole experts, E // ep plus one of the remainder on
    the first ranks (`determine_expert_map`), so the limiting rank holds ceil(E / ep)."""
    m, ranks = setup.model, setup.moe_ranks
    if setup.expert_parallel and ranks > 1 and m.num_experts:
        return math.ceil(m.num_experts / ranks) / m.num_experts
    return 1.0 / ranks


def dense_linear_bytes(setup: Setup) -> float:
    """Bytes on one TP rank of every linear layer outside the routed experts (all layers): split
    over TP except what each rank holds whole (MLA's down-projections), in the weight scheme
    except what the checkpoint leaves in the model dtype (`unquantized_parts`; MXFP4 quantizes
    only the routed experts)."""
    m, tp = setup.model, setup.tp
    native = setup.dtype_bytes
    linear, experts, _ = m.layer_params()
    dense = linear - experts
    q = setup.quantization
    qbytes = QUANT_BYTES_PER_PARAM.get(q) if q else None
    rep = m.replicated_linear_params()   # held whole by every rank

    def on_rank(params: float, replicated: float) -> float:
        return (params - replicated) / tp + replicated
    if qbytes is None or q == "mxfp4":
        return on_rank(dense, rep) * native
    parts = unquantized_parts(m, q)
    keep = m.unquantized_linear_params(parts)
    rep_keep = rep if "attention" in parts else 0
    return on_rank(dense - keep, rep - rep_keep) * qbytes + on_rank(keep, rep_keep) * native


def padded_vocab(vocab: int, tp: int) -> int:
    """Rows of a vocabulary-parallel embedding or lm_head: padded to 64 per rank
    (VocabParallelEmbedding's DEFAULT_VOCAB_PADDING_SIZE)."""
    return math.ceil(vocab / (64 * tp)) * 64 * tp


def weights_bytes(setup: Setup, stage: int = 0, *, padded: bool = True) -> float:
    """Bytes of weights on one rank of PP stage `stage`; `padded=False`: without the MXFP4 MoE
    layout's padding (what the step reads, perf.shape_for; the allocation counts it)."""
    m, tp, pp = setup.model, setup.tp, setup.pp
    native = setup.dtype_bytes
    linear, experts, other = m.layer_params()
    q = setup.quantization
    qbytes = QUANT_BYTES_PER_PARAM.get(q) if q else None
    eshare = _expert_share(setup)
    dense_bytes = dense_linear_bytes(setup)
    if q == "mxfp4":  # gpt-oss: only the routed experts are MXFP4; vLLM's MXFP4 MoE (Marlin
        # layout) pads the per-rank intermediate size to 128 and the hidden size to 256
        # (mxfp4.py create_weights; matches gpt-oss-20b's 7.01 GiB per rank at TP2)
        split = 1 if setup.expert_parallel else setup.moe_ranks
        per_rank = m.moe_intermediate_size / split
        pad = (math.ceil(per_rank / 128) * 128 / per_rank) if per_rank else 1.0
        pad *= math.ceil(m.hidden_size / 256) * 256 / m.hidden_size
        if not padded:
            pad = 1.0
        linear_bytes = dense_bytes + experts * qbytes * pad * eshare
    else:
        linear_bytes = dense_bytes + experts * (qbytes if qbytes is not None else native) * eshare
    share = _stage_layers(m.num_layers, pp)[stage] / m.num_layers
    emb = padded_vocab(m.vocab_size, tp) * m.hidden_size * native
    total = (linear_bytes + other * native) * share
    if stage == 0:
        share_rep = CALIBRATION["tower_replicated_share"]
        total += emb / tp + m.extra_params * native * (share_rep + (1 - share_rep) / tp)
        # the Per-Layer Embedding table, split over the ranks by vocabulary as embed_tokens is
        total += m.ple_embedding_params * native / tp
    if stage == pp - 1:
        if not m.tie_word_embeddings or pp > 1:
            total += emb / tp
    # the rotary cos/sin caches, [positions, rotary_dim] in the model dtype, on every rank (2.5 GiB
    # for Llama 4's 10M positions: its "Model loading took" 53.12 GiB at TP4; Gemma 3's two ropes)
    total *= _checkpoint_scale(setup)
    return total + m.rope_cache_size * native


# vLLM's lora_extra_vocab_size (256 added embedding rows per adapter, on the embedding and the
# lm_head): deprecated in 0.11, gone from LoRAConfig by 0.15 (read in those wheels)
LORA_EXTRA_VOCAB_UNTIL = (0, 15, 0)
LORA_VOCAB_PADDING = 256         # LoRAConfig.lora_vocab_padding_size: the lm_head B buffer's rows


def lora_bytes(setup: Setup, stage: int = 0) -> float:
    """Bytes of one rank's LoRA buffers (`--enable-lora`): vLLM wraps every linear layer and the
    embedding / lm_head (lora/models.py `_create_lora_modules`, `get_supported_lora_modules`) and
    preallocates for max_loras adapters of max_lora_rank, in the model dtype, before the profile,
    so they count with the weights ("Model loading took"). Per linear (lora/layers/*.py
    `create_lora_weights`): column-parallel (qkv, gate_up: one A per slice) A = slices x rank x
    input, B = output / TP x rank; row-parallel (o, down) A = rank x input / TP, B = output x rank
    (output / TP with --fully-sharded-loras, which also splits a column layer's A rank). The
    embedding: A = (vocab + extra) x rank, B = hidden x rank; the lm_head: A = rank x hidden, B =
    the vocabulary padded to 256 x rank, whole on every rank; both with extra-vocabulary rows
    before 0.15. Not modelled: LoRA on routed experts (FusedMoE) and on MLA's projections (their
    linears are counted as plain q/kv/o)."""
    n = setup.max_loras
    if n <= 0:
        return 0.0
    m, tp, r = setup.model, setup.tp, setup.max_lora_rank
    fs = setup.fully_sharded_loras
    h = m.hidden_size
    a_rank = r / tp if fs else r

    def column(slices: int, inp: float, out: float) -> float:
        return slices * a_rank * inp + out / tp * r

    def row(inp: float, out: float) -> float:
        return r * inp / tp + (out / tp if fs else out) * r
    per_layer = []
    moe = set(m.moe_layers)
    for i in range(m.num_layers):
        p = 0.0
        if m.has_attention(i):
            q = m.num_heads * m.head_dim
            kv = 2 * m.num_kv_heads * m.head_dim
            p += column(3, h, q + kv) + row(q, h)
        if m.has_mixer(i):
            p += column(1, h, 2 * h) + row(2 * h, h)      # in / out projections [approximation]
        width = m.shared_expert_width if i in moe else (m.mlp_width(i) if m.has_mlp(i) else 0)
        if width:
            p += column(2 if m.gated_mlp else 1, h, (2 if m.gated_mlp else 1) * width) + row(width, h)
        if i in moe:
            p += r * h + m.num_experts * r                # the router (replicated)
        per_layer.append(p)
    stages = _stage_layers(m.num_layers, setup.pp)
    first = sum(stages[:stage])
    params = sum(per_layer[first:first + stages[stage]])
    extra = 256 if setup.vllm_version < LORA_EXTRA_VOCAB_UNTIL else 0
    if stage == 0:
        params += (m.vocab_size + extra) * r + h * r + extra * h
    if stage == setup.pp - 1:
        params += r * h + math.ceil(m.vocab_size / LORA_VOCAB_PADDING) * LORA_VOCAB_PADDING * r + extra * h
    return params * n * setup.dtype_bytes


def offloaded_bytes(setup: Setup, stage: int = 0) -> tuple[float, float]:
    """(bytes, routed-expert bytes among them) of one rank's weights that `--cpu-offload-gb` moves
    to pinned host memory on PP stage `stage`: vLLM passes each decoder layer, first to last, through
    `maybe_offload_to_cpu` (models/utils.py, make_layers), which moves whole parameters until the
    rank's budget (cpu_offload_gb x 2^30 bytes) is reached, so the last one may overshoot it. A
    layer's parameters in the order its module registers them: attention (qkv_proj, o_proj), then
    the MLP (gate_up_proj, down_proj; an MoE layer's w13 and w2 of all its experts on the rank, then
    its shared experts); norms are left out. The embedding and lm_head stay on the GPU."""
    budget = setup.cpu_offload_gb * GIB
    if budget <= 0:
        return 0.0, 0.0
    m, tp = setup.model, setup.tp
    native = setup.dtype_bytes
    q = setup.quantization
    qbytes = QUANT_BYTES_PER_PARAM.get(q) if q else None
    skip = unquantized_parts(m, q) if qbytes is not None else frozenset()

    def width(part: str) -> float:
        if qbytes is None or (q == "mxfp4" and part != "experts") or part in skip:
            return native
        return qbytes
    gated = m.gated_mlp
    moe = set(m.moe_layers)
    first = sum(_stage_layers(m.num_layers, setup.pp)[:stage])
    done = experts_done = 0.0
    for i in range(first, first + _stage_layers(m.num_layers, setup.pp)[stage]):
        params: list[tuple[float, bool]] = []
        if m.has_mixer(i):
            params.append((m.mixer_params() * native / tp, False))
        if m.has_attention(i):
            attn = m.attention_params_per_layer(i) * width("attention") / tp
            o = m.num_heads * (m.v_head_dim or m.head_dim) * m.hidden_size * width("attention") / tp
            params += [(attn - o, False), (o, False)]
        if i in moe:
            e = m.num_experts * m.expert_params() * width("experts") * _expert_share(setup)
            params += [(e * 2 / 3 if gated else e / 2, True), (e / 3 if gated else e / 2, True)]
            if m.shared_expert_width:
                params.append((m.shared_expert_params() * width("shared_experts") / tp, False))
        elif m.has_mlp(i):
            mlp = m.dense_mlp_params(i) * width("dense_mlp") / tp
            params += [(mlp * 2 / 3 if gated else mlp / 2, False), (mlp / 3 if gated else mlp / 2, False)]
        for size, expert in params:
            if done >= budget:
                return done, experts_done
            done += size
            experts_done += size if expert else 0.0
    return done, experts_done


def _checkpoint_scale(setup: Setup) -> float:
    """Exact checkpoint size over the size derived from config fields, when the architecture
    carries the safetensors byte count (`weight_bytes`, read defensively: the field is added by
    model resolution) and the weights load as stored (no runtime quantization, native dtype).
    The per-rank split stays the derived one; only the total is corrected."""
    m = setup.model
    exact = getattr(m, "weight_bytes", None)
    if not exact or setup.quantization != m.quantization or setup.dtype != m.native_dtype:
        return 1.0
    linear, experts, other = m.layer_params()
    q = QUANT_BYTES_PER_PARAM.get(m.quantization) if m.quantization else None
    native = setup.dtype_bytes
    if m.quantization == "mxfp4":
        lin = (linear - experts) * native + experts * q
    elif q is not None:
        keep = m.unquantized_linear_params(m.quant_skip)
        lin = (linear - keep) * q + keep * native
    else:
        lin = linear * native
    emb = m.vocab_size * m.hidden_size * native * (1 if m.tie_word_embeddings else 2)
    derived = lin + (other + m.extra_params + m.ple_embedding_params) * native + emb
    return float(exact) / derived if derived > 0 else 1.0


def activation_bytes(setup: Setup, stage: int = 0) -> float:
    """Peak torch allocation of the profile run beyond the weights: the dummy forward over
    max_num_batched_tokens and, on the last PP stage, the dummy sampler over
    min(max_num_seqs, max_num_batched_tokens) rows of logits."""
    m, tp = setup.model, setup.tp
    c = CALIBRATION
    tokens = setup.max_num_batched_tokens
    # the widest dense MLP the dummy forward runs: the dense layers' (an MoE model's first_k_dense
    # ...) and an MoE layer's shared experts; its routed experts' caches are the fused-MoE
    # workspace below, which stays allocated (counting them here too put Mixtral-8x7B's peak at
    # 1.79 GiB where its vLLM 0.19 startup logged 1.21)
    inter = m.intermediate_size if not m.is_moe or len(m.moe_layers) < m.num_layers else 0
    if m.is_moe:
        inter = max(inter, m.shared_expert_width)
    scale = setup.dtype_bytes / 2
    forward = tokens * (c["forward_bytes_per_token_inter"] * inter / tp
                        + c["forward_bytes_per_token_hidden"] * m.hidden_size) * scale
    moe_ws = 0.0
    if m.is_moe and setup.quantization != "mxfp4":  # the MXFP4 MoE kernels keep no workspace
        # per-rank expert width: whole experts under EP, 1/(tp x dp) of each otherwise
        inter_rank = m.moe_intermediate_size / (1 if setup.expert_parallel else setup.moe_ranks)
        moe_ws = (c["moe_workspace_bytes"] * moe_profile_tokens(setup) * m.experts_per_token
                  * (2 * inter_rank + m.hidden_size))
        if setup.dp > 1 and not setup.v0:
            # the dispatched hidden states of every DP rank, alive while the experts run
            moe_ws += tokens * setup.dp * m.hidden_size * setup.dtype_bytes
    if stage != setup.pp - 1:
        return _with_encoder(setup, stage, forward)
    rows = min(setup.max_num_seqs, tokens)
    small = setup.vllm_version >= SMALL_SAMPLER or setup.flashinfer_sampling
    # V0's dummy run (top_p 0.99, top_k vocab - 1) sorted the vocabulary in PyTorch like V1's native
    # top-k/top-p path, and its peak is the larger of the forward's and the sampler's (the forward's
    # activations are freed before sampling): public V0 startups log 0.90 GiB for Llama-3.2-3B on
    # a T4 at 0.8.2 (192 rows: sampler 0.89, forward 0.14) and 4.35 for Qwen2.5-7B on a V100 at
    # 0.8.5 (a 32,768-token forward: 4.34; tests/model/test_public_startups_gpus.py); also 1.40
    # for two Qwen2 models at 0.7.x (1.41) and 1.83 for Phi-4-mini's 200k vocabulary (1.86)
    per_logit = c["sampler_bytes_per_logit"] if small else c["sampler_bytes_per_logit_pre017"]
    sampler = (per_logit + setup.dtype_bytes) * rows * m.vocab_size
    if setup.v0:
        return max(forward, sampler) + moe_ws
    return _with_encoder(setup, stage, max(forward, sampler + moe_ws))


def _with_encoder(setup: Setup, stage: int, language: float) -> float:
    """The profile's peak on `stage` given the language model's: a multimodal model's encoder
    runs first on the first stage, and its outputs stay cached through the language model's
    dummy run (vision.py), so the peak is the larger of the two phases."""
    enc = encoder_profile(setup) if stage == 0 else None
    if enc is None:
        return language
    return max(enc.forward_bytes, enc.kept_bytes + language)


def moe_profile_tokens(setup: Setup) -> int:
    """Tokens the profile run's MoE workspace is sized for: max_num_batched_tokens, or under data
    parallelism every DP rank's, cut at the fused-MoE chunk of the release (setup.MOE_CHUNK_*)."""
    tokens = setup.max_num_batched_tokens
    if setup.dp == 1 or setup.v0:
        return tokens
    gathered = tokens * setup.dp
    if setup.vllm_version < MOE_CHUNK_32K_UNTIL:
        return min(gathered, 32768)
    if setup.vllm_version < MOE_CHUNK_16K_UNTIL:
        return 16384 if setup.expert_parallel else min(gathered, 16384)
    return gathered


def _nvls(setup: Setup) -> bool:
    """Whether the GPUs sit on an NVSwitch fabric with NVLink SHARP (NVLS: third-generation
    NVSwitch, Hopper and later), where NCCL allocates its large NVLS buffers. Not on PCIe, not
    over an NVLink bridge (H200 NVL), not on A100's NVLink 3."""
    link = str(getattr(setup.gpu, "interconnect", "") or "")
    if not link.lower().startswith("nvlink") or "bridge" in link.lower():
        return False
    m = re.match(r"nvlink\s*(\d+)", link.lower())
    if m:
        return int(m.group(1)) >= 4
    # a user's GPU file that says only "NVLink": the switch systems quote >= 900 GB/s per GPU
    return float(getattr(setup.gpu, "interconnect_gbps", 0) or 0) >= 900


def non_torch_bytes(setup: Setup) -> float:
    """Memory outside torch's allocator that the profile counts (NCCL and custom all-reduce
    buffers, cuBLAS workspaces). Ranks that exchange MoE tokens across DP engines (dp > 1 on a
    MoE model) hold the same communicator buffers as TP ranks. Releases that count the whole
    device's used memory count other processes' too (`--gpu-memory-in-use`)."""
    return _own_non_torch_bytes(setup) + (setup.gpu_memory_in_use_gib * GIB if counts_whole_device(setup) else 0.0)


def counts_whole_device(setup: Setup) -> bool:
    """Whether the release's profile charges everything used on the device after the profile run
    ("total - free - torch allocated"), other processes' memory included: V0 0.6.4.x and V1
    0.8.0-0.9.0 (setup.DEVICE_WIDE_NON_TORCH_BEFORE, V1_DEVICE_WIDE_NON_TORCH_BEFORE). V0
    0.3.1-0.6.3 charged the free memory the run took since the worker started, 0.6.5 on the growth
    since a snapshot, V1 from 0.9.1 the same: memory others held before is not charged there."""
    v = setup.vllm_version
    if setup.v0:
        return DEVICE_WIDE_NON_TORCH_BEFORE <= v < V0_MEMORY_PROFILING
    return v < V1_DEVICE_WIDE_NON_TORCH_BEFORE


def startup_utilization_cap(setup: Setup) -> float | None:
    """The largest gpu_memory_utilization vLLM starts with on this device, given the memory others
    hold (`--gpu-memory-in-use`); None where nothing bounds it. V1 from 0.9.1 compares the free
    memory of its startup snapshot (after this process's CUDA context, and from 0.11.0 NCCL's
    buffers) with gpu_memory_utilization x total. V0 checks nothing but allocates the pool it
    computed, which cannot exceed what others left free (with none in use, nothing is checked)."""
    c = CALIBRATION
    total = setup.gpu_memory_gib
    own = c["cuda_context_gib"]
    # NCCL initialised for a TP or PP group (0.19's init_used_gib: 1.53 at TP2-4, 1.43-1.48 at PP2-4)
    comm = setup.tp > 1 or setup.pp > 1 or (setup.dp > 1 and setup.model.is_moe)
    if not setup.v0 and setup.vllm_version >= V1_FREE_MEMORY_CHECK:
        if comm and _nvls(setup) and setup.vllm_version >= V1_SNAPSHOT_AFTER_NCCL:
            own += c["nccl_init_gib"]
    elif setup.gpu_memory_in_use_gib <= 0 or counts_whole_device(setup):
        return None
    return max(total - setup.gpu_memory_in_use_gib - own, 0.0) / total


def startup_refusal(setup: Setup) -> str | None:
    """Why vLLM would not start for lack of free memory on the device, before profiling anything
    (`startup_utilization_cap`); None when it starts."""
    cap = startup_utilization_cap(setup)
    if cap is None or setup.gpu_memory_utilization <= cap:
        return None
    total = setup.gpu_memory_gib
    free, requested = cap * total, setup.gpu_memory_utilization * total
    if not setup.v0:
        return (f"Free memory on device ({free:.2f}/{total:.2f} GiB) on startup is less than desired GPU memory "
                f"utilization ({setup.gpu_memory_utilization:g}, {requested:.2f} GiB) (vLLM refuses to start); "
                f"lower --gpu-memory-utilization to {_util_floor(cap)} or less, or free memory held by other "
                f"processes")
    return (f"{setup.gpu_memory_in_use_gib:g} GiB in use by other processes leave {free:.2f} GiB of the "
            f"{total:.2f} GiB device for a server budgeted {requested:.2f} GiB: vLLM "
            f"{format_version(setup.vllm_version)} (V0) checks no free memory at startup and runs out "
            f"of memory allocating the KV cache; lower --gpu-memory-utilization to {_util_floor(cap)} or less")


def _util_floor(x: float) -> str:
    return f"{math.floor(max(x, 0.0) * 100) / 100:.2f}"


def _own_non_torch_bytes(setup: Setup) -> float:
    c = CALIBRATION
    comm = setup.tp > 1 or (setup.dp > 1 and setup.model.is_moe)
    pre017 = (c["non_torch_tp_pre017_gib"] if _nvls(setup) else c["non_torch_tp_no_nvls_pre017_gib"]) \
        if comm else c["non_torch_single_pre017_gib"]
    v1_device_wide = not setup.v0 and setup.vllm_version < V1_DEVICE_WIDE_NON_TORCH_BEFORE
    if setup.vllm_version < DEVICE_WIDE_NON_TORCH_BEFORE or v1_device_wide:
        # device-wide accounting: the CUDA context and NCCL's init-time buffers count too
        context = c["cuda_context_v1_pre091_gib"] if v1_device_wide else c["cuda_context_gib"]
        base = context + (c["nccl_init_gib"] if comm and _nvls(setup) else 0.0)
        return (base + pre017) * GIB
    if setup.v0 and setup.vllm_version >= V0_MEMORY_PROFILING and not comm and setup.pp == 1:
        return c["non_torch_single_v0_gib"] * GIB
    if setup.vllm_version < SMALL_SAMPLER:
        return pre017 * GIB
    if comm:
        return (c["non_torch_tp_nvswitch_gib"] if _nvls(setup) else c["non_torch_tp_pcie_gib"]) * GIB
    if setup.pp > 1:
        return c["non_torch_pp_gib"] * GIB
    return c["non_torch_single_gib"] * GIB


def cudagraph_bytes(setup: Setup) -> float:
    """The CUDA-graph pool estimate vLLM subtracts from the pool from v0.21 on (0 before, and
    with --enforce-eager, which captures no graphs: `cudagraph_mode` NONE)."""
    if not setup.cudagraph_estimate_subtracted or setup.enforce_eager:
        return 0.0
    c = CALIBRATION
    if setup.tp > 1 or (setup.dp > 1 and setup.model.is_moe):
        return c["cudagraph_tp_gib"] * GIB
    return (c["cudagraph_pp_gib"] if setup.pp > 1 else c["cudagraph_single_gib"]) * GIB


# ---- the pool and the log lines ---------------------------------------------------------------

def _gib(x: float) -> float:
    return round(x / GIB, 2)


def kv_capacity(setup: Setup, *, check_fits: bool = True, allow_no_pool: bool = False) -> KVCapacity:
    """Predict vLLM's startup KV-cache lines for `setup`.

    Raises InputError when the weights do not fit, or when one max_model_len request does not
    fit the pool (naming the largest max_model_len that would, as vLLM does).

    `--kv-cache-memory-bytes` sets the pool on every rank as given: vLLM still runs the profile
    (it compiles for max_num_batched_tokens) but skips the accounting and ignores
    gpu_memory_utilization (`determine_available_memory` returns the bytes); what must still fit
    is the device: weights, activations, non-torch memory, CUDA graphs and that pool.
    `--num-gpu-blocks-override N` replaces the blocks the accounting found by N (the pool is N
    pages; "Overriding num_gpu_blocks=X with num_gpu_blocks_override=N"), with the same check.

    No memory left for a pool ("No available memory for the cache blocks") raises too, unless
    `allow_no_pool` (with `check_fits=False`): then the capacity holds no block, does not fit, and
    its pool is the negative "Available KV cache memory" vLLM logs before refusing.

    A server the device's free memory refuses before profiling (`startup_refusal`) is not checked
    here: a running server's pool is what it is, whatever other processes hold now."""
    fixed = setup.kv_cache_memory_bytes
    override = setup.num_gpu_blocks_override
    total = setup.gpu_memory_gib * GIB
    requested = total if fixed else setup.gpu_memory_utilization * total
    groups = kv_groups(setup)
    stages = _stage_layers(setup.model.num_layers, setup.pp)
    best = None
    least_avail = math.inf
    draft_w = drafter.weight_bytes(setup)
    draft_page = _draft_page(setup, groups)
    for stage in range(setup.pp):
        w = (weights_bytes(setup, stage) - offloaded_bytes(setup, stage)[0] + lora_bytes(setup, stage)
             + (draft_w if stage == setup.pp - 1 else 0.0))
        a = activation_bytes(setup, stage)
        nt = non_torch_bytes(setup)
        cg = cudagraph_bytes(setup)
        layers_here = math.ceil(groups.group_size * stages[stage] / setup.model.num_layers)
        # one block's bytes on this rank: a page per layer it holds (V0: per attention layer)
        block_bytes = groups.page_bytes * max(1, stages[stage] * _attn_share(setup) if setup.v0 else layers_here)
        block_bytes += draft_page if stage == setup.pp - 1 else 0
        if override:
            blocks, avail = override, float(override * block_bytes)
        else:
            avail = float(fixed) if fixed else requested - (w + a + nt + cg)
            blocks = int(avail // block_bytes)
        least_avail = min(least_avail, avail)
        if best is None or blocks < best[0] or (override and avail > best[5]):
            best = (blocks, w, a, nt, cg, avail, layers_here)
    blocks, w, a, nt, cg, avail, layers_here = best
    if override:
        fixed = int(avail)     # the pool those blocks take on the fullest rank
    if w > requested:
        allows = (f"the device has {_gib(requested)} GiB" if fixed else
                  f"gpu_memory_utilization {setup.gpu_memory_utilization} x {setup.gpu_memory_gib} GiB "
                  f"allows {_gib(requested)} GiB")
        raise InputError(
            f"the weights alone need {_gib(w)} GiB per GPU but {allows}: {setup.model.name} does not "
            f"fit on {setup.num_gpus} x {setup.gpu.name} (tp={setup.tp}, pp={setup.pp}); use more GPUs, "
            f"a bigger GPU or quantization")
    if fixed and w + a + nt + cg + fixed > total:
        what = (f"--num-gpu-blocks-override {override} ({_gib(fixed)} GiB)" if override
                else f"--kv-cache-memory-bytes {_gib(fixed)} GiB")
        raise InputError(
            f"{what} does not fit beside weights {_gib(w)} + "
            f"activation {_gib(a)} + non-torch {_gib(nt)} + CUDA graphs {_gib(cg)} GiB in the "
            f"{_gib(total)} GiB of {setup.gpu.name} (vLLM would run out of memory allocating it); "
            f"the most is about {_gib(total - (w + a + nt + cg))} GiB")
    if avail <= 0 and (check_fits or not allow_no_pool):
        raise InputError(
            f"no memory left for the KV cache: weights {_gib(w)} + activation {_gib(a)} + "
            f"non-torch {_gib(nt)} + CUDA graphs {_gib(cg)} GiB exceed the {_gib(requested)} GiB "
            f"that gpu_memory_utilization {setup.gpu_memory_utilization} allows on "
            f"{setup.gpu.name} (vLLM: \"No available memory for the cache blocks\"; available KV "
            f"cache memory {_gib(avail)} GiB){_encoder_advice(setup, a)}; raise "
            f"--gpu-memory-utilization, lower --max-num-batched-tokens or use more GPUs")
    if avail <= 0:   # refused all the same (`fits` is False): the caller prints what vLLM would log
        return KVCapacity(
            bytes_per_token=bytes_per_token(setup), tokens=0, gpu_blocks=0, max_concurrency=0.0,
            memory=MemoryBreakdown(weights_gib=w / GIB, activation_gib=a / GIB, non_torch_gib=nt / GIB,
                                   cudagraph_gib=cg / GIB, kv_cache_gib=avail / GIB, requested_gib=requested / GIB),
            block_size=groups.block_size, num_groups=len(groups.kinds),
            blocks_per_request=max(1, blocks_per_request(setup, groups)), fit_blocks=0)
    blocks = max(blocks, 0)
    bs = groups.block_size
    per_request = blocks_per_request(setup, groups)
    max_conc = blocks / per_request if per_request else 0.0
    if setup.v0:  # V0 logged num_gpu_blocks x block_size / max_model_len
        max_conc = blocks * bs / setup.max_model_len
    if setup.v0 or setup.vllm_version < TOKENS_FROM_CONCURRENCY:
        tokens = blocks // len(groups.kinds) * bs if not setup.v0 else blocks * bs
    else:
        tokens = int(max_conc * setup.max_model_len)
    stage_layers = max(1, layers_here)
    fit_blocks, fit_layers, fit_avail, why = blocks, stage_layers, avail, ""
    if (not setup.v0 and setup.pp > 1 and not override
            and PP_WHOLE_MODEL_CHECK[0] <= setup.vllm_version < PP_WHOLE_MODEL_CHECK[1]):
        # the check holds every stage's layers against the least memory of any stage
        fit_layers, fit_avail = max(1, groups.group_size), least_avail
        fit_blocks = max(int(fit_avail // (groups.page_bytes * fit_layers)), 0)
        why = (f"; vLLM {format_version(setup.vllm_version)} counts the KV cache of all "
               f"{setup.pp} pipeline stages against one stage's memory (fixed in 0.17.0, where each "
               f"stage holds {_gib(per_request * groups.page_bytes * stage_layers)} GiB of it)")
    if check_fits and per_request > fit_blocks:
        largest = largest_max_model_len(setup, fit_blocks, groups)
        need = per_request * (groups.page_bytes * fit_layers + draft_page)
        raise InputError(
            f"max_model_len {setup.max_model_len} does not fit: one request needs "
            f"{_gib(need)} GiB of KV cache but only {_gib(fit_avail)} GiB is available per GPU{why}; "
            f"the estimated maximum model length is {largest} (lower --max-model-len, raise "
            f"--gpu-memory-utilization or use more GPUs)")
    kv_gib = blocks * (groups.page_bytes * stage_layers + draft_page) / GIB
    return KVCapacity(
        bytes_per_token=bytes_per_token(setup), tokens=int(tokens), gpu_blocks=int(blocks),
        max_concurrency=max_conc,
        memory=MemoryBreakdown(weights_gib=w / GIB, activation_gib=a / GIB, non_torch_gib=nt / GIB,
                               cudagraph_gib=cg / GIB, kv_cache_gib=kv_gib,
                               requested_gib=(w + a + nt + cg + fixed if fixed else requested) / GIB),
        block_size=bs, num_groups=len(groups.kinds), blocks_per_request=per_request, fit_blocks=fit_blocks)


def _encoder_advice(setup: Setup, activation: float) -> str:
    """A clause naming the multimodal encoder's profile where it sets the activation peak."""
    enc = encoder_profile(setup)
    if enc is None or enc.forward_bytes < 0.99 * activation:
        return ""
    fixes = ["--limit-mm-per-prompt '{\"video\": 0}', a smaller --max-model-len" if enc.modality == "video" else
             "--limit-mm-per-prompt with fewer items",
             "--mm-processor-kwargs '{\"max_pixels\": ...}'" if setup.model.vision.patch_size else None,
             "--skip-mm-profiling" if setup.vllm_version >= SKIP_MM_PROFILING_FROM else None]
    return (f"; the activation is the multimodal encoder's profile run, {enc.describe()} "
            f"(shrink it with {' or '.join(f for f in fixes if f)})")


def _draft_page(setup: Setup, groups: _Groups) -> int:
    """Bytes a draft model's layers take in every block beside the target's pages, where their
    pages differ from the target's (vLLM's UniformTypeKVCacheSpecs: one group, the layers' pages
    summed); 0 without a drafter and where its layers joined the target's group (`kv_groups`)."""
    if setup.speculative is None or not drafter.draft_layers(setup) or drafter.same_page_as_target(setup):
        return 0
    if len(groups.kinds) > 1:
        raise InputError(f"--speculative-config: a drafter whose layers' KV pages differ from the "
                         f"target's is not modelled for a hybrid model ({setup.model.name}); vLLM "
                         f"groups such layers by page size")
    return groups.block_size * drafter.kv_token_bytes(setup)


def capacity_from_pool(setup: Setup, pool_bytes: float) -> tuple[int, int, float]:
    """(logged tokens, num_blocks, max concurrency) for a known KV pool on every rank, e.g. the
    "Available KV cache memory" a startup log printed: the page arithmetic alone, no fitting."""
    groups = kv_groups(setup)
    layers = math.ceil(groups.group_size / setup.pp)
    if setup.v0:
        blocks = int(pool_bytes // (groups.page_bytes * max(1, math.ceil(setup.model.num_layers / setup.pp)
                                                            * _attn_share(setup))))
        return blocks * groups.block_size, blocks, blocks / blocks_per_request(setup, groups)
    blocks = int(pool_bytes // (groups.page_bytes * max(1, layers) + _draft_page(setup, groups)))
    conc = blocks / blocks_per_request(setup, groups)
    if setup.vllm_version < TOKENS_FROM_CONCURRENCY:
        return blocks // len(groups.kinds) * groups.block_size, blocks, conc
    return int(conc * setup.max_model_len), blocks, conc


def _attn_share(setup: Setup) -> float:
    m = setup.model
    return (m.attention_layers or m.num_layers) / m.num_layers


def blocks_per_request(setup: Setup, groups: _Groups | None = None) -> int:
    """Blocks one request of max_model_len takes across all groups (vLLM's
    get_max_concurrency_for_kv_cache_config: cdiv of summed per-group bytes by the page)."""
    groups = groups or kv_groups(setup)
    if setup.v0:
        return math.ceil(setup.max_model_len / groups.block_size)
    total = 0
    for kind in groups.kinds:
        if kind in (MAMBA, LINEAR):
            total += groups.page_bytes * state_blocks(setup, kind)
        else:
            total += _blocks_for_bs(setup, kind, groups.block_size_of(kind)) * groups.page_bytes
    return math.ceil(total / groups.page_bytes)


def state_blocks(setup: Setup, kind: str) -> int:
    """Blocks one request holds in a Mamba / linear-attention group (MambaSpec
    max_memory_usage_bytes): its state; with prefix caching (Mamba cache mode 'align') the running
    state and the last block-boundary one, plus a prefill checkpoint for Mamba2 mixers. Checked on
    real vLLM 0.32: 2 per gated-delta-net layer (Qwen3-Next) and per short convolution (LFM2),
    3 per Mamba2 layer (Nemotron-H)."""
    if setup.v0 or not setup.enable_prefix_caching:
        return 1
    # Mamba2 is the mixer whose state has B/C groups; Mamba1's and LFM2's short convolutions' have none
    state = setup.model.state
    mamba2 = kind == MAMBA and state is not None and state.groups > 0
    return 3 if mamba2 and setup.vllm_version >= MAMBA2_PREFILL_CHECKPOINT else 2


def _blocks_for_bs(setup: Setup, kind: str, bs: int) -> int:
    n = math.ceil(_max_tokens_per_layer(setup, kind) / bs)
    return n + 1 if kind == SLIDING and setup.model.sliding_window else n


def largest_max_model_len(setup: Setup, blocks: int, groups: _Groups | None = None) -> int:
    """Binary search for the longest max_model_len whose one request fits `blocks` (0 if none)."""
    groups = groups or kv_groups(setup)
    lo, hi, best = 1, setup.max_model_len, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if blocks_per_request(setup.with_(max_model_len=mid), groups) <= blocks:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
