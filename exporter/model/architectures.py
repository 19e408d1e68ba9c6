"""Model architectures: what the capacity and speed model needs to know about a checkpoint.

Why: KV bytes per token, weight bytes and step FLOPs are closed-form functions of a handful of
config.json fields (layers, heads, KV heads, head size, MLA ranks, sliding windows, experts), so
we read exactly those, from a user's local config.json or from the built-in catalog
(`data/models.yaml`, stored in config.json's own key names so one reader serves both).
Parameter counts are derived from the same fields; multimodal towers come from the catalog.
"""
from __future__ import annotations

import difflib
import math
import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

from exporter import yamlfile
from exporter.errors import CatalogError, InputError
from exporter.model.vision import VisionTower, vision_tower
from exporter.model.weights import WeightInfo

FULL, SLIDING, CHUNKED, MAMBA, LINEAR = "full", "sliding", "chunked", "mamba", "linear"
# a layer with no token mixer, only an MLP or MoE block (Nemotron-H's "-" and "E" layers): no KV
# cache, no recurrent state, no attention weights
FFN = "ffn"

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_ds_mla": 1, "int8": 1}

# Bytes per parameter of a quantised linear layer (weights + scales), by scheme. Sources:
# fp8/w8a8 one byte plus per-channel scales; w4a16/GPTQ/AWQ 4 bits plus an fp16 scale (and for AWQ
# a 4-bit zero) per 128-weight group; MXFP4 4 bits plus one e8m0 scale per 32; NVFP4 4 bits plus an
# fp8 scale per 16 (OCP MX spec / NVIDIA NVFP4 format).
QUANT_BYTES_PER_PARAM = {
    None: None, "fp8": 1.0, "w8a8": 1.0, "int8": 1.0, "w8a16": 1.0 + 2 / 128, "gptq-int8": 1.0 + 2 / 128,
    "w4a16": 0.5 + 2 / 128, "gptq": 0.5 + 2 / 128, "awq": 0.5 + 2.5 / 128,
    "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "fp4": 0.5 + 1 / 16,
}
QUANT_ALIASES = {
    "fp8": "fp8", "fp8-dynamic": "fp8", "fp8_dynamic": "fp8", "fbgemm_fp8": "fp8", "modelopt": "fp8",
    "w8a8": "w8a8", "int8": "w8a8", "compressed-tensors-w8a8": "w8a8", "smoothquant": "w8a8",
    "w4a16": "w4a16", "gptq": "gptq", "gptq_marlin": "gptq", "gptq-int4": "gptq", "marlin": "gptq",
    "awq": "awq", "awq_marlin": "awq", "w8a16": "w8a16", "gptq-int8": "gptq-int8",
    "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp4": "nvfp4", "modelopt_fp4": "nvfp4",
    "ptpc_fp8": "fp8", "fp8_e4m3": "fp8", "experts_int8": "w8a16", "bitsandbytes": "w4a16",
    "compressed_tensors": "w8a8", "compressed-tensors": "w8a8", "auto-round": "gptq", "auto_round": "gptq",
    "none": None, "auto": None, "": None,
}


def known_quantization(name: str) -> bool:
    """Whether `normalize_quantization` takes `name`."""
    return name.strip().lower() in QUANT_ALIASES


def normalize_quantization(name: str | None) -> str | None:
    """Map a quantization flag/method name to one of QUANT_BYTES_PER_PARAM's keys."""
    if name is None:
        return None
    key = name.strip().lower()
    if key in QUANT_ALIASES:
        return QUANT_ALIASES[key]
    raise InputError(f"unknown quantization {name!r}; known: "
                     + ", ".join(sorted(k for k in QUANT_ALIASES if k)))


@dataclass(frozen=True)
class RecurrentState:
    """The per-request state of one Mamba / linear-attention layer, as vLLM shapes it
    (model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator): a convolution
    window over `conv_channels` (+ the B/C groups of Mamba2) and a temporal state, both split over
    TP ranks; Mamba2's groups are replicated up to the TP size when it does not divide them
    (`extra_groups_for_head_shards`)."""
    conv_channels: int          # channels of the conv window besides the groups
    conv_width: int             # conv kernel - 1
    temporal: int               # temporal (SSM / delta-rule) state elements
    groups: int = 0             # Mamba2 n_groups
    group_channels: int = 0     # conv channels per group (2 x d_state: B and C)
    conv_bytes: int = 2         # the conv state's dtype (the model's)
    temporal_bytes: int = 2     # the temporal state's (the model's; Nemotron-H's, Qwen3.5's as it names it)
    proj_params: int = 0        # the mixer's linear parameters (0: not derived)
    # the mixer's other parameters, kept in the model dtype: conv weights and biases, A, D, dt
    # biases, its norm
    other_params: int = 0
    # Nemotron-H and Qwen3.5: vLLM takes the temporal state's dtype from the config (a dtype
    # name) or, for Nemotron-H when it names none, a default of the release (True); see
    # setup.NEMOTRON_SSM_FROM_CONFIG
    ssm_dtype_from_config: str | bool = False

    def bytes_per_rank(self, tp: int = 1, *, conv_bytes: int | None = None,
                       temporal_bytes: int | None = None) -> int:
        tp = max(int(tp), 1)
        conv_bytes = self.conv_bytes if conv_bytes is None else conv_bytes
        temporal_bytes = self.temporal_bytes if temporal_bytes is None else temporal_bytes
        groups = self.groups
        if groups and groups % tp:
            groups = tp          # n_groups + (tp - n_groups): replicated alongside the heads
        conv = self.conv_width * math.ceil((self.conv_channels + groups * self.group_channels) / tp)
        return conv * conv_bytes + math.ceil(self.temporal / tp) * temporal_bytes


@dataclass(frozen=True)
class KVShape:
    """The attention shape of one layer kind when it is not the model's (num_kv_heads x head_dim,
    V as wide as K): vLLM builds an AttentionSpec per layer from it (head_size, head_size_v) and
    unifies pages of different sizes by block size (kv_cache_utils.unify_kv_cache_spec_page_size)."""

    kind: str
    kv_heads: int
    head_dim: int          # K (and Q) head width
    v_head_dim: int
    # one projection feeds K and V (Gemma 4's attention_k_eq_v full layers): fewer weights, but
    # the cache still holds K and V (gemma4.py copies K into the V slot)
    k_eq_v: bool = False


