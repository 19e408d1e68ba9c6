"""The rotary cos/sin caches vLLM keeps beside the weights, and the rope rules of max_model_len.

vLLM's get_rope (model_executor/layers/rotary_embedding/__init__.py) builds one cache per distinct
rope, [positions, rotary_dim] in the model dtype on every rank: a linear or dynamic rope spans
max_position x factor positions, a yarn rope original x factor. Gemma 3 runs two ropes (gemma3.py:
its sliding layers a default rope at rope_local_base_freq, its full layers the config's linear x8),
and vLLM's _get_and_verify_max_len skips the rope factor for it ("gemma3" not in model_type: its
128K already counts the x8). Figures checked against llm-d-planner's vLLM 0.19.0 startup logs on
H100-80GB (79.19 GiB, util 0.95, max_model_len 8192; accuracy/results/v0.19.0/results_raw.csv of
github.com/jgchn/llm-d-planner, PR #205), which ../shared does not carry."""
from __future__ import annotations

import pytest

from exporter.model.architectures import arch_from_config
from exporter.model.kv_cache import GIB, kv_capacity, weights_bytes
from exporter.model.setup import Setup

GEMMA3_4B_TEXT = {"model_type": "gemma3_text", "num_hidden_layers": 34, "hidden_size": 2560,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                  "intermediate_size": 10240, "vocab_size": 262208, "sliding_window": 1024,
                  "sliding_window_pattern": 6, "max_position_embeddings": 131072,
                  "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                  "rope_scaling": {"rope_type": "linear", "factor": 8.0}}


def _h100(model: str) -> Setup:
    return Setup.build(model, "H100-80GB", gpu_memory_gib=79.19, gpu_memory_utilization=0.95,
                       max_model_len=8192, vllm_version="0.19.0")


@pytest.mark.parametrize("model,loaded_gib,kv_tokens", [
    ("google/gemma-3-4b-it", 8.58, 468144),
    ("google/gemma-3-12b-it", 23.31, 130304),
    ("google/gemma-3-27b-it", 51.45, 36560),
])
def test_gemma3_holds_a_local_and_a_linear_x8_global_rope_cache(model, loaded_gib, kv_tokens):
    s = _h100(model)
    m = s.model
    # 131072 positions for the sliding layers' rope, 8 x 131072 for the full layers', each head_dim wide
    assert m.rope_cache_size == 9 * 131072 * m.head_dim
    # "Model loading took" in the startup log; before the second cache we were 0.33-0.56 GiB short
    assert weights_bytes(s) / GIB == pytest.approx(loaded_gib, abs=0.1)
    # KV tokens within 1.5 % (before: +0.9 / +1.4 / +2.5 %)
    assert kv_capacity(s).tokens == pytest.approx(kv_tokens, rel=0.015)


def test_gemma3_max_model_len_does_not_apply_the_rope_factor_again():
    m = arch_from_config({"model_type": "gemma3", "text_config": GEMMA3_4B_TEXT}, name="g3", where="test")
    assert m.max_position_embeddings == 131072          # not 8 x 131072
    assert m.rope_cache_size == (131072 + 8 * 131072) * 256


def test_transformers5_nested_rope_parameters():
    """transformers 5 writes rope parameters per layer type; the same model reads the same."""
    nested = {k: v for k, v in GEMMA3_4B_TEXT.items() if k not in ("rope_scaling", "rope_theta")}
    nested["rope_parameters"] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                    "rope_theta": 1000000.0}}
    flat = arch_from_config(GEMMA3_4B_TEXT, name="flat", where="test")
    m = arch_from_config(nested, name="nested", where="test")
    assert (m.max_position_embeddings, m.rope_cache_size) == (flat.max_position_embeddings, flat.rope_cache_size)
    # another family's nested linear rope still scales max_model_len, as vLLM's loop over them does
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
             "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
             "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0}}}
    assert arch_from_config(llama, name="l", where="test").max_position_embeddings == 16384


def test_one_rope_models_keep_one_cache_of_the_derived_length():
    """A single rope: linear/dynamic span max_position x factor, yarn original x factor: the
    derived max_model_len either way, so one cache of it."""
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
            "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}
    yarn = arch_from_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 2048}},
                            name="y", where="test")
    assert yarn.max_position_embeddings == 8192 and yarn.rope_cache_size == 8192 * 64
    dynamic = arch_from_config({**base, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, name="d", where="test")
    assert dynamic.max_position_embeddings == 8192 and dynamic.rope_cache_size == 8192 * 64
    plain = arch_from_config(base, name="p", where="test")
    assert plain.rope_cache_size == 4096 * 64
    # Gemma 3 whose two ropes are the same (no scaling, one base) shares one cache, as get_rope does
    same = {**GEMMA3_4B_TEXT, "rope_theta": 10000.0}
    del same["rope_scaling"]
    assert arch_from_config(same, name="s", where="test").rope_cache_size == 131072 * 256


def test_gemma4_caches_the_whole_global_head_for_its_proportional_rope():
    """Gemma 4 (transformers 5 config: rope parameters per layer type): the sliding layers' default
    rope over head_dim 256, the full layers' proportional rope over the whole global_head_dim
    (Gemma4RotaryEmbedding passes head_size as rotary_dim; partial_rotary_factor only zeroes
    frequencies), both over max_position_embeddings: 384 MiB at 262,144 positions, not the 128 MiB
    of one head_dim-wide cache."""
    from test_kv_cache import GEMMA4_31B
    cfg = {**GEMMA4_31B, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}}
    m = arch_from_config(cfg, name="gemma4", where="test")
    assert m.max_position_embeddings == 262144
    assert m.rope_cache_size == 262144 * (256 + 512)
    assert m.rope_cache_size * 2 / 2**20 == 384
