"""KV capacity against public vLLM startup logs that ../shared does not carry: 26 startups of
llm-d-planner's vLLM 0.19.0 accuracy sweep on one H100-80GB (79.19 GiB reported, util 0.95,
max_model_len 8192 unless noted, defaults otherwise; github.com/jgchn/llm-d-planner,
accuracy/results/v0.19.0/results_raw.csv at a95e9f62 and runs/*.json at cb666596, PR #205): model families the constants were
not fitted on (Gemma 2 and 3, Granite, Phi, Mixtral, Kimi-Dev, Qwen3-MoE). Each row: the flags,
and what the log printed: KV cache tokens and the pool ("Available KV cache memory") in GiB."""
from __future__ import annotations

import pytest

from exporter.model.kv_cache import GIB, kv_capacity
from exporter.model.setup import Setup

# model, tp, dtype, max_model_len, logged KV tokens, logged pool GiB
STARTUPS = [
    ("google/gemma-2-27b-it", 1, "bfloat16", 8192, 58672, 20.59),
    ("google/gemma-2-2b-it", 1, "bfloat16", 8192, 670160, 66.47),
    ("google/gemma-2-9b-it", 1, "bfloat16", 8192, 168880, 54.12),
    ("google/gemma-3-12b-it", 1, "bfloat16", 8192, 130304, 47.72),
    ("google/gemma-3-27b-it", 1, "bfloat16", 8192, 36560, 19.53),
    ("google/gemma-3-4b-it", 1, "bfloat16", 8192, 468144, 62.51),
    ("google/gemma-7b", 1, "bfloat16", 8192, 129760, 55.44),
    ("ibm-granite/granite-3.1-2b-instruct", 1, "bfloat16", 8192, 908048, 69.28),
    ("ibm-granite/granite-3.1-8b-instruct", 1, "bfloat16", 8192, 384432, 58.66),
    ("ibm-granite/granite-3.3-8b-instruct", 1, "bfloat16", 8192, 384432, 58.66),
    ("ibm-granite/granite-vision-3.3-2b", 1, "bfloat16", 8192, 899792, 68.65),
    ("microsoft/phi-2", 1, "float16", 2048, 226112, 69.0),
    ("microsoft/phi-4", 1, "bfloat16", 8192, 241568, 46.08),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 2, "bfloat16", 8192, 465936, 28.44),
    ("moonshotai/Kimi-Dev-72B", 2, "bfloat16", 8192, 19776, 3.02),
    ("moonshotai/Kimi-Dev-72B", 4, "bfloat16", 8192, 481296, 36.72),
    ("Qwen/Qwen3-30B-A3B", 1, "bfloat16", 8192, 168288, 15.41),
    # the sweep's runs/*.json at cb666596 that results_raw.csv leaves out (TP 2 and 4, float16)
    ("ibm-granite/granite-3.1-2b-instruct", 2, "bfloat16", 8192, 1834528, 69.98),
    ("ibm-granite/granite-3.1-8b-instruct", 4, "bfloat16", 8192, 1792912, 68.39),
    ("ibm-granite/granite-3.3-8b-instruct", 2, "bfloat16", 8192, 847536, 64.66),
    ("ibm-granite/granite-vision-3.3-2b", 2, "bfloat16", 8192, 1823408, 69.56),
    ("microsoft/phi-4", 2, "bfloat16", 8192, 606784, 57.87),
    ("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 2, "bfloat16", 8192, 633408, 48.33),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 4, "bfloat16", 8192, 1652432, 50.43),
    ("Qwen/Qwen3-30B-A3B", 4, "bfloat16", 8192, 2454064, 56.17),
    ("Qwen/Qwen2.5-7B-Instruct", 1, "float16", 8192, 1096000, 58.53),
]


def _capacity(model: str, tp: int, dtype: str, mml: int):
    s = Setup.build(model, "H100-80GB", tp=tp, dtype=dtype, max_model_len=mml, gpu_memory_gib=79.19,
                    gpu_memory_utilization=0.95, vllm_version="0.19.0")
    return kv_capacity(s)


@pytest.mark.parametrize("model,tp,dtype,mml,tokens,pool_gib", STARTUPS,
                         ids=[f"{r[0].split('/')[1]}-tp{r[1]}" for r in STARTUPS])
def test_pool_within_0_35_gib_of_the_log(model, tp, dtype, mml, tokens, pool_gib):
    """The pool is what is left of 75.23 GiB after weights, the profile run's peak, non-torch
    memory and CUDA graphs: all of those within 0.35 GiB together. (Before this check's fixes
    Gemma 3 held 0.33-0.56 GiB of rotary caches we did not count, and Mixtral's profile peak was
    put 0.58 GiB too high. Left: Granite 3.1's non-torch memory is 0.46 GiB where every other
    TP1 run here logs 0.24-0.27, so its pools are 0.24-0.27 GiB high; Mistral-Small-3.1 at TP2
    loads 22.80 GiB, 44.76 / 2 + 0.42, as if its Pixtral tower were whole on each rank, where
    its w8a8 release at TP2 loads 24.07 / 2 + 0.08 (../shared): 0.34 GiB high.)"""
    kv = _capacity(model, tp, dtype, mml)
    assert kv.memory.kv_cache_gib == pytest.approx(pool_gib, abs=0.35)


def test_tokens_on_unfitted_families():
    errors = []
    for model, tp, dtype, mml, tokens, _ in STARTUPS:
        errors.append(abs(_capacity(model, tp, dtype, mml).tokens - tokens) / tokens)
    # mean 0.44 % (0.62 % before the rotary caches and the MoE peak); the worst is Kimi-Dev-72B
    # at TP2, whose 3 GiB pool turns 0.11 GiB into 3.8 %
    assert sum(errors) / len(errors) <= 0.006
    assert sorted(errors)[-2] <= 0.015


def test_profile_peak_counts_shared_experts_as_a_dense_mlp_and_routed_ones_once():
    """The dummy forward's widest dense MLP in an MoE model is its shared experts (Qwen2-MoE's
    one shared_expert_intermediate_size wide, or n_shared_experts of the expert width); its routed
    experts are the fused-MoE workspace alone. A small-vocabulary config where the forward term
    decides: 8,192 tokens x (6 B x the 8,192-wide shared expert + 8 B x the 1,024-wide hidden)."""
    from exporter.model.architectures import arch_from_config
    from exporter.model.kv_cache import CALIBRATION, activation_bytes
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 2048, "moe_intermediate_size": 256,
           "num_experts": 8, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 8192,
           "vocab_size": 1000, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    m = arch_from_config(cfg, name="moe", where="test")
    assert m.shared_expert_width == 8192
    s = Setup.build(m, "H100-80GB", max_model_len=8192, vllm_version="0.19.0")
    assert s.max_num_batched_tokens == 8192
    assert activation_bytes(s) == pytest.approx(8192 * (CALIBRATION["forward_bytes_per_token_inter"] * 8192
                                                        + CALIBRATION["forward_bytes_per_token_hidden"] * 1024))
    # n_shared_experts of the expert width (DeepSeek style) is the same width
    deep = arch_from_config({**{k: v for k, v in cfg.items() if k != "shared_expert_intermediate_size"},
                             "model_type": "deepseek_v2", "n_shared_experts": 32, "n_routed_experts": 8,
                             "first_k_dense_replace": 0, "q_lora_rank": None, "kv_lora_rank": 512,
                             "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
                            name="deep", where="test")
    assert deep.shared_expert_width == 32 * 256