@dataclass(frozen=True)
class ModelArch:
    """The architecture fields of one model (one language model; towers only as a count)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    attention: str = "gqa"                 # "mha" | "gqa" | "mla"
    # MLA (DeepSeek-V2/V3, Kimi): the cached latent is kv_lora_rank + qk_rope_head_dim per token
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2, GLM-5: configs with
    # index_topk): per MLA layer a cache of one fp8 key of indexer_head_dim per token beside the
    # latent, and its own projections (deepseek_v2.py Indexer)
    indexer_head_dim: int = 0
    indexer_heads: int = 0
    # multi-token-prediction layers the checkpoint carries beside the decoder (config.json's
    # num_nextn_predict_layers: DeepSeek-V3, GLM, MiMo): loaded only as `--speculative-config`'s
    # mtp drafter (drafter.py); vLLM skips their weights otherwise
    mtp_layers: int = 0
    # per-layer attention kind (FULL, SLIDING, CHUNKED, MAMBA, LINEAR, FFN), length num_layers
    layer_types: tuple[str, ...] = ()
    sliding_window: int = 0
    attention_chunk_size: int = 0
    kind_shapes: tuple[KVShape, ...] = ()  # per layer kind, where it departs from the model's
    # the last N layers attend over the KV of an earlier layer and hold no cache of their own
    # (Gemma 3n / Gemma 4 num_kv_shared_layers: no KV spec in vLLM for them)
    kv_shared_layers: int = 0
    # layers whose block is the token mixer alone, with no MLP (Nemotron-H's "M" and "*",
    # Nemotron-NAS blocks whose ffn is a no-op)
    mixer_only_layers: tuple[int, ...] = ()
    # the MLP width of each layer where layers differ (Nemotron-NAS / DeciLM `block_configs`:
    # one ffn_mult per layer); () when every dense MLP is intermediate_size wide
    mlp_widths: tuple[int, ...] = ()
    # Per-Layer Embeddings (Gemma 3n; Gemma 4 when it is non-zero), `hidden_size_per_layer_input` wide: a
    # second table of `vocab_size_per_layer_input` x (num_layers x width) that each token gathers
    # from (held, never read whole in a step), a projection of the embedded token to the
    # layers' inputs, and in every layer a gate to the width and a projection back, both
    # ReplicatedLinear (gemma3n.py, gemma4.py): every TP rank holds and reads them whole
    ple_width: int = 0
    ple_vocab: int = 0
    # Gemma 3n's AltUp (altup_num_inputs streams of the hidden state: 2 x (n - 1) hidden x hidden
    # projections around the layers, a router per layer) and LAuReL (a rank-r residual per layer)
    altup_inputs: int = 0
    laurel_rank: int = 0
    # every layer runs attention and a Mamba2 mixer side by side, each with its own cache
    # (Falcon-H1: FalconH1ParallelHybrid in vLLM's falcon_h1.py)
    parallel_mixers: bool = False
    # q_proj also yields a sigmoid gate on the attention output, as wide as the query
    # (Qwen3-Next, Qwen3.5: attn_output_gate, qwen3_next.py)
    attn_output_gate: bool = False
    state: RecurrentState | None = None    # Mamba / linear-attention state, when the model has it
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0                # count of shared experts of moe_intermediate_size
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()       # indices of MoE layers
    # width the routed experts work in when it is not hidden_size: a latent MoE projects each
    # token down to it and back up (Nemotron-3 Super's moe_latent_size; nemotron_h.py in vLLM)
    moe_latent_size: int = 0
    rotary_dim: int = 0                    # rotary dims per head (cos/sin cache width)
    # positions x width of every rotary cos/sin cache vLLM builds (get_rope keeps one per distinct
    # rope): 0 means the one cache of max_position_embeddings x rotary_dim (`rope_cache_size`)
    rope_cache_elements: int = 0
    # LongRoPE (Phi-3/3.5/4 128k, rope type longrope or its old name su): the config's
    # original_max_position_embeddings, which vLLM takes as the default max_model_len from 0.11.1
    # (vllm PR #27431: short vs long factors chosen once, from max_model_len); 0 for other ropes
    longrope_original_max_len: int = 0
    # config.json names a length (max_position_embeddings or another key): without one vLLM takes a
    # --max-model-len as given, where it refuses one above the derived length otherwise
    length_in_config: bool = True
    extra_params: int = 0                  # vision tower etc., kept in native dtype
    # the vision encoder's geometry, where vLLM's profile run encodes dummy images that this
    # project models (vision.py); None for text-only models and towers not modelled
    vision: VisionTower | None = None
    native_dtype: str = "bfloat16"
    quantization: str | None = None
    # generation_config.json sets top_k/top_p: vLLM applies these defaults to requests that do not
    # set their own (`--generation-config auto`), and its top-k/top-p sampler then sorts the whole
    # vocabulary of every request each step (v1/sample/ops/topk_topp_sampler.py)
    sampling_sorts: bool = False
    # KV cache format the checkpoint asks for (ModelOpt `kv_cache_quant_algo`, compressed-tensors
    # `kv_cache_scheme`): vLLM resolves --kv-cache-dtype auto to it
    # (vllm/utils/torch_utils.py resolve_kv_cache_dtype_string); None: the model dtype
    kv_cache_quant: str | None = None
    # the linear layers the checkpoint's scheme leaves in the model dtype (QUANT_SKIP_PARTS:
    # "attention", "shared_experts", "dense_mlp"), from its quantization_config's ignore /
    # exclude_modules / modules_to_not_convert; read every step at 16 bits however small the
    # experts are (Kimi-K2.5's INT4 release: only the routed experts are 4-bit)
    quant_skip: frozenset = frozenset()
    # exact tensor bytes from the checkpoint's safetensors headers, when the resolver found them
    weights: WeightInfo | None = None
    source: str = field(default="", compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)   # how the config was read

    # ---- derived counts -------------------------------------------------------------------
    @property
    def rope_cache_size(self) -> int:
        """Elements of the rotary cos/sin caches, held in the model dtype on every rank."""
        return self.rope_cache_elements or self.max_position_embeddings * self.rotary_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.layer_types)) > 1

    def kv_shape(self, kind: str = FULL) -> KVShape:
        """The attention shape of layers of `kind` (MLA: the model's fields are used as they are)."""
        for shape in self.kind_shapes:
            if shape.kind == kind:
                return shape
        return KVShape(kind, self.num_kv_heads, self.head_dim, self.head_dim)

    @property
    def cache_layer_types(self) -> tuple[str, ...]:
        """Kinds of the layers that hold a cache, in order: every layer but the MLP-only ones and
        the KV-shared tail."""
        types = (self.layer_types or (FULL,) * self.num_layers)[:self.num_layers - self.kv_shared_layers]
        types = tuple(t for t in types if t != FFN) or (FULL,) * self.num_layers
        return types + (MAMBA,) * self.num_layers if self.parallel_mixers else types

    @property
    def state_layers(self) -> int:
        """Layers with a Mamba / linear-attention mixer (every layer when they run beside attention)."""
        return sum(1 for i in range(self.num_layers) if self.has_mixer(i))

    def attention_params_per_layer(self, layer: int | None = None) -> int:
        h = self.hidden_size
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
                 if self.q_lora_rank else h * self.num_heads * qk)
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * self.num_heads * (
                self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.num_heads * self.v_head_dim * h + self.indexer_params()
        kind = self.layer_types[layer] if layer is not None and self.layer_types else FULL
        shape = self.kv_shape(kind)
        q = h * self.num_heads * shape.head_dim * (2 if self.attn_output_gate else 1)
        kv = h * shape.kv_heads * (shape.head_dim + (0 if shape.k_eq_v else shape.v_head_dim))
        if layer is not None and layer >= self.num_layers - self.kv_shared_layers:
            kv = 0    # a KV-shared layer has q_proj alone (gemma4.py), its K and V are another layer's
        return q + kv + self.num_heads * shape.v_head_dim * h

    @property
    def indexer_cache_bytes(self) -> int:
        """Bytes one token's indexer key takes in one layer: head_dim fp8 values and a float32
        scale per 128 (DeepseekV32IndexerCache, quant_block_size 128); 0 without an indexer."""
        return self.indexer_head_dim + self.indexer_head_dim // 128 * 4

    def indexer_params(self) -> int:
        """One layer's lightning-indexer weights: wq_b (q LoRA rank -> heads x head_dim), wk and
        weights_proj (hidden -> head_dim + heads), k_norm (a LayerNorm); all replicated."""
        if not self.indexer_head_dim:
            return 0
        d, n = self.indexer_head_dim, self.indexer_heads
        return self.q_lora_rank * n * d + self.hidden_size * (d + n) + 2 * d

    def is_mixer(self, layer: int) -> bool:
        """Layer `layer` is a Mamba / linear-attention mixer (no KV cache, no attention weights)."""
        return bool(self.layer_types) and self.layer_types[layer] in (MAMBA, LINEAR)

    def has_mixer(self, layer: int) -> bool:
        """Layer `layer` runs a Mamba / linear-attention mixer: in place of attention, or beside it
        (`parallel_mixers`)."""
        return self.parallel_mixers or self.is_mixer(layer)

    def has_attention(self, layer: int) -> bool:
        """Layer `layer` attends (and so has a KV cache): not a recurrent mixer, not MLP-only."""
        return not self.layer_types or self.layer_types[layer] not in (MAMBA, LINEAR, FFN)

    def has_mlp(self, layer: int) -> bool:
        """Layer `layer` carries an MLP or MoE block after its mixer."""
        return layer not in self.mixer_only_layers

    @property
    def attention_layers(self) -> int:
        """Layers with attention (every layer but the recurrent mixers and the MLP-only ones)."""
        return sum(1 for i in range(self.num_layers) if self.has_attention(i))

    def state_bytes(self, tp: int = 1) -> int:
        """Recurrent state of one request in one Mamba / linear-attention layer on one of `tp`
        ranks (vLLM's MambaSpec page before padding), 0 without such layers."""
        return self.state.bytes_per_rank(tp) if self.state else 0

    @property
    def state_bytes_per_layer(self) -> int:
        """The whole recurrent state of one request in one layer (all ranks together)."""
        return self.state_bytes(1)

    def replicated_linear_params(self) -> int:
        """Linear parameters every TP rank holds whole, summed over all layers: MLA's
        down-projections (`fused_qkv_a_proj` = q_a + kv_a, or `kv_a_proj_with_mqa` alone without a
        q LoRA) are built with `disable_tp=True` / `ReplicatedLinear` in vLLM's deepseek_v2.py, so
        each rank reads all of them every step (Kimi-K2.5: 0.92 B parameters, 1.85 GB at 16 bits
        on every GPU of a TP8 group, not 0.23); so are a latent MoE's down and up projections
        (`fc1_latent_proj` / `fc2_latent_proj`, ReplicatedLinear in nemotron_h.py), and the
        per-layer-input gate and projection of Per-Layer Embeddings (gemma3n.py, gemma4.py)."""
        whole = len(self.moe_layers) * self.latent_proj_params() + self.num_layers * self.ple_layer_params()
        if self.attention != "mla":
            return whole
        per_layer = self.hidden_size * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)
        return (per_layer + self.indexer_params()) * self.attention_layers + whole

    def ple_layer_params(self) -> int:
        """One layer's per-layer-input gate and projection (0 without Per-Layer Embeddings)."""
        return 2 * self.hidden_size * self.ple_width

    @property
    def ple_embedding_params(self) -> int:
        """The Per-Layer Embedding table: gathered per token, so held but not read in a step."""
        return self.ple_vocab * self.num_layers * self.ple_width

    @property
    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2     # gate, up, down; or up, down (relu2, gelu)

    def mlp_width(self, layer: int) -> int:
        """Intermediate width of layer `layer`'s dense MLP."""
        return self.mlp_widths[layer] if self.mlp_widths else self.intermediate_size

    def dense_mlp_params(self, layer: int = 0) -> int:
        """Parameters of layer `layer`'s dense MLP (any layer's where widths do not differ)."""
        return self._mlp_matrices * self.hidden_size * self.mlp_width(layer)

    def expert_params(self) -> int:
        """Parameters of one routed expert (in the latent width for a latent MoE)."""
        return self._mlp_matrices * (self.moe_latent_size or self.hidden_size) * self.moe_intermediate_size

    def latent_proj_params(self) -> int:
        """A latent MoE layer's projections to the experts' width and back."""
        return 2 * self.hidden_size * self.moe_latent_size if self.moe_latent_size else 0

    @property
    def shared_expert_width(self) -> int:
        """Intermediate width of an MoE layer's always-on shared experts (0: none)."""
        return self.shared_experts * self.moe_intermediate_size + self.shared_expert_intermediate_size

    def shared_expert_params(self) -> int:
        return self._mlp_matrices * self.hidden_size * self.shared_expert_width

    @property
    def activation_width(self) -> int:
        """Activation elements one token passes through, summed over the layers: the residual
        stream (hidden) plus the MLP width it activates (a dense MLP's intermediate size; in an
        MoE layer the top-k experts' and the shared experts' width; a Mamba / linear-attention
        mixer's inner width, 2 x hidden [approximation]). The norms, residual adds, rotary,
        activation function and activation quantization between a layer's GEMMs read and write
        about this much per token, so it sets the per-token GPU work
        (`perf.Shape.activation_width_m`)."""
        moe = set(self.moe_layers)
        width = 0
        for i in range(self.num_layers):
            width += self.hidden_size
            if self.has_mixer(i):
                width += 2 * self.hidden_size
            if i in moe:
                width += self.experts_per_token * self.moe_intermediate_size + self.shared_expert_width
            elif self.has_mlp(i):
                width += self.mlp_width(i)
        return width

    def mixer_params(self) -> int:
        """Linear parameters of one Mamba / linear-attention mixer."""
        if self.state and self.state.proj_params:
            return self.state.proj_params
        # in/out projections of a mixer with inner width 2 x hidden [approximation]
        return 6 * self.hidden_size * self.hidden_size

    def unquantized_linear_params(self, parts: frozenset) -> int:
        """Linear parameters of `parts` (QUANT_SKIP_PARTS), summed over all layers: those a
        quantized checkpoint keeps in the model dtype."""
        if not parts:
            return 0
        n = 0
        moe = set(self.moe_layers)
        for i in range(self.num_layers):
            if "attention" in parts and self.has_attention(i):
                n += self.attention_params_per_layer(i)
            if i in moe:
                n += self.shared_expert_params() if "shared_experts" in parts else 0
            elif "dense_mlp" in parts and self.has_mlp(i):
                n += self.dense_mlp_params(i)
        return n

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def layer_params(self) -> tuple[int, int, int]:
        """(linear params that quantisation applies to, routed-expert params among them,
        params kept in native dtype such as norms and routers), summed over all layers, with the
        model-level linears beside them (Per-Layer Embeddings' projection, AltUp's)."""
        h = self.hidden_size
        linear = h * self.num_layers * self.ple_width + 2 * max(self.altup_inputs - 1, 0) * h * h
        experts = other = 0
        moe = set(self.moe_layers)
        for i in range(self.num_layers):
            other += 2 * self.hidden_size
            linear += self.ple_layer_params() + 2 * h * self.laurel_rank
            if self.altup_inputs > 1:   # the router; its prediction and correction coefficients
                other += h * self.altup_inputs + self.altup_inputs ** 3 + self.altup_inputs ** 2
            if self.has_mixer(i):
                linear += self.mixer_params()
                other += self.state.other_params if self.state else 0
            if self.has_attention(i):
                linear += self.attention_params_per_layer(i)
            if i in moe:
                e = self.num_experts * self.expert_params()
                linear += e + self.shared_expert_params() + self.latent_proj_params()
                experts += e
                other += self.hidden_size * self.num_experts
            elif self.has_mlp(i):
                linear += self.dense_mlp_params(i)
        return linear, experts, other

    @property
    def total_params(self) -> int:
        linear, _, other = self.layer_params()
        return (linear + other + self.embedding_params + self.lm_head_params + self.ple_embedding_params
                + self.extra_params)

    @property
    def active_params(self) -> int:
        """Parameters touched per token: everything except the routed experts not chosen."""
        if not self.is_moe:
            return self.total_params - self.extra_params
        idle = len(self.moe_layers) * (self.num_experts - self.experts_per_token) * self.expert_params()
        return self.total_params - self.extra_params - idle

    @property
    def weight_bytes(self) -> int | None:
        """Bytes the checkpoint's weights take once loaded in the model's own dtype (packed
        quantized tensors and scales as stored), from the safetensors headers; None when they were
        not read. kv_cache.weights_bytes scales its derived total by this (_checkpoint_scale)."""
        w = self.weights
        if w is None:
            return None
        native = DTYPE_BYTES.get(self.native_dtype, 2)
        return w.lm_bytes(native) + (w.tower_params + w.embedding_params) * native

    def checkpoint_lm_bytes(self, native_bytes: int) -> int | None:
        """Language-model layer bytes (no embeddings, no towers) from the safetensors headers,
        or None when the checkpoint's headers were not read."""
        return self.weights.lm_bytes(native_bytes) if self.weights is not None else None

    def with_quantization(self, quantization: str | None, name: str | None = None) -> "ModelArch":
        """The entry as a checkpoint quantized to `quantization` (named by its id: `-NVFP4`,
        `-AWQ`...). An NVFP4 checkpoint is ModelOpt's, which names an FP8 KV cache (see
        setup._resolve_kv_dtype)."""
        if quantization == "nvfp4":
            kv = self.kv_cache_quant or "fp8"
        else:   # another checkpoint: its own KV scheme is not this one's
            kv = self.kv_cache_quant if quantization == self.quantization else None
        return replace(self, quantization=quantization, name=name or self.name, kv_cache_quant=kv,
                       quant_skip=unquantized_parts(self, quantization))


