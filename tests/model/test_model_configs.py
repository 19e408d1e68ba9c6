"""config.json fields read generically: quantization_config schemes, per-layer MoE patterns, and the
safetensors split (quantization scales kept as stored, MTP layers left out, towers apart)."""
from __future__ import annotations

import json

import pytest

from conftest import VLLM_CPU
from exporter.errors import CatalogError
from exporter.model.architectures import KVShape, arch_from_config, quant_from_config
from exporter.model.kv_cache import bytes_per_token
from exporter.model.setup import Setup, tp_refusal
from exporter.model.weights import from_local_dir, read_header, summarize
from fake_hub import safetensors_header_only

BASE = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
        "max_position_embeddings": 4096}


@pytest.mark.parametrize("qc, scheme, words", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq", "gptq 4-bit"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "gptq-int8", "gptq 8-bit"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "awq", "awq 4-bit"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8",
     "block-wise [128, 128]"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8", "per-tensor"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, "mxfp4", "mxfp4"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "w4a16", "nf4"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "w8a16", "8-bit"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", "NVFP4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}},
     "fp8", "compressed-tensors w8a8 float"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}, "w4a16", "w4a16"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8, "type": "int"}}}},
     "w8a8", "w8a8 int"),
    # Intel AutoRound (its README's quantization_config; vLLM's auto_round.py runs it on Marlin)
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True,
      "packing_format": "auto_round:auto_gptq"}, "gptq", "auto-round int4"),
    ({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": False}, "awq", "auto-round int4"),
    ({"quant_method": "auto-round", "bits": 8, "group_size": 128, "sym": True}, "gptq-int8", "auto-round int8"),
])
def test_quantization_config_schemes(qc, scheme, words):
    got, note = quant_from_config({"quantization_config": qc})
    assert got == scheme and words in note
    arch = arch_from_config({**BASE, "quantization_config": qc}, name="x", where="x")
    assert arch.quantization == scheme and any(words in n for n in arch.notes)


@pytest.mark.parametrize("algo, scheme", [("NVFP4", "nvfp4"), ("FP8", "fp8"), ("FP8_PB_WO", "fp8")])
def test_modelopt_hf_quant_config_names_a_producer_not_a_method(algo, scheme):
    """ModelOpt <= 0.29's hf_quant_config.json: no quant_method, the producer and
    quantization.quant_algo say it (vLLM sets modelopt / modelopt_fp4 from them)."""
    qc = {"producer": {"name": "modelopt", "version": "0.29.0"},
          "quantization": {"quant_algo": algo, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    got, note = quant_from_config({"quantization_config": qc})
    assert got == scheme and f"modelopt {algo}" in note
    arch = arch_from_config({**BASE, "quantization_config": qc}, name="x", where="x")
    assert arch.quantization == scheme and arch.kv_cache_quant == "fp8"
    # an algorithm vLLM's ModelOpt loader does not know is named, not guessed
    qc["quantization"]["quant_algo"] = "W4A8_AWQ"
    got, note = quant_from_config({"quantization_config": qc})
    assert got is None and "'W4A8_AWQ' not modelled" in note


def test_per_layer_moe_flags_pick_the_sparse_layers():
    """MiMo-V2 / MiniMax-M3 list one flag per layer in moe_layer_freq (mimo_v2.py reads
    moe_layer_freq[layer_idx]); the list used to crash the reader with a TypeError."""
    flags = [0, 1, 1, 0, 1, 1, 1, 1]
    cfg = {**BASE, "model_type": "mimo_v2_flash", "num_hidden_layers": 8, "n_routed_experts": 16,
           "num_experts_per_tok": 4, "moe_intermediate_size": 64, "moe_layer_freq": flags}
    arch = arch_from_config(cfg, name="x", where="x")
    assert arch.moe_layers == (1, 2, 4, 5, 6, 7)
    with pytest.raises(CatalogError, match=r"cfg\.json: moe_layer_freq has 7 entries, expected 8"):
        arch_from_config({**cfg, "moe_layer_freq": flags[:7]}, name="x", where="cfg.json")


GEMMA4 = {**BASE, "model_type": "gemma4_text", "num_hidden_layers": 6, "head_dim": 64,
          "sliding_window": 128, "attention_k_eq_v": True,
          "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}


def test_gemma4_full_layers_have_their_own_attention_shape_in_both_config_formats():
    """Public Gemma 4 checkpoints name the full layers' shape (global_head_dim,
    num_global_key_value_heads); transformers >= 5 saves it as per_layer_config instead."""
    public = arch_from_config({**GEMMA4, "global_head_dim": 128, "num_global_key_value_heads": 1},
                              name="x", where="x")
    saved = arch_from_config({**GEMMA4, "per_layer_config": {"05": {"head_dim": 128, "num_key_value_heads": 1}}},
                             name="x", where="x")
    for arch in (public, saved):
        assert arch.kv_shape("full") == KVShape("full", 1, 128, 128, k_eq_v=True)
        assert arch.kv_shape("sliding") == KVShape("sliding", 2, 64, 64)
        assert any(n == "attention shape per layer kind: full 1 KV heads x 128 (K = V), sliding 2 KV heads x 64"
                   for n in arch.notes)
        # K = V: the full layer has no V projection; its O projection reads 4 heads x 128
        h = 256
        assert arch.attention_params_per_layer(5) == h * 4 * 128 + h * 1 * 128 + 4 * 128 * h
        assert arch.attention_params_per_layer(0) == h * 4 * 64 + 2 * h * 2 * 64 + 4 * 64 * h
    # without attention_k_eq_v, num_global_key_value_heads does not apply (configuration_gemma4.py)
    plain = arch_from_config({**GEMMA4, "attention_k_eq_v": False, "global_head_dim": 128,
                              "num_global_key_value_heads": 1}, name="x", where="x")
    assert plain.kv_shape("full") == KVShape("full", 2, 128, 128)
    # a kind whose layers disagree is refused, naming the file
    with pytest.raises(CatalogError, match="/m/config.json: per_layer_config gives the sliding layers"):
        arch_from_config({**GEMMA4, "per_layer_config": {"0": {"head_dim": 128}}}, name="x", where="/m/config.json")


def test_tp_must_split_every_layer_kinds_kv_heads():
    """vLLM's QKVParallelLinear asserts on each layer's own KV heads: 2 split over TP 2, the full
    layers' 3 do not."""
    arch = arch_from_config({**GEMMA4, "global_head_dim": 128, "num_global_key_value_heads": 3},
                            name="x", where="x")
    assert tp_refusal(arch, 2) == ("x's 3 KV heads cannot be split over tensor parallel size 2 (vLLM needs "
                                   "one to divide the other): vLLM refuses to start it at --tp 2")
    assert tp_refusal(arch_from_config({**GEMMA4, "global_head_dim": 128, "num_global_key_value_heads": 1},
                                       name="x", where="x"), 2) is None


def test_gemma4_moe_runs_its_dense_mlp_beside_the_experts():
    """Gemma 4 26B-A4B's shape (its public config's fields): 128 experts of 704, top-8
    (`top_k_experts`), and the dense MLP of 2112 beside the expert block in every layer
    (gemma4.py), read as an always-on shared expert. Google gives it 3.8B active parameters."""
    cfg = {"model_type": "gemma4_text", "num_hidden_layers": 30, "hidden_size": 2816, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
           "attention_k_eq_v": True, "intermediate_size": 2112, "moe_intermediate_size": 704,
           "num_experts": 128, "top_k_experts": 8, "enable_moe_block": True, "vocab_size": 262144,
           "max_position_embeddings": 262144, "sliding_window": 1024, "tie_word_embeddings": True,
           "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5}
    arch = arch_from_config(cfg, name="x", where="x")
    assert (arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (128, 8, 704)
    assert arch.moe_layers == tuple(range(30)) and arch.shared_expert_intermediate_size == 2112
    assert arch.shared_expert_params() == 3 * 2816 * 2112
    assert 3.7e9 < arch.active_params < 3.9e9


def test_jamba_experts_every_other_layer_and_one_expert_is_dense():
    """Jamba v0.1's shape (its public config's fields): 16 experts of intermediate_size on every
    other layer (expert_layer_period 2, offset 1), Mamba1 except one attention layer in eight.
    AI21 gives it 52B parameters, 12B active. `num_experts: 1` is a dense MLP (jamba.py)."""
    cfg = {"model_type": "jamba", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536,
           "max_position_embeddings": 262144, "num_experts": 16, "num_experts_per_tok": 2,
           "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
           "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256}
    arch = arch_from_config(cfg, name="x", where="x")
    assert arch.moe_layers == tuple(range(1, 32, 2)) and arch.moe_intermediate_size == 14336
    assert arch.layer_types.count("full") == 4 and arch.layer_types[4] == "full"
    assert 51e9 < arch.total_params < 53e9 and 11.5e9 < arch.active_params < 12.5e9
    dense = arch_from_config({**cfg, "num_experts": 1}, name="x", where="x")
    assert not dense.is_moe and dense.intermediate_size == 14336


GRANITE_4_H_SMALL = {
    # ibm-granite/granite-4.0-h-small's public config.json fields (attention at four of 40 layers)
    "model_type": "granitemoehybrid", "num_hidden_layers": 40, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 72, "num_experts_per_tok": 10, "intermediate_size": 768,
    "shared_intermediate_size": 1536, "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1, "vocab_size": 100352,
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "position_embedding_type": "nope",
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)]}


def test_granite_4_experts_beside_a_shared_mlp_and_mamba_layers_by_either_name():
    """Granite 4 (granitemoehybrid.py): experts `intermediate_size` wide with a shared MLP of
    `shared_intermediate_size` beside them in every layer; with no experts the shared MLP is the
    only one. IBM gives Granite-4.0-H-Small 32B parameters, 9B active. transformers 5 saves the
    layer kinds as linear_attention / full_attention: still Mamba2 here, since the config
    describes Mamba mixers (a gated delta net's config has linear_* keys)."""
    arch = arch_from_config(GRANITE_4_H_SMALL, name="x", where="x")
    assert (arch.moe_intermediate_size, arch.shared_expert_intermediate_size) == (768, 1536)
    assert arch.layer_types.count("mamba") == 36 and arch.state_layers == 36
    assert 31.5e9 < arch.total_params < 32.5e9 and 8.5e9 < arch.active_params < 9.5e9
    # conv window: expand x hidden (+ B, C); temporal: heads x head_dim x d_state
    assert arch.state.conv_channels == 8192 and arch.state.temporal == 128 * 64 * 128
    renamed = {**GRANITE_4_H_SMALL, "layer_types": [
        "full_attention" if t == "attention" else "linear_attention" for t in GRANITE_4_H_SMALL["layer_types"]]}
    assert arch_from_config(renamed, name="x", where="x").layer_types == arch.layer_types
    dense = arch_from_config({**GRANITE_4_H_SMALL, "num_local_experts": 0, "shared_intermediate_size": 8192},
                             name="x", where="x")
    assert not dense.is_moe and dense.intermediate_size == 8192


def test_falcon_h1_runs_attention_and_mamba_side_by_side_in_every_layer():
    """Falcon-H1 (falcon_h1.py): each layer holds an attention KV cache and a Mamba2 state, and
    its weights have both; the conv window is mamba_d_ssm wide when the config sets it."""
    cfg = {**BASE, "model_type": "falcon_h1", "mamba_d_ssm": 1024, "mamba_n_heads": 8, "mamba_d_head": 64,
           "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2}
    arch = arch_from_config(cfg, name="x", where="x")
    n = cfg["num_hidden_layers"]
    assert arch.parallel_mixers and arch.attention_layers == n and arch.state_layers == n
    assert arch.cache_layer_types == ("full",) * n + ("mamba",) * n
    assert arch.state.conv_channels == 1024 and arch.state.temporal == 8 * 64 * 16
    plain = arch_from_config({**cfg, "model_type": "llama"}, name="x", where="x")
    assert arch.total_params - plain.total_params == n * (arch.mixer_params() + arch.state.other_params)


def test_mimo_v2_sliding_layers_and_narrow_v_heads():
    mimo = {**BASE, "model_type": "mimo_v2_flash", "head_dim": 96, "v_head_dim": 64, "swa_head_dim": 96,
            "swa_num_key_value_heads": 4, "swa_v_head_dim": 64, "sliding_window": 128,
            "hybrid_layer_pattern": [0, 1, 1, 0]}
    arch = arch_from_config(mimo, name="x", where="x")
    assert arch.layer_types == ("full", "sliding", "sliding", "full")
    assert arch.kv_shape("full") == KVShape("full", 2, 96, 64)
    assert arch.kv_shape("sliding") == KVShape("sliding", 4, 96, 64)
    with pytest.raises(CatalogError, match="hybrid_layer_pattern has 3 entries, expected 4"):
        arch_from_config({**mimo, "hybrid_layer_pattern": [0, 1, 0]}, name="x", where="x")
    # MLA's v_head_dim is part of the modelled latent cache; a plain model has no per-kind shape
    plain = arch_from_config(BASE, name="x", where="x")
    assert plain.kind_shapes == () and not any("attention shape" in n for n in plain.notes)


def test_kv_shared_layers_hold_no_cache():
    arch = arch_from_config({**GEMMA4, "num_hidden_layers": 8, "num_kv_shared_layers": 2,
                             "layer_types": ["sliding_attention"] * 5 + ["full_attention"] * 3},
                            name="x", where="x")
    assert arch.cache_layer_types == ("sliding",) * 5 + ("full",)
    assert arch.attention_layers == 8      # they still attend (over an earlier layer's cache)
    with pytest.raises(CatalogError, match="num_kv_shared_layers 8 should be below"):
        arch_from_config({**GEMMA4, "num_hidden_layers": 8, "num_kv_shared_layers": 8,
                          "layer_types": ["sliding_attention"] * 8}, name="x", where="x")


def test_a_field_of_an_unknown_shape_is_a_catalog_error_naming_the_file():
    cfg = {**BASE, "num_key_value_heads": [2, 2, 4, 4]}
    with pytest.raises(CatalogError) as e:
        arch_from_config(cfg, name="x", where="/models/x/config.json")
    assert str(e.value).startswith("/models/x/config.json: config.json not readable") and "llama" in str(e.value)


def test_unmodelled_quantization_is_named_not_refused():
    arch = arch_from_config({**BASE, "quantization_config": {"quant_method": "hqq"}}, name="x", where="x")
    assert arch.quantization is None and any("'hqq' not modelled" in n for n in arch.notes)


def test_qwen_moe_sparse_step_and_mlp_only_layers():
    cfg = {**BASE, "model_type": "qwen2_moe", "num_hidden_layers": 8, "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 128, "decoder_sparse_step": 2,
           "mlp_only_layers": [3]}
    arch = arch_from_config(cfg, name="x", where="x")
    assert arch.moe_layers == (1, 5, 7)   # (i + 1) % 2 == 0, minus the listed dense layer 3


def test_deepseek_first_dense_and_layer_frequency():
    cfg = {**BASE, "model_type": "deepseek_v3", "num_hidden_layers": 8, "n_routed_experts": 16,
           "n_shared_experts": 1, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
           "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
           "qk_nope_head_dim": 32, "v_head_dim": 32}
    arch = arch_from_config(cfg, name="x", where="x")
    assert arch.moe_layers == (3, 4, 5, 6, 7) and arch.attention == "mla" and arch.shared_experts == 1


def test_missing_length_falls_back_to_vllms_2048():
    cfg = {k: v for k, v in BASE.items() if k != "max_position_embeddings"}
    arch = arch_from_config(cfg, name="x", where="x")
    assert arch.max_position_embeddings == 2048 and any("2048" in n for n in arch.notes)


def test_safetensors_split_keeps_scales_as_stored_and_drops_mtp_layers(tmp_path):
    tensors = {
        "model.embed_tokens.weight": ("BF16", [1000, 256]),
        "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [256, 256]),
        "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", [2, 2]),
        "model.layers.0.input_layernorm.weight": ("BF16", [256]),
        "model.layers.4.eh_proj.weight": ("BF16", [256, 512]),            # MTP layer past num_layers
        "vision_tower.blocks.0.attn.qkv.weight": ("F32", [768, 256]),
        "lm_head.weight": ("BF16", [1000, 256]),
    }
    (tmp_path / "model.safetensors").write_bytes(safetensors_header_only(tensors))
    assert read_header(tmp_path / "model.safetensors")["lm_head.weight"]["shape"] == [1000, 256]
    info = from_local_dir(tmp_path, num_layers=4)
    assert info.fixed_bytes == 256 * 256 + 4 * 4          # fp8 weight + fp32 block scales, as stored
    assert info.float_params == 256                       # the norm, loaded in the model dtype
    assert info.skipped_params == 256 * 512 and info.tower_params == 768 * 256
    assert info.embedding_params == 2 * 1000 * 256
    assert info.lm_bytes(2) == 256 * 256 + 16 + 256 * 2
    with pytest.raises(ValueError, match="unknown dtype"):
        summarize([("w", "Q3", 10)], num_layers=None, files=1, where="x")


def test_truncated_safetensors_header_is_an_error_not_a_guess(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="truncated"):
        from_local_dir(tmp_path)


@pytest.mark.parametrize("qc, parts", [
    # compressed-tensors (Kimi-K2.5 INT4): regex patterns
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}},
      "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]},
     {"attention", "shared_experts", "dense_mlp"}),
    # ModelOpt NVFP4 (MiniMax-M2.5-NVFP4): every layer named, routers beside them
    ({"quant_method": "modelopt", "quant_algo": "NVFP4",
      "exclude_modules": ["lm_head", "model.layers.0.block_sparse_moe.gate", "model.layers.0.self_attn*",
                          "model.layers.1.self_attn*"]}, {"attention"}),
    # MXFP4 (gpt-oss)
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                          "model.embed_tokens", "lm_head"]}, {"attention"}),
    # block FP8 (Qwen3-235B-A22B-FP8): norms and routers only, attention is FP8
    ({"quant_method": "fp8", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["lm_head", "model.layers.0.input_layernorm", "model.layers.0.mlp.gate",
                                 "model.layers.0.post_attention_layernorm"]}, set()),
])
def test_layers_a_checkpoint_leaves_unquantized_are_read_from_its_config(qc, parts):
    arch = arch_from_config({**BASE, "quantization_config": qc}, name="x", where="x")
    assert arch.quant_skip == parts
    assert any("left in the model dtype" in n for n in arch.notes) == bool(parts)