QUANT_SKIP_PARTS = ("attention", "shared_experts", "dense_mlp")


def unquantized_parts(arch: ModelArch, quantization: str | None) -> frozenset:
    """The linear parts a checkpoint of `arch` quantized with `quantization` keeps in the model
    dtype. The model's own checkpoint says (`arch.quant_skip`, from its config.json). Another
    scheme names another checkpoint: an NVFP4 one of an MoE model is ModelOpt's, whose releases
    leave self-attention in 16 bits (`exclude_modules` of nvidia/MiniMax-M2.5-NVFP4 and
    nvidia/Kimi-K2.5-NVFP4: every layer's `self_attn*`; the experts, shared ones included, are
    FP4); a dense model's NVFP4 release and vLLM's runtime quantization (`--quantization fp8`
    quantizes every linear layer, Fp8LinearMethod) keep nothing back."""
    if not quantization:
        return frozenset()
    if quantization == arch.quantization:
        return arch.quant_skip
    if quantization == "nvfp4" and arch.is_moe:
        return frozenset({"attention"})
    return frozenset()


_DENSE_MLP_PATTERN = re.compile(r"mlp\.\(?(gate_up|gate|up|down)(_proj|\|)")
_ATTENTION_PATTERN = re.compile(r"self_attn|(^|\.)(attn|attention)(\.|\*|$)")


def quant_skip_from_config(cfg: Mapping[str, Any]) -> frozenset:
    """QUANT_SKIP_PARTS the checkpoint's quantization_config leaves unquantized: compressed-
    tensors `ignore`, ModelOpt `exclude_modules`, HF/AWQ `modules_to_not_convert` (names or
    `re:` patterns). A part counts when any pattern names it (ModelOpt lists every layer's
    `self_attn*`); routers, norms and lm_head are outside the linear layers counted anyway."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, Mapping):
        return frozenset()
    patterns: list = []
    for src in (qc, qc.get("quantization") if isinstance(qc.get("quantization"), Mapping) else {}):
        for key in ("ignore", "exclude_modules", "modules_to_not_convert"):
            if isinstance(src.get(key), (list, tuple)):
                patterns += [str(x) for x in src[key]]
    parts = set()
    for p in patterns:
        s = p.lower().replace("\\", "")
        if "expert" not in s and "norm" not in s and _ATTENTION_PATTERN.search(s):
            parts.add("attention")
        if "shared_expert" in s:
            parts.add("shared_experts")
        if "expert" not in s and _DENSE_MLP_PATTERN.search(s):
            parts.add("dense_mlp")
    return frozenset(parts)


# ---- reading config.json ------------------------------------------------------------------

_LM_KEYS = ("text_config", "language_config", "llm_config")
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def _need(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    raise CatalogError(f"{where}: missing field {keys[0]!r} in config.json")


def _rope_parameters(cfg: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The config's rope parameters by layer type: transformers 5 nests them per layer type
    (`rope_parameters: {full_attention: {...}, sliding_attention: {...}}`), older configs have one
    `rope_scaling` dict (keyed "" here)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        return {}
    if rope and all(isinstance(v, Mapping) for v in rope.values()):
        return {str(k): v for k, v in rope.items()}
    return {"": rope}


def _rope_type(rope: Mapping[str, Any]) -> str:
    """A rope's type, under either key configs use ("" when it names none)."""
    return str(rope.get("rope_type") or rope.get("type") or "")


# LongRoPE under its name and its older one (Phi-3-medium-128k's config says su)
LONGROPE_TYPES = ("longrope", "su")
# rope types whose vLLM cache spans max_position x factor positions (LinearScalingRotaryEmbedding,
# DynamicNTKScalingRotaryEmbedding); yarn's spans original_max_position_embeddings x factor
_ROPE_SCALED_CACHE = ("linear", "dynamic")


def _rope_cache_elements(cfg: Mapping[str, Any], model_type: str, ropes: Mapping[str, Mapping[str, Any]],
                         config_max_pos: int, head_dim: int) -> int:
    """Positions x width of the rotary caches vLLM's get_rope builds, one per distinct rope
    (rotary_embedding/__init__.py caches them by their parameters), in the model dtype. 0: the
    one cache of the derived max_model_len x rotary_dim, which is what a single rope of any type
    holds (linear and dynamic: max_position x factor; yarn: original x factor).

    Gemma 3 and 4 run a rope per layer kind (gemma3.py, gemma4.py): the sliding layers a default
    rope (Gemma 3: at rope_local_base_freq), the full layers the config's, over
    max_position_embeddings positions each, a linear rope times its factor. Gemma 3 4B-27B's full
    rope is linear x8 over 128K positions: 1M positions, 512 MiB at head 256 (llm-d-planner's vLLM
    0.19 startups: "Model loading took" 8.58 / 23.31 / 51.45 GiB for gemma-3-4b/12b/27b-it, 0.51 /
    0.56 / 0.33 GiB over the parameters). Gemma 4's full rope (proportional, partial) caches the
    whole global_head_dim (Gemma4RotaryEmbedding sets rotary_dim = head_size)."""
    if not model_type.startswith(("gemma3", "gemma4")):
        return 0
    theta = cfg.get("rope_theta")
    if "sliding_attention" in ropes:
        local = dict(ropes["sliding_attention"])
    elif cfg.get("rope_local_base_freq"):
        local = {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    else:
        return 0
    glob = dict(ropes.get("full_attention") or ropes.get("") or {})
    full_width = int(cfg.get("global_head_dim") or 512) if model_type.startswith("gemma4") else head_dim

    caches: dict[tuple, int] = {}       # keyed by the rope's parameters, as _ROPE_DICT shares them
    for rope, width in ((local, head_dim), (glob, full_width)):
        kind, factor = _rope_type(rope) or "default", float(rope.get("factor") or 1.0)
        key = (kind, float(rope.get("rope_theta") or theta or 10000.0), factor, width)
        caches[key] = int(config_max_pos * (factor if kind in _ROPE_SCALED_CACHE else 1.0)) * width
    return sum(caches.values())


def _longrope_original(cfg: Mapping[str, Any], ropes: Mapping[str, Mapping[str, Any]], max_pos: int) -> int:
    """original_max_position_embeddings of a LongRoPE config (vLLM reads it from the config's top
    level, else from the rope parameters, else keeps the derived length), 0 without LongRoPE."""
    if not any(_rope_type(r) in LONGROPE_TYPES for r in ropes.values()):
        return 0
    inner = next((r.get("original_max_position_embeddings") for r in ropes.values()
                  if r.get("original_max_position_embeddings")), None)
    return int(cfg.get("original_max_position_embeddings") or inner or max_pos)


def _opt(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _mamba_mixers(cfg: Mapping[str, Any]) -> bool:
    """The config describes Mamba mixers (mamba_* or ssm_state_size keys), not gated delta nets
    (linear_* keys: Qwen3-Next, Qwen3.5)."""
    return not any(str(k).startswith("linear_") and k != "linear_attention" for k in cfg) and \
        any(str(k).startswith("mamba_") or k == "ssm_state_size" for k in cfg)


@dataclass(frozen=True)
class _NasBlocks:
    """What a Nemotron-NAS (DeciLM) config's per-layer `block_configs` say."""

    types: tuple[str, ...]       # FULL where the layer attends, FFN where its attention is a no-op
    widths: tuple[int, ...]      # each layer's MLP intermediate width (0 where the MLP is a no-op)
    kv_heads: int

    @property
    def mlp_less(self) -> tuple[int, ...]:
        """Layers whose MLP is a no-op."""
        return tuple(i for i, w in enumerate(self.widths) if not w)


def _nas_blocks(cfg: Mapping[str, Any], n: int, hidden: int, heads: int, where: str) -> _NasBlocks:
    """Read `block_configs` as vLLM's nemotron_nas.py builds the layers: a layer whose attention
    is `no_op` has no attention module (so no KV cache, and vLLM's ModelConfig counts only the
    others as attention layers), its KV heads are num_attention_heads / n_heads_in_group, and
    its MLP is round_up(int(2 x ffn_mult x hidden / 3), 256) wide (`_ffn_mult_to_intermediate_size`)."""
    blocks = cfg["block_configs"]
    if len(blocks) != n:
        raise CatalogError(f"{where}: block_configs has {len(blocks)} entries, expected {n}")
    types, widths, groups = [], [], set()
    for i, b in enumerate(blocks):
        attn = (b or {}).get("attention") or {}
        ffn = (b or {}).get("ffn") or {}
        if attn.get("replace_with_linear") or ffn.get("replace_with_linear"):
            raise CatalogError(f"{where}: block_configs[{i}] replaces a block with a linear layer, "
                               "which this reader does not describe")
        if attn.get("no_op"):
            types.append(FFN)
        else:
            g = attn.get("n_heads_in_group")
            if not isinstance(g, int) or g < 1 or heads % g:
                raise CatalogError(f"{where}: block_configs[{i}].attention.n_heads_in_group {g!r} "
                                   f"should divide num_attention_heads {heads}")
            groups.add(g)
            types.append(FULL)
        if ffn.get("no_op"):
            widths.append(0)
        else:
            mult = ffn.get("ffn_mult")
            if not isinstance(mult, (int, float)) or mult <= 0:
                raise CatalogError(f"{where}: block_configs[{i}].ffn.ffn_mult {mult!r} should be a positive number")
            widths.append(math.ceil(int(2 * mult * hidden / 3) / 256) * 256)
    if len(groups) != 1:
        raise CatalogError(f"{where}: block_configs' attention layers have "
                           + (f"n_heads_in_group {sorted(groups)}: KV heads that differ by layer are not described"
                              if groups else "no attention layer"))
    return _NasBlocks(tuple(types), tuple(widths), heads // groups.pop())


def _layer_types(cfg: Mapping[str, Any], model_type: str, n: int, where: str) -> tuple[str, ...]:
    kinds = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
             "chunked_attention": CHUNKED, "linear_attention": LINEAR, "mamba": MAMBA,
             "mamba2": MAMBA, "conv": MAMBA}   # conv: LFM2's short convolutions, a state like Mamba's
    if model_type in LFM2_TYPES and not isinstance(cfg.get("layer_types"), list) \
            and isinstance(cfg.get("full_attn_idxs"), list):
        # LFM2's first configs list the attention layers; the config class makes the others
        # short convolutions (configuration_lfm2.py)
        attn = set(cfg["full_attn_idxs"])
        return tuple(FULL if i in attn else MAMBA for i in range(n))
    if isinstance(cfg.get("layer_types"), list):
        raw = cfg["layer_types"]
        if len(raw) != n:
            raise CatalogError(f"{where}: layer_types has {len(raw)} entries, expected {n}")
        if _mamba_mixers(cfg):   # transformers 5 names Mamba layers linear_attention (Granite 4)
            kinds = {**kinds, "linear_attention": MAMBA}
        return tuple(kinds.get(str(t), FULL) for t in raw)
    if isinstance(cfg.get("hybrid_layer_pattern"), list):
        # MiMo-V2: 1 = sliding-window layer, 0 = full attention (mimo_v2.py is_compressed_softmax_layer)
        raw = cfg["hybrid_layer_pattern"]
        if len(raw) != n:
            raise CatalogError(f"{where}: hybrid_layer_pattern has {len(raw)} entries, expected {n}")
        return tuple(SLIDING if int(t) == 1 else FULL for t in raw)
    if isinstance(cfg.get("layer_types_pattern"), list):  # catalog shorthand: repeat the pattern
        pat = [kinds.get(str(t), FULL) for t in cfg["layer_types_pattern"]]
        return tuple(pat[i % len(pat)] for i in range(n))
    window = cfg.get("sliding_window")
    if model_type == "gemma2" and window:
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))
    if model_type in ("gemma3_text", "gemma3", *GEMMA3N_TYPES) and window:
        # Gemma 3n's config class fills in one full layer in five (configuration_gemma3n.py)
        every = int(cfg.get("sliding_window_pattern") or (5 if model_type in GEMMA3N_TYPES else 6))
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(n))
    if model_type in ("llama4_text", "llama4") and cfg.get("attention_chunk_size"):
        if isinstance(cfg.get("no_rope_layers"), list) and len(cfg["no_rope_layers"]) == n:
            return tuple(CHUNKED if use_rope else FULL for use_rope in cfg["no_rope_layers"])
        every = int(cfg.get("no_rope_layer_interval") or 4)
        return tuple(FULL if (i + 1) % every == 0 else CHUNKED for i in range(n))
    if model_type in ATTENTION_FREE_TYPES:
        return (MAMBA,) * n
    if model_type in GDN_TYPES:
        # Qwen3-Next / Qwen3.5 without layer_types: the config class fills them in, one full
        # attention layer every full_attention_interval (default 4), gated delta nets between
        # (transformers' configuration_qwen3_next.py / _qwen3_5.py, vLLM's configs/qwen3_5.py)
        every = int(cfg.get("full_attention_interval") or 4)
        return tuple(FULL if (i + 1) % every == 0 else LINEAR for i in range(n))
    if isinstance(cfg.get("attn_layer_indices"), list) or isinstance(cfg.get("attn_layer_period"), int):
        # Jamba-style hybrids: attention only at listed/periodic layers, Mamba elsewhere
        if isinstance(cfg.get("attn_layer_indices"), list):
            attn = set(cfg["attn_layer_indices"])
        else:
            period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset") or 0)
            attn = {i for i in range(n) if i % period == offset}
        return tuple(FULL if i in attn else MAMBA for i in range(n))
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        # Nemotron-H: one block per layer, M = Mamba2 mixer, * = attention, - = MLP, E = MoE
        pat = cfg["hybrid_override_pattern"]
        if len(pat) != n or set(pat) - set("M*-E"):
            raise CatalogError(f"{where}: hybrid_override_pattern {pat!r} should have one of M, *, -, E "
                               f"per layer ({n} layers)")
        return tuple({"M": MAMBA, "*": FULL}.get(c, FFN) for c in pat)
    if window and model_type in ("mistral", "phi3", "starcoder2", "mixtral") and \
            cfg.get("use_sliding_window", True) and int(window) < int(cfg.get("max_position_embeddings") or 0):
        return (SLIDING,) * n
    return (FULL,) * n