KV_LAYOUTS = json.loads((VLLM_CPU / "kv-layouts.json").read_text())["runs"]


@pytest.mark.parametrize("name", sorted(KV_LAYOUTS))
def test_parameters_read_from_config_are_the_ones_the_checkpoint_stores(name):
    """The tiny models booted by real vLLM (tools/vllm_cpu/kv_layouts.py: Gemma 2/3/3n/4, Mistral,
    gpt-oss, Llama 4, DeepSeek-V3, Qwen3-Next, Nemotron-H, Granite 4, Falcon-H1, Jamba, LFM2, the
    Mixtral-layout MoEs and the families read through the generic path) were saved by
    transformers; the parameters read from their config.json alone must be what the checkpoint
    stores, within the biases and norms the reader leaves out."""
    run = KV_LAYOUTS[name]
    arch = arch_from_config(run["config"], name=name, where=name)
    assert abs(arch.total_params / run["parameters"] - 1) < 0.005, (arch.total_params, run["parameters"])


def test_auto_round_formats_it_does_not_model_are_named():
    got, note = quant_from_config({"quantization_config": {"quant_method": "auto-round", "bits": 4,
                                                            "data_type": "mxfp4"}})
    assert got is None and "auto-round mxfp4" in note and "not modelled" in note


@pytest.mark.parametrize("model_id, original", [
    ("microsoft/Phi-3.5-mini-instruct", 4096),          # rope_scaling type longrope
    ("microsoft/Phi-3-medium-128k-instruct", 4096),     # the older spelling, su
])
def test_longrope_models_default_to_their_original_context_from_0_11_1(model_id, original):
    """vLLM PR #27431 (merged 2025-10-23): a LongRoPE model's default max_model_len is its
    original_max_position_embeddings, so the short factors apply; before it, and whenever
    --max-model-len is given, the 128K of max_position_embeddings (or the given length) stands."""
    old = Setup.build(model_id, "H100-SXM-80GB", vllm_version="0.11.0")
    new = Setup.build(model_id, "H100-SXM-80GB", vllm_version="0.12.0")
    given = Setup.build(model_id, "H100-SXM-80GB", vllm_version="0.12.0", max_model_len=32768)
    assert (old.max_model_len, new.max_model_len, given.max_model_len) == (131072, original, 32768)
    # a model without LongRoPE keeps its own length on every release
    assert Setup.build("Qwen/Qwen2.5-7B-Instruct", "H100-SXM-80GB", vllm_version="0.12.0").max_model_len == 32768