# gated-delta-net hybrids whose config derives layer_types from full_attention_interval
QWEN35_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
GDN_TYPES = QWEN35_TYPES | {"qwen3_next"}
# attention with a sigmoid gate on its output (q_proj twice as wide, or a gate_proj beside it) when
# the config does not say: the gated-delta-net hybrids' full layers, and AFMoE's every layer
# (afmoe.py: self_attn.gate_proj, hidden -> heads x head_dim)
GATED_ATTENTION_TYPES = GDN_TYPES | {"afmoe"}


# Granite MoE configs: experts intermediate_size wide, a shared MLP of shared_intermediate_size beside
# them (the only MLP when num_local_experts is 0); granitemoeshared.py, granitemoehybrid.py
GRANITE_MOE_TYPES = ("granitemoe", "granitemoeshared", "granitemoehybrid")

# MoE configs whose experts are intermediate_size wide (no moe_intermediate_size): Mixtral and the
# models built like it in vLLM (olmoe.py, phimoe.py, cohere2_moe.py; FlexOlmo through the
# Transformers backend's OLMoE blocks), gpt-oss, Llama 4, MiniMax, Jamba, Granite MoE
EXPERTS_AT_INTERMEDIATE_TYPES = ("mixtral", "gpt_oss", "llama4_text", "llama4", "minimax", "minimax_m2", "jamba",
                                 "olmoe", "phimoe", "flex_olmo", "cohere2_moe", *GRANITE_MOE_TYPES)


# models whose mixers are Mamba1 (vLLM's mamba1_state_shape: jamba.py, mamba.py); the others Mamba2
MAMBA1_TYPES = frozenset({"jamba", "mamba", "falcon_mamba"})
# models of Mamba blocks alone, no attention and no MLP (vLLM's IsAttentionFree: mamba.py, mamba2.py)
ATTENTION_FREE_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba"})
# LFM2: gated short convolutions beside attention layers (vLLM's lfm2.py, lfm2_moe.py, ShortConv):
# a conv window and no temporal state
LFM2_TYPES = frozenset({"lfm2", "lfm2_moe"})