def test_model_max_length_is_the_derived_length_as_vllm_reads_it():
    """vLLM's _get_and_verify_max_len reads model_max_length (Command-R, ALiBi Baichuan2-13B) and
    takes it over the other length keys: a Command-R-shaped config derives 131072, not 8192."""
    cfg = {"model_type": "cohere", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
           "model_max_length": 131072}
    assert arch_from_config(cfg, name="c", where="c").max_position_embeddings == 131072
    del cfg["max_position_embeddings"]
    cfg["model_max_length"] = 4096
    assert arch_from_config(cfg, name="c", where="c").max_position_embeddings == 4096


NAS = {"model_type": "nemotron-nas", "num_hidden_layers": 4, "hidden_size": 768, "num_attention_heads": 12,
       "num_key_value_heads": None, "intermediate_size": None, "vocab_size": 1000,
       "max_position_embeddings": 4096}


def test_nemotron_nas_blocks_are_read_layer_by_layer_as_vllm_builds_them():
    """DeciLM / Nemotron-NAS block_configs: a no-op attention leaves the layer without a KV cache
    (vLLM's nemotron_nas.py builds no attention module there); KV heads are heads /
    n_heads_in_group; each MLP is round_up(int(2 x ffn_mult x hidden / 3), 256) wide."""
    blocks = [{"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 1.0}},      # 512 -> 512
              {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.3}},              # 665 -> 768
              {"attention": {"n_heads_in_group": 4}, "ffn": {"no_op": True}},        # attention only
              {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.625}}]            # 1344 -> 1536
    arch = arch_from_config({**NAS, "block_configs": blocks}, name="nas", where="nas")
    assert arch.num_kv_heads == 3 and arch.attention_layers == 2
    assert [arch.mlp_width(i) for i in range(4)] == [512, 768, 0, 1536]
    assert [arch.has_mlp(i) for i in range(4)] == [True, True, False, True]
    attn = 768 * 768 * 2 + 768 * 3 * 64 * 2          # q, o and k, v of 3 KV heads of 64
    mlp = 3 * 768 * (512 + 768 + 1536)
    linear, experts, _ = arch.layer_params()
    assert (linear, experts) == (2 * attn + mlp, 0)
    # KV: the two attending layers only, 3 heads x 64 x (K, V) x 2 bytes each
    assert bytes_per_token(Setup.build(arch, "H100-SXM-80GB")) == 2 * 3 * 64 * 2 * 2


@pytest.mark.parametrize("blocks, words", [
    ([{"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}}] * 4, "linear layer"),
    ([{"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 1.0}},
      {"attention": {"n_heads_in_group": 6}, "ffn": {"ffn_mult": 1.0}}] * 2, "differ by layer"),
    ([{"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 1.0}}] * 3, "3 entries, expected 4"),
    ([{"attention": {"n_heads_in_group": 5}, "ffn": {"ffn_mult": 1.0}}] * 4, "should divide"),
])
def test_nemotron_nas_blocks_it_cannot_describe_are_refused_by_name(blocks, words):
    with pytest.raises(CatalogError, match=words):
        arch_from_config({**NAS, "block_configs": blocks}, name="nas", where="nas/config.json")


def gemma3n(layers: int = 5, **text) -> dict:
    """A small Gemma 3n config in the layout of google/gemma-3n-E2B-it's (text_config beside the
    audio and vision towers' configs)."""
    t = {"model_type": "gemma3n_text", "num_hidden_layers": layers, "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": [1024] * layers, "vocab_size": 1000,
         "vocab_size_per_layer_input": 800, "hidden_size_per_layer_input": 32, "num_kv_shared_layers": 2,
         "sliding_window": 512, "max_position_embeddings": 32768, "altup_num_inputs": 4, "laurel_rank": 16,
         "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
         "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"], **text}
    return {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"], "torch_dtype": "bfloat16",
            "text_config": t,
            "audio_config": {"model_type": "gemma3n_audio", "hidden_size": 128, "conf_num_hidden_layers": 2,
                             "vocab_size": 128},
            "vision_config": {"model_type": "gemma3n_vision", "architecture": "mobilenetv5_300m_enc",
                              "hidden_size": 256, "vocab_size": 128}}


def test_gemma3n_per_layer_embeddings_altup_laurel_and_kv_shared_layers_as_vllm_builds_them():
    """gemma3n.py: the last num_kv_shared_layers attend over an earlier layer's cache; a
    Per-Layer Embedding table of vocab_size_per_layer_input x layers x width beside embed_tokens,
    projected from the hidden state, gated and projected back in every layer (ReplicatedLinear);
    AltUp's 2 x (n - 1) hidden x hidden projections and LAuReL's rank-r residual per layer; the
    output head tied to embed_tokens."""
    arch = arch_from_config(gemma3n(), name="g", where="g")
    h, n = 256, 5
    assert arch.tie_word_embeddings and arch.kv_shared_layers == 2
    assert arch.cache_layer_types == ("sliding",) * 3          # layers 3 and 4 hold no cache
    assert arch.ple_embedding_params == 800 * n * 32
    attn_full = h * 4 * 64 * 2 + h * 2 * 64 * 2                # q, o; k, v of 2 KV heads
    attn_shared = h * 4 * 64 * 2                               # q, o only
    per_layer = 3 * h * 1024 + 2 * h * 32 + 2 * h * 16         # MLP, PLE gate + projection, LAuReL
    model_level = h * n * 32 + 2 * 3 * h * h                   # PLE projection, AltUp in and out
    linear, experts, _ = arch.layer_params()
    assert (linear, experts) == (3 * attn_full + 2 * attn_shared + n * per_layer + model_level, 0)
    assert arch.replicated_linear_params() == n * 2 * h * 32
    # the towers, estimated from their configs: a 2-block conformer 128 wide, MobileNet-V5 300M
    assert arch.extra_params == (24 * 128 * 128 * 2 + 128 * 128 + 128 * h) + (300 * 10**6 + 128 * h + h * h)
    assert any("towers estimated" in note for note in arch.notes)
    # KV: 3 sliding layers x 2 heads x 64 x (K, V) x 2 bytes
    assert bytes_per_token(Setup.build(arch, "H100-SXM-80GB")) == 3 * 2 * 64 * 2 * 2


def test_per_layer_embeddings_are_held_but_not_read_in_a_step():
    """The PLE table adds to the weights every rank holds (split by vocabulary) and to nothing a
    decode step streams: a token gathers its row."""
    from exporter.model.kv_cache import weights_bytes
    from exporter.model.perf import step_time_s
    with_ple = arch_from_config(gemma3n(hidden_size_per_layer_input=32), name="g", where="g")
    big = arch_from_config(gemma3n(hidden_size_per_layer_input=32, vocab_size_per_layer_input=200_000),
                           name="g", where="g")
    small, large = Setup.build(with_ple, "H100-SXM-80GB"), Setup.build(big, "H100-SXM-80GB")
    grown = (big.ple_embedding_params - with_ple.ple_embedding_params) * 2
    assert weights_bytes(large) - weights_bytes(small) == pytest.approx(grown, rel=1e-9)
    assert step_time_s(large, decode_seqs=8, decode_context_tokens=8 * 1024, prefill_tokens=0) == pytest.approx(
        step_time_s(small, decode_seqs=8, decode_context_tokens=8 * 1024, prefill_tokens=0), rel=1e-6)
    # at TP2 each rank holds half of the table's rows
    tp2 = [weights_bytes(Setup.build(a, "H100-SXM-80GB", tp=2)) for a in (with_ple, big)]
    assert tp2[1] - tp2[0] == pytest.approx(grown / 2, rel=1e-9)


@pytest.mark.parametrize("widths, words", [([1024] * 4, "lists 4 widths; expected 5"),
                                           ([1024, 1024, 0, 1024, 1024], "positive integers")])
def test_gemma3n_mlp_width_lists_must_give_each_layer_one(widths, words):
    with pytest.raises(CatalogError, match=words):
        arch_from_config(gemma3n(intermediate_size=widths), name="g", where="g/config.json")


def test_matformer_widths_and_gemma4_double_wide_mlps_are_read_per_layer():
    arch = arch_from_config(gemma3n(intermediate_size=[512, 1024, 1024, 2048, 2048]), name="g", where="g")
    assert [arch.mlp_width(i) for i in range(5)] == [512, 1024, 1024, 2048, 2048] and arch.intermediate_size == 2048
    g4 = {"model_type": "gemma4_text", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "global_head_dim": 128, "intermediate_size": 1024,
          "vocab_size": 1000, "max_position_embeddings": 4096, "num_kv_shared_layers": 2, "sliding_window": 512,
          "use_double_wide_mlp": True, "hidden_size_per_layer_input": 16,
          "layer_types": ["sliding_attention", "full_attention"] * 2}
    arch = arch_from_config(g4, name="g4", where="g4")
    assert [arch.mlp_width(i) for i in range(4)] == [1024, 1024, 2048, 2048]
    assert arch.ple_embedding_params == 1000 * 4 * 16 and arch.altup_inputs == arch.laurel_rank == 0


def lfm2(**over) -> dict:
    """A config in the layout of LiquidAI's first LFM2 releases: attention layers listed in
    full_attn_idxs (no layer_types), the MLP width as block_ff_dim, tie_embedding."""
    return {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "num_hidden_layers": 16,
            "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 65536,
            "max_position_embeddings": 128000, "block_ff_dim": 12288, "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True, "conv_dim": 2048,
            "conv_L_cache": 3, "conv_bias": False, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
            "tie_embedding": True, "torch_dtype": "bfloat16", **over}


def test_lfm2_short_convolutions_hold_a_conv_window_and_no_cache():
    """lfm2.py: the layers outside full_attn_idxs run ShortConv (in_proj to 3 x conv_dim, a
    depthwise conv of conv_L_cache, out_proj); its state is conv_dim x (conv_L_cache - 1) in the
    model dtype (short_conv_state_shape), with prefix caching 2 blocks a request, not Mamba2's 3
    (no prefill checkpoint in ShortConv); the MLP is 2/3 of block_ff_dim rounded up to
    block_multiple_of (Lfm2MLP)."""
    from exporter.model.kv_cache import kv_groups, state_blocks
    arch = arch_from_config(lfm2(), name="lfm2", where="lfm2")
    assert arch.attention_layers == 6 and arch.state_layers == 10 and arch.tie_word_embeddings
    assert arch.intermediate_size == 8192                      # int(2 x 12288 / 3) = 8192, a multiple of 256
    assert arch.state_bytes(1) == 2048 * 2 * 2 and arch.state_bytes(2) == 1024 * 2 * 2
    assert any("10 short-conv" in note for note in arch.notes)
    h = 2048
    attn = h * h * 2 + h * 8 * 64 * 2                          # q, o; k, v of 8 KV heads x 64
    conv = 4 * h * 2048                                        # in_proj (B, C, x) and out_proj
    linear, experts, _ = arch.layer_params()
    assert (linear, experts) == (6 * attn + 10 * conv + 16 * 3 * h * 8192, 0)
    setup = Setup.build(arch, "H100-SXM-80GB", vllm_version="0.32.0")
    assert bytes_per_token(setup) == 6 * 8 * 64 * 2 * 2        # KV only on the attention layers
    assert state_blocks(setup, "mamba") == 2 and kv_groups(setup).kinds.count("mamba") > 0
    # the same model with layer_types, intermediate_size and tie_word_embeddings, as transformers 5 saves it
    types = ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]
    saved = {k: v for k, v in lfm2().items() if k not in ("full_attn_idxs", "block_ff_dim", "tie_embedding")}
    again = arch_from_config({**saved, "layer_types": types, "intermediate_size": 12288,
                              "tie_word_embeddings": True}, name="lfm2", where="lfm2")
    assert (again.layer_params(), again.layer_types, again.state) == (arch.layer_params(), arch.layer_types, arch.state)


def test_moe_configs_without_moe_intermediate_size_read_experts_at_intermediate_size():
    """OLMoE and PhiMoE configs (Mixtral's layout) give the experts' width as intermediate_size
    and have no moe_intermediate_size (olmoe.py, phimoe.py); before, reading them stopped at the
    missing key. An unfamiliar type in that layout is read the same way, and says so."""
    olmoe = {**BASE, "model_type": "olmoe", "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8}
    arch = arch_from_config(olmoe, name="olmoe", where="olmoe")
    assert (arch.moe_intermediate_size, arch.num_experts, arch.experts_per_token) == (1024, 64, 8)
    assert arch.moe_layers == (0, 1, 2, 3) and not any("no moe_intermediate_size" in n for n in arch.notes)
    other = arch_from_config({**olmoe, "model_type": "some_moe"}, name="x", where="x")
    assert other.moe_intermediate_size == 1024 and any("no moe_intermediate_size" in n for n in other.notes)
    # a config that names it keeps it
    named = arch_from_config({**olmoe, "model_type": "some_moe", "moe_intermediate_size": 256}, name="x", where="x")
    assert named.moe_intermediate_size == 256


def test_cohere2_moe_dense_prefix_shared_expert_and_one_token_wider_window():
    """cohere2_moe.py: mlp_layer_types says which layers are sparse; the leading dense layers are
    prefix_dense_intermediate_size wide; num_shared_experts shared experts of intermediate_size
    run beside the routed ones; a sliding layer attends over sliding_window + 1 tokens."""
    cfg = {**BASE, "model_type": "cohere2_moe", "intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
           "num_shared_experts": 1, "prefix_dense_intermediate_size": 384, "sliding_window": 128,
           "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
           "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    arch = arch_from_config(cfg, name="c", where="c")
    assert arch.moe_layers == (1, 2, 3) and arch.mlp_width(0) == 384 and arch.shared_experts == 1
    assert arch.sliding_window == 129 and arch.layer_types == ("sliding",) * 3 + ("full",)
    with pytest.raises(CatalogError, match="mlp_layer_types has 3 entries, expected 4"):
        arch_from_config({**cfg, "mlp_layer_types": ["dense", "sparse", "sparse"]}, name="c", where="c")


def test_a_model_type_the_reader_would_misread_is_refused_with_the_reason():
    """Kimi Linear's config has the standard fields, so the generic path would read its delta
    attention layers as gated delta nets of default sizes; it is refused instead, by name."""
    cfg = {**BASE, "model_type": "kimi_linear", "num_experts": 4, "num_experts_per_token": 2,
           "moe_intermediate_size": 64, "kv_lora_rank": 128,
           "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    with pytest.raises(CatalogError, match="kimi/config.json: model_type 'kimi_linear' is not modelled: .*Delta"):
        arch_from_config(cfg, name="kimi", where="kimi/config.json")


@pytest.mark.parametrize("model_type, fields, state", [
    # Mamba1 (mamba.py): conv (d_conv - 1) x d_inner and temporal d_inner x d_state, bf16
    ("mamba", {"intermediate_size": 256, "state_size": 16, "conv_kernel": 4, "expand": 2, "time_step_rank": 8},
     (3 * 256 + 256 * 16) * 2),
    # Mamba2 (mamba2.py): conv over x, B and C; temporal heads x head_dim x d_state
    ("mamba2", {"num_heads": 4, "head_dim": 64, "state_size": 16, "n_groups": 1, "conv_kernel": 4, "expand": 2},
     (3 * (256 + 2 * 16) + 4 * 64 * 16) * 2),
])
def test_attention_free_models_are_their_mixers_alone(model_type, fields, state):
    """Mamba and Mamba2 configs have no attention heads, no MLP and no length key. Every layer is
    a mixer holding one state per request: vLLM groups them all, takes max_model_len as the
    block (prefix caching stays off for these models) and a --max-model-len as given."""
    from exporter.model.kv_cache import kv_capacity
    cfg = {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": 128, "vocab_size": 4096,
           "tie_word_embeddings": True, **fields}
    arch = arch_from_config(cfg, name=model_type, where=model_type)
    assert (arch.attention_layers, arch.state_layers, arch.state_bytes(1)) == (0, 4, state)
    assert not arch.length_in_config and all(not arch.has_mlp(i) for i in range(4))
    setup = Setup.build(arch, "H100-SXM-80GB", vllm_version="0.32.0", max_model_len=4096,
                        kv_cache_memory_bytes=64 << 20, block_size=128)
    assert not setup.enable_prefix_caching
    cap = kv_capacity(setup)
    assert cap.gpu_blocks == (64 << 20) // (4 * state) and cap.tokens == cap.gpu_blocks * 4096
    assert tp_refusal(arch, 2) is None       # no attention heads for TP to divide


def test_afmoe_gates_every_attention_output():
    """afmoe.py: self_attn.gate_proj (hidden -> heads x head_dim) beside q, k, v and o in every
    layer, with no config key saying so."""
    cfg = {**BASE, "model_type": "afmoe", "head_dim": 64, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64, "num_dense_layers": 1, "num_shared_experts": 1}
    arch = arch_from_config(cfg, name="a", where="a")
    assert arch.attn_output_gate and arch.moe_layers == (1, 2, 3)
    assert arch.attention_params_per_layer(0) == 256 * 4 * 64 * 2 + 256 * 2 * 64 * 2 + 4 * 64 * 256