def _recurrent_state(cfg: Mapping[str, Any], types: tuple[str, ...], hidden: int, model_type: str,
                     dtype_bytes: int) -> RecurrentState | None:
    """The recurrent state of the model's Mamba / linear-attention layers (None without them).
    Mamba2: conv (d_conv - 1) x (d_inner + 2 x groups x d_state), temporal heads x head_dim x
    d_state, d_inner = heads x head_dim when the config names them (Nemotron-H) else
    expand x hidden; gated delta net: conv over q, k, v channels, temporal v_heads x k_dim x v_dim.
    The state dtypes are the model's (vLLM's mamba cache dtypes default to it), except Nemotron-H's
    temporal state, which later releases keep in the config's `mamba_ssm_cache_dtype`
    (NemotronHForCausalLMConfig in model_executor/models/config.py): `temporal_bytes` here is the
    config's (float32 when it names none), `Setup.state_bytes` the one a given release uses."""
    if MAMBA in types and model_type in LFM2_TYPES:
        # ShortConv (model_executor/layers/mamba/short_conv.py): in_proj to B, C and x, a depthwise
        # conv of conv_L_cache over x, out_proj; its state is the conv window alone
        # (short_conv_state_shape: conv_dim x (conv_L_cache - 1)). lfm2.py widens it to the config's
        # conv_dim, lfm2_moe.py to hidden_size, as transformers' Lfm2 classes both do
        width = int(cfg.get("conv_dim") or hidden) if model_type == "lfm2" else hidden
        kernel = int(cfg.get("conv_L_cache") or 3)
        bias = bool(cfg.get("conv_bias"))
        return RecurrentState(conv_channels=width, conv_width=kernel - 1, temporal=0, conv_bytes=dtype_bytes,
                              temporal_bytes=dtype_bytes, proj_params=4 * hidden * width,
                              other_params=width * kernel + (4 * width + hidden if bias else 0))
    if MAMBA in types:
        d_state = int(_opt(cfg, "mamba_d_state", "ssm_state_size", "state_size", default=128))
        d_conv = int(_opt(cfg, "mamba_d_conv", "conv_kernel", default=4))
        heads, head_dim = _opt(cfg, "mamba_num_heads", "mamba_n_heads"), _opt(cfg, "mamba_head_dim", "mamba_d_head")
        if model_type == "mamba2":   # Mamba2Config's own names (mamba2.py)
            heads, head_dim = cfg.get("num_heads"), cfg.get("head_dim")
        expanded = int(_opt(cfg, "mamba_expand", "expand", default=2)) * hidden
        if heads and head_dim:
            d_inner = int(heads) * int(head_dim)
        else:
            d_inner = int(_opt(cfg, "mamba_d_inner", default=expanded))
            heads = int(_opt(cfg, "mamba_n_heads", default=max(d_inner // 64, 1)))
        # the conv window's channels are the mixer's intermediate size, which Granite 4 takes
        # as expand x hidden and Falcon-H1 as mamba_d_ssm when set (their
        # get_mamba_state_shape_from_config); the temporal state is heads x head_dim wide
        conv_inner = d_inner
        if model_type == "granitemoehybrid":
            conv_inner = expanded
        elif model_type == "falcon_h1":
            conv_inner = int(cfg.get("mamba_d_ssm") or expanded)
        if model_type in MAMBA1_TYPES:   # Mamba1: no groups, temporal d_inner x d_state
            dt_rank = int(_opt(cfg, "mamba_dt_rank", "time_step_rank", default=math.ceil(hidden / 16)))
            proj = 3 * hidden * d_inner + d_inner * (dt_rank + 2 * d_state) + dt_rank * d_inner
            # A (d_inner x d_state), D, the conv's weights and bias, dt_proj's bias
            other = d_inner * (d_state + d_conv + 3)
            return RecurrentState(conv_channels=d_inner, conv_width=d_conv - 1, temporal=d_inner * d_state,
                                  conv_bytes=dtype_bytes, temporal_bytes=dtype_bytes, proj_params=proj,
                                  other_params=other)
        groups = int(_opt(cfg, "mamba_n_groups", "n_groups", default=1))
        temporal_bytes, from_config = dtype_bytes, False
        if model_type == "nemotron_h":
            named = cfg.get("mamba_ssm_cache_dtype")
            from_config = str(named) if named else True
            temporal_bytes = DTYPE_BYTES.get(str(named or "float32"), 4)
        # in_proj (z, x, B, C, dt) and out_proj (mamba_mixer2.py)
        proj = hidden * (2 * conv_inner + 2 * groups * d_state + int(heads)) + conv_inner * hidden
        # the conv over x, B and C (weights and bias), A, D and dt bias per head, the gated norm
        other = (conv_inner + 2 * groups * d_state) * (d_conv + 1) + 3 * int(heads) + conv_inner
        return RecurrentState(conv_channels=conv_inner, conv_width=d_conv - 1, temporal=d_inner * d_state,
                              groups=groups, group_channels=2 * d_state, conv_bytes=dtype_bytes,
                              temporal_bytes=temporal_bytes, proj_params=proj, other_params=other,
                              ssm_dtype_from_config=from_config)
    if LINEAR in types:
        kh = int(_opt(cfg, "linear_num_key_heads", default=16))
        vh = int(_opt(cfg, "linear_num_value_heads", default=32))
        kd = int(_opt(cfg, "linear_key_head_dim", default=128))
        vd = int(_opt(cfg, "linear_value_head_dim", default=128))
        conv_k = int(_opt(cfg, "linear_conv_kernel_dim", default=4))
        # gated delta net (qwen3_next.py): in_proj_qkvz (q, k, v, the gate z), in_proj_ba (the
        # beta and alpha per value head), out_proj; beside them the conv over q, k, v, A and dt
        # bias per value head, the norm over a value head
        proj = hidden * (2 * kh * kd + 2 * vh * vd + 2 * vh) + vh * vd * hidden
        other = (2 * kh * kd + vh * vd) * conv_k + 2 * vh + vd
        # Qwen3.5 keeps the delta-rule state in the config's mamba_ssm_dtype (float32 in its
        # public checkpoints): Qwen3_5ForConditionalGenerationConfig in vLLM's
        # model_executor/models/config.py, present from 0.17.0, the first release with Qwen3.5.
        # Qwen3-Next has no such hook: its state is in the model dtype.
        named = cfg.get("mamba_ssm_dtype") if model_type in QWEN35_TYPES else None
        return RecurrentState(conv_channels=2 * kh * kd + vh * vd, conv_width=conv_k - 1,
                              temporal=vh * kd * vd, conv_bytes=dtype_bytes,
                              temporal_bytes=DTYPE_BYTES.get(str(named), dtype_bytes) if named else dtype_bytes,
                              proj_params=proj, other_params=other,
                              ssm_dtype_from_config=str(named) if named else False)
    return None


def quant_from_config(cfg: Mapping[str, Any]) -> tuple[str | None, str]:
    """(scheme, note) from config.json's `quantization_config`, as vLLM picks its method:
    GPTQ / AWQ (bits), FP8 (per-tensor/channel or block-wise `weight_block_size`),
    compressed-tensors (the first config group's weight bits/type), MXFP4, ModelOpt (FP8/NVFP4),
    bitsandbytes (4 or 8 bit), AutoRound (integer 4 or 8 bit). (None, "") when the checkpoint is not quantized."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, Mapping):
        return None, ""
    method = str(qc.get("quant_method") or qc.get("format") or "").lower()
    inner = qc["quantization"] if isinstance(qc.get("quantization"), Mapping) else {}
    if not method and (str((qc.get("producer") or {}).get("name") or "").lower() == "modelopt"
                       or "modelopt_quant_config" in inner):
        method = "modelopt"   # ModelOpt's hf_quant_config.json names a producer, not a method
    bits = qc.get("bits") or qc.get("w_bit")
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        base = method.split("_")[0]
        group = qc.get("group_size") or qc.get("q_group_size")
        scheme = base if int(bits or 4) == 4 else "gptq-int8"
        return scheme, f"{base} {int(bits or 4)}-bit" + (f", group size {group}" if group else "")
    if method in ("auto-round", "auto_round", "autoround", "intel/auto-round"):
        # Intel's AutoRound: integer weights in GPTQ's layout (packing_format auto_round:auto_gptq),
        # one fp16 scale per group, and a zero point only when not symmetric; vLLM runs it with
        # the GPTQ/AWQ Marlin kernels (model_executor/layers/quantization/auto_round.py)
        dt, nbits = str(qc.get("data_type") or "int").lower(), int(bits or 4)
        desc = f"auto-round {dt}{nbits}, group size {qc.get('group_size') or 128}"
        if dt.startswith("int") and nbits in (4, 8):
            sym = qc.get("sym") is not False
            return ("gptq" if sym else "awq") if nbits == 4 else "gptq-int8", desc
        return None, f"{desc} not modelled; weights counted at the model dtype"
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        block = qc.get("weight_block_size")
        return "fp8", "fp8 " + (f"block-wise {list(block)}" if block else "per-tensor/channel")
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return "w8a16", "bitsandbytes 8-bit"
        return "w4a16", f"bitsandbytes 4-bit ({qc.get('bnb_4bit_quant_type') or 'nf4'})"
    if method in ("modelopt", "modelopt_fp4"):
        algo = str(qc.get("quant_algo") or inner.get("quant_algo") or "FP8")
        if "FP4" in algo.upper():
            return "nvfp4", f"modelopt {algo}"
        if algo.upper().startswith("FP8"):
            return "fp8", f"modelopt {algo}"
        return None, f"modelopt quant_algo {algo!r} not modelled; weights counted at the model dtype"
    if method in ("compressed-tensors", "compressed_tensors") or isinstance(qc.get("config_groups"), Mapping):
        groups = qc.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, Mapping) else ():
            w = (group or {}).get("weights") or {}
            a = (group or {}).get("input_activations") or {}
            nbits, typ = int(w.get("num_bits") or 8), str(w.get("type") or "int")
            desc = f"compressed-tensors w{nbits}{'a' + str(a.get('num_bits') or 16) if a else 'a16'} {typ}"
            if typ == "float" and nbits == 8:
                return "fp8", desc
            if nbits == 4:
                return ("nvfp4" if typ == "float" else "w4a16"), desc
            return ("w8a8" if a else "w8a16"), desc
        return "w8a8", "compressed-tensors (no config_groups; assumed w8a8)"
    if method in QUANT_ALIASES:
        return QUANT_ALIASES[method], method
    return None, f"quantization method {method!r} not modelled; weights counted at the model dtype"


def kv_quant_from_config(cfg: Mapping[str, Any]) -> str | None:
    """"fp8" when a pre-quantized checkpoint stores its KV cache in FP8: ModelOpt's
    `kv_cache_quant_algo` ("FP8"), compressed-tensors' `kv_cache_scheme` (8-bit float). vLLM
    resolves `--kv-cache-dtype auto` to it (`resolve_kv_cache_dtype_string`,
    `get_kv_cache_quant_algo_string` in vllm/utils/torch_utils.py). A checkpoint without
    either (RedHatAI fp8-dynamic, Qwen's block-FP8, runtime `--quantization fp8`) keeps the
    model dtype."""
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, Mapping):
        return None
    algo = qc.get("kv_cache_quant_algo") or (qc.get("quantization") or {}).get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper().startswith("FP8"):
        return "fp8"
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, Mapping) and int(scheme.get("num_bits") or 0) == 8 \
            and str(scheme.get("type") or "").lower() == "float":
        return "fp8"
    return None


def _quant_from_config(cfg: Mapping[str, Any]) -> str | None:
    return quant_from_config(cfg)[0]


# Falcon's model_type in its current configs and in the two RefinedWeb layouts older ones carry
# (RefinedWebModel: 7B, multi-query; RefinedWeb: 40B, the new decoder architecture)
FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")
MULTI_QUERY_TYPES = (*FALCON_TYPES, "gpt_bigcode")
# configs that leave the MLP width out: transformers builds 4 x hidden (GPT-2 and GPT-J n_inner
# null, BLOOM, Falcon's ffn_hidden_size None, GPTBigCode n_inner null)
FOUR_H_MLP_TYPES = ("gpt2", "gptj", "bloom", "gpt_bigcode", *FALCON_TYPES)
# one up and one down projection, no gate (and any model whose MLP is squared ReLU)
UNGATED_MLP_TYPES = ("phi", "gpt2", "gpt_bigcode", "starcoder2", "opt", "gpt_neox", "gptj", "bloom", "apertus",
                     "nemotron", "nemotron_h", *FALCON_TYPES)
# Gemma 3n's text and multimodal model types (configuration_gemma3n.py)
GEMMA3N_TYPES = ("gemma3n", "gemma3n_text")

# model types whose transformers config ties the lm_head to the embeddings when config.json
# does not say (PretrainedConfig's default, kept by these classes; vLLM's models tie them too):
# Gemma, OPT, GPT-2, BLOOM, GPTBigCode, StarCoder2 (3B and 7B publish 3.03B and 7.17B: tied;
# 15B says false), Falcon (FalconForCausalLM ties unless the config says not), LFM2 (Lfm2Config
# and Lfm2MoeConfig default to tied)
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text", *GEMMA3N_TYPES, "opt", "gpt2", "bloom", "gpt_bigcode",
                   "cohere", "cohere2", "starcoder2", "lfm2", "lfm2_moe", *FALCON_TYPES)

# model_type values whose config fields the generic decoder path is known to read right
KNOWN_MODEL_TYPES = frozenset({
    "llama", "llama4", "llama4_text", "mistral", "mistral3", "mixtral", "qwen", "qwen2", "qwen2_moe",
    "qwen3", "qwen3_moe", "qwen3_next", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "deepseek_v2", "deepseek_v3", "kimi_vl", "kimi_k2", "gemma", "gemma2", "gemma3", "gemma3_text",
    "phi", "phi3", "phi3small", "phimoe", "gpt2", "gpt_bigcode", "gpt_neox", "gpt_oss", "starcoder2",
    "falcon", "opt", "jamba", "nemotron_h", "granite", "granitemoe", "olmo", "olmo2", "olmoe",
    "internlm2", "baichuan", "chatglm", "glm", "glm4", "glm4_moe", "minimax", "minimax_m2", "kimi_k25",
    "llava", "llava_next", "mllama", "idefics3", "internvl_chat", "cohere", "cohere2", "exaone",
    "ernie4_5", "ernie4_5_moe", "hunyuan", "dbrx", "stablelm", "mpt", "bloom", "gptj",
    "gemma4", "gemma4_text", "mimo_v2_flash", "granitemoeshared", "granitemoehybrid", "falcon_h1",
    "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "deepseek_v32",
    "RefinedWeb", "RefinedWebModel", "qwen3_vl_text", "qwen3_vl_moe_text", "glm_moe_dsa", "mimo",
    "nemotron-nas", *GEMMA3N_TYPES,
    # read through the generic path and checked on real vLLM 0.32 startups (kv-layouts.json)
    "lfm2", "lfm2_moe", "cohere2_moe", "exaone4", "olmo3", "flex_olmo", "smollm3", "seed_oss", "ministral3",
    "apertus", "arcee", "jais2", "dots1", "glm4_moe_lite", "mamba", "mamba2", "falcon_mamba", "afmoe",
    "granite_swa", "granitemoe_swa", "exaone_moe", "nemotron",
})


# model types the generic path would read wrong without a word, refused with the reason
NOT_MODELLED_TYPES = {
    "kimi_linear": "its Kimi Delta Attention layers keep a recurrent state beside the MLA layers' "
                   "latent cache (kimi_linear.py), which this reader does not shape",
    # a tiny MiniCPM3 on vLLM 0.32 CPU: 32,768 tokens where the latent reading gives 104,848
    "minicpm3": "vLLM caches its decompressed K and V per head (minicpm3.py: Attention of "
                "qk_nope + qk_rope wide, as many KV heads as heads), not the MLA latent its "
                "kv_lora_rank describes",
}


def _listed_mlp_widths(cfg: Mapping[str, Any], n: int, where: str) -> tuple[int, ...]:
    """Per-layer MLP widths of a config whose intermediate_size is a list (Gemma 3n: its
    MatFormer checkpoints may give each layer its own; gemma3n.py builds layer i
    intermediate_size[i] wide); () when it is one number."""
    listed = cfg.get("intermediate_size")
    if not isinstance(listed, list):
        return ()
    if len(listed) != n or not all(isinstance(w, int) and w > 0 for w in listed):
        raise CatalogError(f"{where}: intermediate_size lists {len(listed)} widths; expected "
                           f"{n} positive integers, one per layer")
    return tuple(listed)


def _distinct(widths: tuple[int, ...]) -> tuple[int, ...]:
    """Per-layer widths worth keeping: () when every layer has the same."""
    return widths if len(set(widths)) > 1 else ()


def gemma3n_tower_params(outer: Mapping[str, Any], text_hidden: int) -> tuple[int, str]:
    """Gemma 3n's audio and vision towers with their embedders into the text width, estimated
    from config.json (the safetensors headers give them exactly):
    - audio: a conformer of `conf_num_hidden_layers` blocks `hidden_size` wide, ~24 h^2 each (two
      macaron feed-forwards to 4h, 16 h^2; attention and its relative-position projection,
      5 h^2; the light convolution's gated input and its output, 3 h^2: configuration_gemma3n.py
      Gemma3nAudioConfig, gemma3n_audio.py);
    - vision: timm's MobileNet-V5 encoder, whose `architecture` names its size
      ("mobilenetv5_300m_enc": 300 M parameters);
    - each embedder: a soft-token table of `vocab_size` x the tower width and a projection to the
      text width."""
    total, parts = 0, []
    audio = outer.get("audio_config")
    if isinstance(audio, Mapping):
        h = int(audio.get("hidden_size") or 0)
        layers = int(audio.get("conf_num_hidden_layers") or 0)
        if h and layers:
            n = 24 * h * h * layers + int(audio.get("vocab_size") or 0) * h + h * text_hidden
            total += n
            parts.append(f"audio ~{n / 1e6:.0f}M ({layers} conformer blocks x {h})")
    vision = outer.get("vision_config")
    if isinstance(vision, Mapping):
        m = re.search(r"_(\d+)m(?:_|$)", str(vision.get("architecture") or ""))
        h = int(vision.get("hidden_size") or 0)
        if m and h:
            n = int(m.group(1)) * 10**6 + int(vision.get("vocab_size") or 0) * h + h * text_hidden
            total += n
            parts.append(f"vision ~{n / 1e6:.0f}M ({vision['architecture']})")
    if not parts:
        return 0, ""
    return total, ("towers estimated from config.json (exact when the safetensors headers are read): "
                   + ", ".join(parts))


def vision_tower_params(vc: Mapping[str, Any], text_hidden: int, outer: Mapping[str, Any]) -> int:
    """Parameters of a ViT-style tower and its projector from `vision_config`: per layer
    attention 4h^2 and an MLP of 2 (or 3 when gated, SiLU) h x intermediate, a patch embedding
    of channels x patch^2 x h, and a two-layer projector from h x merge^2 to the text width.
    0 when the fields are missing (the tower is then left out, with no note)."""
    try:  # Qwen2-VL names the tower width embed_dim (its hidden_size is the merger's output)
        h = int(vc.get("embed_dim") or vc["hidden_size"])
        layers = int(vc.get("num_hidden_layers") or vc.get("depth") or 0)
        inter = int(vc.get("intermediate_size") or h * float(vc.get("mlp_ratio") or 4))
    except (KeyError, TypeError, ValueError):
        return 0
    if h <= 0 or layers <= 0:
        return 0
    gated = str(vc.get("hidden_act") or "").lower() in ("silu", "swiglu")
    per_layer = 4 * h * h + (3 if gated else 2) * h * inter + 4 * h
    patch = int(vc.get("num_channels") or 3) * int(vc.get("patch_size") or 14) ** 2 * h
    merge = int(outer.get("spatial_merge_size") or 1)
    projector = (h * merge * merge * h if merge > 1 else 0) + h * text_hidden + text_hidden * text_hidden
    return layers * per_layer + patch + projector


def _kind_shapes(cfg: Mapping[str, Any], model_type: str, types: tuple[str, ...], kv_heads: int,
                 head_dim: int, where: str) -> tuple[tuple[KVShape, ...], list[str]]:
    """Attention shapes of the layer kinds that depart from (kv_heads x head_dim, V = K):
    - `v_head_dim` narrower or wider than head_dim (MiMo-V2: K 192, V 128), every kind;
    - MiMo-V2's sliding layers: swa_num_key_value_heads, swa_head_dim, swa_v_head_dim;
    - Gemma 4's full-attention layers: global_head_dim (transformers' default 512) and, when
      attention_k_eq_v is set, num_global_key_value_heads (configuration_gemma4.py);
    - `per_layer_config` {layer: {head_dim, num_key_value_heads}} (how transformers >= 5 saves
      Gemma 4), read per layer and gathered by kind."""
    v_dim = int(cfg.get("v_head_dim") or head_dim)
    kinds = {t for t in types if t in (FULL, SLIDING, CHUNKED)} or {FULL}
    shape = {t: KVShape(t, kv_heads, head_dim, v_dim) for t in kinds}
    if SLIDING in shape and (cfg.get("swa_head_dim") or cfg.get("swa_num_key_value_heads")):
        hd = int(cfg.get("swa_head_dim") or head_dim)
        shape[SLIDING] = KVShape(SLIDING, int(cfg.get("swa_num_key_value_heads") or kv_heads), hd,
                                 int(cfg.get("swa_v_head_dim") or hd))
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    per_layer = cfg.get("per_layer_config")
    if isinstance(per_layer, Mapping) and per_layer:
        given: dict[str, list[tuple[int, int]]] = {}    # kind -> (KV heads, head_dim) of each layer listed
        for key, over in per_layer.items():
            i = int(key)
            if not 0 <= i < len(types) or not isinstance(over, Mapping):
                raise CatalogError(f"{where}: per_layer_config[{key!r}] is not a layer's overrides")
            base = shape.get(types[i])
            if base:
                given.setdefault(base.kind, []).append((int(over.get("num_key_value_heads") or base.kv_heads),
                                                        int(over.get("head_dim") or base.head_dim)))
        for t, listed in given.items():
            if len(set(listed)) > 1 or len(listed) != types.count(t):
                raise CatalogError(f"{where}: per_layer_config gives the {t} layers more than one "
                                   f"attention shape ({sorted(set(listed))}); vllm-drift models one per kind")
            heads, hd = listed[0]
            shape[t] = KVShape(t, heads, hd, hd, k_eq_v=k_eq_v and t == FULL)
    elif model_type in ("gemma4", "gemma4_text") and FULL in shape:
        hd = int(cfg.get("global_head_dim") or 512)
        heads = cfg.get("num_global_key_value_heads") if cfg.get("attention_k_eq_v", True) else None
        shape[FULL] = KVShape(FULL, int(heads or kv_heads), hd, hd, k_eq_v=k_eq_v)
    own = tuple(sh for _, sh in sorted(shape.items())
                if (sh.kv_heads, sh.head_dim, sh.v_head_dim, sh.k_eq_v) != (kv_heads, head_dim, head_dim, False))
    notes = ["attention shape per layer kind: " + ", ".join(
        f"{t} {sh.kv_heads} KV heads x {sh.head_dim}" + (f"/{sh.v_head_dim}" if sh.v_head_dim != sh.head_dim else "")
        + (" (K = V)" if sh.k_eq_v else "") for t, sh in sorted(shape.items()))] if own else []
    return own, notes


def arch_from_config(config: Mapping[str, Any], *, name: str, where: str,
                     extra_params: int = 0, quantization: str | None = None,
                     generation: Mapping[str, Any] | None = None) -> ModelArch:
    """Build a ModelArch from a parsed HF config.json (nested text_config supported). A field of
    a shape this reader does not know (a list where a number was expected, ...) is a
    CatalogError naming the file, never a traceback."""
    try:
        return _arch_from_config(config, name=name, where=where, extra_params=extra_params,
                                 quantization=quantization, generation=generation)
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
        model_type = config.get("model_type") if isinstance(config, Mapping) else None
        raise CatalogError(f"{where}: config.json not readable as a decoder (model_type "
                           f"{model_type!r}): {exc.__class__.__name__}: {exc}") from None


def _arch_from_config(config: Mapping[str, Any], *, name: str, where: str,
                      extra_params: int, quantization: str | None,
                      generation: Mapping[str, Any] | None) -> ModelArch:
    if not isinstance(config, Mapping):
        raise CatalogError(f"{where}: config.json is not a JSON object")
    outer = config
    cfg: Mapping[str, Any] = config
    for key in _LM_KEYS:
        if isinstance(config.get(key), Mapping) and config[key]:
            cfg = {**{k: v for k, v in config.items() if k not in _LM_KEYS}, **config[key]}
            break
    model_type = str(cfg.get("model_type") or outer.get("model_type") or "unknown")
    notes: list[str] = []
    if cfg is not outer:
        notes.append(f"text backbone read from {next(k for k in _LM_KEYS if isinstance(outer.get(k), Mapping))}")
    if model_type in NOT_MODELLED_TYPES:
        raise CatalogError(f"{where}: model_type {model_type!r} is not modelled: "
                           f"{NOT_MODELLED_TYPES[model_type]}")
    if model_type not in KNOWN_MODEL_TYPES:
        notes.append(f"model_type {model_type!r} is not one we know; read through the generic "
                     "decoder path (standard config.json fields)")
    blocks = cfg.get("layers_block_type")
    if model_type == "nemotron_h" and isinstance(blocks, list) and not cfg.get("hybrid_override_pattern"):
        # newer Nemotron-H configs list the blocks by name and leave num_hidden_layers to their count;
        # transformers 5 saves them as linear_attention / full_attention (configuration_nemotron_h.py)
        letters = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E",
                   "linear_attention": "M", "full_attention": "*"}
        unknown = sorted({str(b) for b in blocks} - set(letters))
        if unknown:
            raise CatalogError(f"{where}: layers_block_type has {', '.join(map(repr, unknown))}; "
                               f"expected {', '.join(letters)}")
        cfg = {**cfg, "hybrid_override_pattern": "".join(letters[str(b)] for b in blocks),
               "num_hidden_layers": cfg.get("num_hidden_layers") or len(blocks)}
    n = int(_need(cfg, ("num_hidden_layers", "n_layer", "num_layers"), where))
    hidden = int(_need(cfg, ("hidden_size", "n_embd", "d_model", "n_embed"), where))
    # an attention-free model (Mamba, Mamba2, Falcon-Mamba) has no attention heads to read
    heads = 1 if model_type in ATTENTION_FREE_TYPES else int(_need(cfg, ("num_attention_heads", "n_head"), where))
    nas = _nas_blocks(cfg, n, hidden, heads, where) if isinstance(cfg.get("block_configs"), list) else None
    if nas:
        # Nemotron-NAS: the config's top-level KV heads and MLP width are null; the blocks give them
        cfg = {**cfg, "num_key_value_heads": nas.kv_heads, "intermediate_size": max(nas.widths)}
        notes.append(f"per-layer blocks: {nas.types.count(FULL)} of {n} layers attend, MLP widths "
                     f"{min(nas.widths)}-{max(nas.widths)}")
    widths = _listed_mlp_widths(cfg, n, where)
    if widths:
        cfg = {**cfg, "intermediate_size": max(widths)}
    kv_heads = int(_opt(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads))
    if model_type in MULTI_QUERY_TYPES and cfg.get("multi_query", model_type == "gpt_bigcode") \
            and not (cfg.get("new_decoder_architecture") or model_type == "RefinedWeb"):
        # one KV head, as vLLM's ModelConfig.get_total_num_kv_heads reads a multi_query config
        # (Falcon-7B, StarCoder); Falcon's new decoder architecture (40B/180B, the RefinedWeb
        # layout) ignores the flag and has num_kv_heads / n_head_kv
        kv_heads = 1
    if cfg.get("multi_query_attention") and cfg.get("multi_query_group_num"):
        # ChatGLM's own keys (GLM-4-9B-chat): KV heads are the query groups, as vLLM's
        # ModelConfig.get_total_num_kv_heads reads them
        kv_heads = int(cfg["multi_query_group_num"])
    head_dim = int(_opt(cfg, "head_dim", "kv_channels", default=hidden // heads))
    vocab = int(_need(cfg, ("vocab_size", "padded_vocab_size"), where))
    # vLLM's derived max_model_len: the smallest of the length keys the config carries
    lengths = [int(cfg[k]) for k in _LENGTH_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
    model_max = cfg.get("model_max_length")
    if isinstance(model_max, (int, float)) and model_max > 0:
        # "For Command-R / Cohere, Cohere2 / Aya Vision models" vLLM takes model_max_length
        # whatever the other keys say (Command-R: 131072 beside max_position_embeddings 8192)
        max_pos = int(model_max)
    elif lengths:
        max_pos = min(lengths)
    else:  # vLLM's _get_and_verify_max_len falls back to 2048 with a warning
        max_pos = 2048
        notes.append("no max_position_embeddings (or equivalent) in config.json; max_model_len "
                     "defaults to 2048 as in vLLM, and a --max-model-len is taken as given")
    config_max_pos = max_pos
    ropes = _rope_parameters(cfg)
    # vLLM's _get_and_verify_max_len (0.6 to 0.32 alike): the last factor of a rope that is not
    # su / longrope / llama3 (a dynamic NTK rope's too), except that Gemma 3's
    # max_position_embeddings (128K) already counts its linear x8 ("gemma3" not in model_type)
    scaled = [r for r in ropes.values() if r.get("factor")
              and _rope_type(r) not in (*LONGROPE_TYPES, "llama3", "mrope", "default")]
    if scaled and "gemma3" not in model_type:
        rope = scaled[-1]
        kind = _rope_type(rope)
        if kind == "yarn" and rope.get("original_max_position_embeddings"):
            max_pos = int(rope["original_max_position_embeddings"])
        max_pos = int(max_pos * float(rope["factor"]))  # as vLLM derives max_model_len
        notes.append(f"rope_scaling {kind or '?'} x{rope['factor']}: max_model_len {max_pos}")
    else:
        kinds = sorted({_rope_type(r) for r in ropes.values()} - {"", "default"})
        if kinds:
            notes.append(f"rope_scaling {', '.join(kinds)}: max_model_len stays max_position_embeddings {max_pos}")
    n_experts = int(_opt(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    if model_type == "jamba" and n_experts <= 1:
        n_experts = 0            # one "expert" is Jamba's dense MLP (jamba.py: JambaMoE only when > 1)
    k = int(_opt(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", "top_k_experts", default=0) or 0)
    if n_experts:
        named = _opt(cfg, "moe_intermediate_size", "expert_intermediate_size")
        if model_type in EXPERTS_AT_INTERMEDIATE_TYPES or (named is None and cfg.get("intermediate_size")):
            moe_inter = int(_need(cfg, ("intermediate_size",), where))
            # a dense MLP where there is one: Llama 4's intermediate_size_mlp, Cohere2-MoE's
            # leading dense layers' prefix_dense_intermediate_size (cohere2_moe.py)
            inter = int(_opt(cfg, "intermediate_size_mlp", "prefix_dense_intermediate_size", default=moe_inter))
            if model_type not in EXPERTS_AT_INTERMEDIATE_TYPES:
                notes.append(f"no moe_intermediate_size: experts read as intermediate_size ({moe_inter}) "
                             "wide, as Mixtral-style configs give them")
        else:
            moe_inter = int(_need(cfg, ("moe_intermediate_size", "expert_intermediate_size"), where))
            inter = int(_opt(cfg, "intermediate_size", default=moe_inter))
        if not k:
            raise CatalogError(f"{where}: missing field 'num_experts_per_tok' in config.json")
    else:
        moe_inter = 0
        keys = ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", "block_ff_dim")
        # GPT-2, GPT-J, BLOOM, Falcon and StarCoder leave the MLP width out (or null): 4 x hidden,
        # as their transformers configs and vLLM's models build it; an attention-free model's
        # blocks are its mixers alone (Mamba's intermediate_size is the mixer's width, not an MLP's)
        inter = 0 if model_type in ATTENTION_FREE_TYPES else \
            int(_opt(cfg, *keys, default=4 * hidden) if model_type in FOUR_H_MLP_TYPES
                    else _need(cfg, keys, where))
        if model_type == "qwen":  # Qwen v1 counts both gated branches in intermediate_size
            inter //= 2
        if model_type in GRANITE_MOE_TYPES and cfg.get("shared_intermediate_size"):
            inter = int(cfg["shared_intermediate_size"])   # no experts: the shared MLP is the MLP
        if model_type == "lfm2" and cfg.get("block_auto_adjust_ff_dim", True):
            # lfm2.py's Lfm2MLP: two thirds of the width, times block_ffn_dim_multiplier, rounded
            # up to block_multiple_of (LFM2-1.2B: 12288 -> 8192)
            inter = int(2 * inter / 3)
            if cfg.get("block_ffn_dim_multiplier") is not None:
                inter = int(float(cfg["block_ffn_dim_multiplier"]) * inter)
            multiple = int(cfg.get("block_multiple_of") or 256)
            inter = multiple * -(-inter // multiple)
    # which layers are MoE
    moe_layers: tuple[int, ...] = ()
    if n_experts:
        first_dense = int(_opt(cfg, "first_k_dense_replace", "num_dense_layers", default=0) or 0)
        raw_freq = _opt(cfg, "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", default=1)
        freq = 1 if isinstance(raw_freq, list) else int(raw_freq or 1)
        mlp_only = set(_opt(cfg, "mlp_only_layers", default=[]) or [])
        kinds = cfg.get("mlp_layer_types")
        if isinstance(kinds, list):
            # one kind per layer, "dense" or "sparse" (Cohere2-MoE)
            if len(kinds) != n:
                raise CatalogError(f"{where}: mlp_layer_types has {len(kinds)} entries, expected {n}")
            moe_layers = tuple(i for i, t in enumerate(kinds) if str(t) == "sparse")
        elif isinstance(raw_freq, list):
            # one flag per layer (MiMo-V2, MiniMax-M3: `moe_layer_freq[i]` truthy = MoE, mimo_v2.py)
            if len(raw_freq) != n:
                raise CatalogError(f"{where}: moe_layer_freq has {len(raw_freq)} entries, expected {n}")
            moe_layers = tuple(i for i, f in enumerate(raw_freq) if f and i not in mlp_only)
        elif model_type == "jamba":
            # layer i is MoE when i % expert_layer_period == expert_layer_offset (layers_num_experts)
            period, offset = int(cfg.get("expert_layer_period") or 2), int(cfg.get("expert_layer_offset") or 1)
            moe_layers = tuple(i for i in range(n) if i % period == offset)
        elif (model_type in ("llama4_text", "llama4") or cfg.get("decoder_sparse_step")) and freq > 1:
            # Llama 4 / Qwen-MoE: layer i is sparse when (i + 1) % step == 0
            moe_layers = tuple(i for i in range(n) if (i + 1) % freq == 0 and i not in mlp_only)
        else:
            moe_layers = tuple(i for i in range(n) if i >= first_dense and i % freq == 0
                               and i not in mlp_only)
    shared = int(_opt(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    shared_inter = int(_opt(cfg, "shared_expert_intermediate_size", default=0) or 0)
    if model_type in ("llama4_text", "llama4") and n_experts:
        shared_inter = moe_inter  # Llama 4 adds one always-on shared expert per MoE layer
    if model_type in ("gemma4", "gemma4_text") and n_experts:
        shared_inter = inter      # Gemma 4: the dense MLP runs beside the expert block (gemma4.py)
    if model_type in GRANITE_MOE_TYPES and n_experts:
        shared_inter = int(cfg.get("shared_intermediate_size") or 0)   # shared_mlp beside the experts
    mla = cfg.get("kv_lora_rank") is not None
    indexer = mla and bool(cfg.get("index_topk"))   # DeepSeek sparse attention's lightning indexer
    types = nas.types if nas else _layer_types(cfg, model_type, n, where)
    mixer_only: tuple[int, ...] = nas.mlp_less if nas else ()
    if model_type in ATTENTION_FREE_TYPES:
        mixer_only = tuple(range(n))
    latent = 0
    parallel = model_type == "falcon_h1"   # attention and Mamba2 side by side in every layer
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        # Nemotron-H: the MoE layers are the "E"s, and its shared expert is
        # moe_shared_expert_intermediate_size x n_shared_experts wide (nemotron_h.py)
        pat = cfg["hybrid_override_pattern"]
        moe_layers = tuple(i for i, c in enumerate(pat) if c == "E") if n_experts else ()
        mixer_only = tuple(i for i, c in enumerate(pat) if c in "M*")
        if cfg.get("moe_shared_expert_intermediate_size"):
            shared_inter = int(cfg["moe_shared_expert_intermediate_size"]) * max(shared, 1)
            shared = 0
        latent = int(cfg.get("moe_latent_size") or 0)
    dtype = str(_opt(cfg, "torch_dtype", "dtype", default=outer.get("torch_dtype") or "bfloat16"))
    if not extra_params and isinstance(outer.get("vision_config"), Mapping):
        extra_params = vision_tower_params(outer["vision_config"], hidden, outer)
        if extra_params:
            notes.append(f"vision tower + projector ~{extra_params / 1e6:.0f}M parameters estimated "
                         "from vision_config (exact when the safetensors headers are read)")
    kv_quant = kv_quant_from_config(outer) or kv_quant_from_config(cfg)
    if kv_quant:
        notes.append(f"checkpoint KV-cache scheme: {kv_quant}")
    if quantization is None:
        quantization, qnote = quant_from_config(outer)
        if not qnote:
            quantization, qnote = quant_from_config(cfg)
        if qnote:
            notes.append(f"quantization_config: {qnote}")
    skip = (quant_skip_from_config(outer) or quant_skip_from_config(cfg)) if quantization else frozenset()
    if skip:
        notes.append("left in the model dtype by the checkpoint's quantization: "
                     + ", ".join(x for x in QUANT_SKIP_PARTS if x in skip))
    if n_experts:
        notes.append(f"MoE: {n_experts} routed experts (top-{k}), "
                     f"{shared or (1 if shared_inter else 0)} shared, "
                     f"{len(moe_layers)} of {n} layers sparse")
    if len(set(types)) > 1:
        label = {MAMBA: "short-conv"} if model_type in LFM2_TYPES else {}
        notes.append("hybrid layers: " + ", ".join(f"{c} {label.get(t, t)}" for t, c in Counter(types).items()))
    if parallel:
        notes.append(f"hybrid layers: attention and a Mamba2 mixer side by side in each of the {n} layers")
    shapes, shape_notes = ((), []) if mla else _kind_shapes(cfg, model_type, types, kv_heads, head_dim, where)
    notes += shape_notes
    kv_shared = int(cfg.get("num_kv_shared_layers") or 0)
    if not 0 <= kv_shared < n:
        raise CatalogError(f"{where}: num_kv_shared_layers {kv_shared} should be below num_hidden_layers {n}")
    if kv_shared:
        notes.append(f"the last {kv_shared} layers reuse an earlier layer's KV cache and hold none")
    if cfg.get("use_double_wide_mlp") and kv_shared and not n_experts:
        # Gemma 4: the KV-shared layers' MLPs are twice intermediate_size wide (gemma4.py)
        widths = tuple((widths[i] if widths else inter) * (2 if i >= n - kv_shared else 1) for i in range(n))
        notes.append(f"the {kv_shared} KV-shared layers' MLPs are double width ({2 * inter})")
    ple_width = int(cfg.get("hidden_size_per_layer_input") or 0)
    ple_vocab = int(cfg.get("vocab_size_per_layer_input") or vocab) if ple_width else 0
    if ple_width:
        notes.append(f"per-layer embeddings: {ple_vocab} x {n} x {ple_width} "
                     f"({ple_vocab * n * ple_width / 1e9:.2f} B parameters, gathered per token)")
    altup = int(cfg.get("altup_num_inputs") or 0) if model_type in GEMMA3N_TYPES else 0
    laurel = int(cfg.get("laurel_rank") or 0) if model_type in GEMMA3N_TYPES else 0
    if model_type in GEMMA3N_TYPES and not extra_params:
        extra_params, tower_note = gemma3n_tower_params(outer, hidden)
        if tower_note:
            notes.append(tower_note)
    if mla:
        rotary = int(cfg.get("qk_rope_head_dim") or 0)
    elif cfg.get("rotary_dim"):
        rotary = int(cfg["rotary_dim"])
    else:
        rotary = int(head_dim * float(_opt(cfg, "partial_rotary_factor", default=1.0)))
    rope_cache = _rope_cache_elements(cfg, model_type, ropes, config_max_pos, head_dim)
    # one up and one down projection (no gate) for these types and for squared-ReLU MLPs
    # (Nemotron: mlp_hidden_act relu2)
    gated = model_type not in UNGATED_MLP_TYPES \
        and str(_opt(cfg, "mlp_hidden_act", "hidden_act", default="")).lower() != "relu2"
    return ModelArch(
        name=name, model_type=model_type, num_layers=n, hidden_size=hidden, num_heads=heads,
        num_kv_heads=1 if mla else kv_heads, head_dim=head_dim, intermediate_size=inter,
        vocab_size=vocab, max_position_embeddings=max_pos,
        # LFM2's first configs spell it tie_embedding (configuration_lfm2.py reads both)
        tie_word_embeddings=bool(_opt(cfg, "tie_word_embeddings", "tie_embedding",
                                      default=model_type in TIED_BY_DEFAULT)),
        gated_mlp=gated,
        attention="mla" if mla else ("mha" if kv_heads == heads else "gqa"),
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        indexer_head_dim=int(cfg.get("index_head_dim") or 128) if indexer else 0,
        indexer_heads=int(cfg.get("index_n_heads") or 64) if indexer else 0,
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        layer_types=types, kind_shapes=shapes, kv_shared_layers=kv_shared,
        # Cohere2-MoE's sliding layers see one token more than the config says (cohere2_moe.py:
        # per_layer_sliding_window = sliding_window + 1)
        sliding_window=(int(cfg.get("sliding_window") or 0) + (model_type == "cohere2_moe")
                        if SLIDING in types else 0),
        attention_chunk_size=int(cfg.get("attention_chunk_size") or 0) if CHUNKED in types else 0,
        mixer_only_layers=mixer_only, moe_latent_size=latent,
        mlp_widths=_distinct(nas.widths if nas else widths),
        ple_width=ple_width, ple_vocab=ple_vocab, altup_inputs=altup, laurel_rank=laurel,
        parallel_mixers=parallel,
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type in GATED_ATTENTION_TYPES)),
        state=_recurrent_state(cfg, types + ((MAMBA,) if parallel else ()), hidden, model_type,
                               DTYPE_BYTES.get(dtype, 2)), rotary_dim=rotary, rope_cache_elements=rope_cache,
        longrope_original_max_len=_longrope_original(cfg, ropes, config_max_pos),
        vision=vision_tower(outer),
        length_in_config=bool(lengths) or (isinstance(model_max, (int, float)) and model_max > 0),
        num_experts=n_experts, experts_per_token=k, moe_intermediate_size=moe_inter,
        shared_experts=shared, shared_expert_intermediate_size=shared_inter, moe_layers=moe_layers,
        extra_params=int(extra_params), native_dtype=dtype,
        quantization=normalize_quantization(quantization) if quantization else None,
        sampling_sorts=_sampling_sorts(generation),
        kv_cache_quant=kv_quant, quant_skip=skip,
        source=where, notes=tuple(notes),
    )


def _sampling_sorts(generation: Mapping[str, Any] | None) -> bool:
    """Whether a generation_config.json's defaults make vLLM's sampler truncate (top_k > 0 or
    top_p < 1), i.e. sort every request's logits over the vocabulary each step."""
    if not generation:
        return False
    top_k = generation.get("top_k")
    top_p = generation.get("top_p")
    return bool((top_k is not None and int(top_k) > 0) or (top_p is not None and float(top_p) < 1.0))


def read_config_json(path: str | Path) -> tuple[dict, Path]:
    """A local HF `config.json` (or a model directory holding one) parsed, and the file's path;
    InputError naming the file when it cannot be read or is not a JSON object."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{p}: cannot read config.json ({exc.strerror or exc})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(config, dict):
        raise InputError(f"{p}: config.json is not a JSON object")
    return config, p


def load_hf_config(path: str | Path) -> ModelArch:
    """Read a local HF `config.json` (or a model directory holding one)."""
    config, p = read_config_json(path)
    name = config.get("_name_or_path") or p.parent.name or str(p)
    return arch_from_config(config, name=str(name), where=str(p))


# ---- the built-in catalog -------------------------------------------------------------------

_QUANT_SUFFIXES = (  # longest first; (pattern at end of the stem, quantization)
    (r"-quantized\.w4a16$", "w4a16"), (r"-quantized\.w8a8$", "w8a8"), (r"-quantized\.w8a16$", "w8a16"),
    (r"-fp8[-_]dynamic$", "fp8"), (r"-fp8[-_]static$", "fp8"), (r"-gptq-int4$", "gptq"),
    (r"-gptq-int8$", "gptq-int8"), (r"-gptq$", "gptq"), (r"-awq$", "awq"), (r"-w4a16$", "w4a16"),
    (r"-w8a8$", "w8a8"), (r"-int8$", "w8a8"), (r"-int4$", "w4a16"), (r"-nvfp4$", "nvfp4"),
    (r"-fp4$", "nvfp4"), (r"-mxfp4$", "mxfp4"), (r"-fp8$", "fp8"), (r"-fp8-kv$", "fp8"),
    (r"-kv$", None), (r"-marlin$", None), (r"-bnb-4bit$", "w4a16"), (r"-4bit$", "w4a16"),
    (r"-8bit$", "w8a16"),
)


def _split_quant(model_id: str, norm: Callable[[str], str] | None = None) -> tuple[str, str | None]:
    """(catalog stem, quantization its suffixes name) of a model id: "-AWQ-INT4", "-FP8-dynamic",
    "-quantized.w8a8", "-NVFP4" ... in any order; a generic one ("-int4") yields to a specific.
    `norm` (default `_stem`) is applied to the name and after each suffix: `_name_part` keeps the
    variant ("-Instruct-2507", "-v0.3") so the checkpoint's own entry is found first."""
    norm = norm or _stem
    stem, quant = norm(model_id), None
    stripped, quant_generic = True, False
    while stripped:
        stripped = False
        for pattern, q in _QUANT_SUFFIXES:
            if re.search(pattern, stem):
                generic = pattern in (r"-int4$", r"-int8$", r"-4bit$", r"-8bit$")
                stem = norm(re.sub(pattern, "", stem))
                quant = q if quant is None or (q and not generic and quant_generic) else quant
                quant_generic = generic if quant == q else quant_generic
                stripped = True
                break
    return stem, quant


def _name_part(model_id: str) -> str:
    """A model id without its organisation, lower case ("TheBloke/Mistral-7B-Instruct-v0.2-AWQ" ->
    "mistral-7b-instruct-v0.2-awq")."""
    return model_id.strip().rstrip("/").split("/")[-1].lower()


def _unbranded(model_id: str) -> str:
    """`_name_part` without Meta's "Meta-" before Llama ("Meta-Llama-3-8B" -> "llama-3-8b")."""
    return re.sub(r"^meta-(?=llama)", "", _name_part(model_id))


_ROLE_WORDS = frozenset({"instruct", "chat", "hf", "it", "base", "pt"})


def _variant(model_id: str) -> str:
    """A model id without its organisation and role words, its version and date kept
    ("Mistral-7B-Instruct-v0.3" and "Mistral-7B-v0.3" -> "mistral-7b-v0.3"; "Qwen3-235B-A22B-
    Instruct-2507" -> "qwen3-235b-a22b-2507"): a release's base and tuned checkpoints share a
    config, its versions and dated re-releases may not."""
    return "-".join(w for w in _unbranded(model_id).split("-") if w not in _ROLE_WORDS)


def _stem(model_id: str) -> str:
    s = _unbranded(model_id)
    while True:
        t = re.sub(r"-(instruct|chat|hf|it|base|pt|\d{4}|v\d+\.\d+)$", "", s)
        if t == s:
            return s
        s = t


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, dict], dict[str, str], dict[str, str], dict[str, str], dict[str, str]]:
    text = resources.files("exporter.model").joinpath("data/models.yaml").read_text(encoding="utf-8")
    entries: dict[str, dict] = yamlfile.safe_load(text)["models"]
    by_id: dict[str, str] = {}
    by_name: dict[str, str] = {}
    by_variant: dict[str, str] = {}
    by_stem: dict[str, str] = {}
    for model_id, entry in entries.items():
        for alias in (model_id, *entry.get("aliases", [])):
            by_id[alias.lower()] = model_id
            by_name.setdefault(_name_part(alias), model_id)
            by_variant.setdefault(_variant(alias), model_id)
            by_stem.setdefault(_stem(alias), model_id)
    return entries, by_id, by_name, by_variant, by_stem


@lru_cache(maxsize=256)
def _catalog_arch(model_id: str) -> ModelArch:
    entries = _catalog()[0]
    e = entries[model_id]
    return arch_from_config(e["config"], name=model_id, where=e.get("source", model_id),
                            extra_params=int(e.get("extra_params") or 0),
                            quantization=e.get("quantization"),
                            generation=e.get("generation_config"))


def catalog_ids() -> list[str]:
    return list(_catalog()[0])


def catalog_lookup(name: str) -> tuple[str, bool] | None:
    """(catalog id, whether `name` is one of its aliases) for an exact id or alias, else None."""
    model_id = _catalog()[1].get(name.strip().lower())
    if model_id is None:
        return None
    return model_id, model_id.lower() != name.strip().lower()


def resolve_model(name: str) -> ModelArch:
    """A catalog id (case-insensitive, quantised variants by name) or a local config.json/dir."""
    if not name:
        raise CatalogError("empty model name")
    p = Path(name)
    if name.endswith(".json") or p.is_dir() or (p.exists() and p.is_file()):
        return load_hf_config(p)
    entries, by_id, by_name, by_variant, by_stem = _catalog()
    key = name.strip().lower()
    if key in by_id:
        arch = _catalog_arch(by_id[key])
        # an alias that names a quantized checkpoint of the entry (nvidia/MiniMax-M2.5-NVFP4)
        quant = _split_quant(key)[1] if key != by_id[key].lower() else None
        return arch.with_quantization(quant, name=name) if quant and quant != arch.quantization else arch
    # another organisation's copy or quantization of a listed checkpoint ("TheBloke/Mistral-7B-
    # Instruct-v0.2-AWQ" is v0.2's entry, not v0.1's), then the same release under another role
    # word (base / instruct / chat), then by stem (version and date dropped)
    for table, norm in ((by_name, _name_part), (by_variant, _variant), (by_stem, _stem)):
        stem, quant = _split_quant(key, norm)
        if stem in table:
            arch = _catalog_arch(table[stem])
            if quant and arch.quantization != quant:
                return arch.with_quantization(quant, name=name)
            return arch if not quant else replace(arch, name=name)
    # `stem` is the last table's key (by_stem's), which the hint below searches for
    candidates = list(entries) + [a for e in entries.values() for a in e.get("aliases", [])]
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.4)
    if not close:
        close = difflib.get_close_matches(stem, [c.split("/")[-1].lower() for c in candidates],
                                          n=5, cutoff=0.4)
        close = [c for c in candidates if c.split("/")[-1].lower() in close][:5]
    hint = ", ".join(dict.fromkeys(close)) if close else "see `catalog_ids()`"
    raise CatalogError(f"unknown model {name!r} (not a catalog id nor a local config.json); "
                       f"closest catalog names: {hint}")
