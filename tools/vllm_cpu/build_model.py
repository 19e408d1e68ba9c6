"""Build a tiny random-weight Llama model directory that vLLM can serve without a model hub.

Why: this machine reaches no model hub, yet we want captures of a *real* vLLM engine (scheduler,
paged KV cache, preemption, prefix caching, n-gram speculation, metrics). Random weights make the
generated text noise, but every engine mechanism is exercised for real. Everything is seeded so the
same command produces the same model and tokenizer every time.

Usage: python build_model.py OUT_DIR [--layers 2 --hidden 128 --heads 4 --kv-heads 2
       --vocab 4096 --max-pos 4096 --seed 0]
       python build_model.py OUT_DIR --arch gemma4 --layers 6 --heads 4 --kv-heads 4 --head-dim 32 \
           --global-head-dim 64 --global-kv-heads 1 --sliding-window 128 [--kv-shared-layers 0]

`--arch` builds another architecture instead of Llama (`ARCHS`: Gemma 2, 3, 3n and 4, Mistral,
DeepSeek-V3, gpt-oss, Llama 4, Jamba, Qwen3-Next, Nemotron-H, Granite 4, Falcon-H1, LFM2 and
LFM2-MoE, Cohere2-MoE, EXAONE 4, OLMo 3, OLMoE, GLM-4.7-Flash's layout, Mamba, Falcon-Mamba,
Mamba2, AFMoE, Granite SWA, EXAONE-MoE, Nemotron), each a small instance of
what makes its KV accounting or its parameter count special, and eight decoders of one attention
shape whose configs the reader takes through its generic path; the Gemma 4 one gives its full layers an
attention shape of their own (`--global-head-dim`, `--global-kv-heads`), which makes vLLM unify KV
pages of different sizes (tools/vllm_cpu/kv_layouts.py).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYLLABLES = [
    "ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "sa", "do", "fu", "gi", "ho", "ja",
    "ke", "li", "mo", "nu", "pa", "qui", "re", "so", "tu", "va", "we", "xi", "yo", "ze", "bra",
    "cle", "dri", "flo", "gru", "pla", "stre", "tho", "ung", "ver", "wix",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(seed: int, lines: int = 20000) -> list[str]:
    """Deterministic pseudo-language text: words from syllables, numbers and punctuation."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for _ in range(lines):
        n = rng.randint(5, 30)
        toks = []
        for _ in range(n):
            r = rng.random()
            if r < 0.05:
                toks.append(str(rng.randint(0, 9999)))
            else:
                toks.append(rng.choice(words))
        out.append(" ".join(toks) + rng.choice([".", "!", "?", ",", ";"]))
    return out


def build_tokenizer(out: Path, vocab: int, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "model_max_length": 1_000_000,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2) + "\n"
    )


def build_model(out: Path, a: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    if a.arch != "llama":
        build_arch(out, a)
        return
    cfg = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 4,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.max_pos,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


# the other architectures: (config class, model class, fields beyond the shared ones), each a small
# instance of what makes its KV accounting special
ARCHS = {
    # sliding layers and one full layer in six, the full layers with a shape of their own
    # (--global-head-dim, --global-kv-heads; K = V as in the public checkpoints)
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 4, head_dim=a.head_dim, global_head_dim=a.global_head_dim,
        num_global_key_value_heads=a.global_kv_heads, attention_k_eq_v=True,
        sliding_window=a.sliding_window, num_kv_shared_layers=a.kv_shared_layers,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=a.vocab, tie_word_embeddings=True)),
    # Gemma 3n: Per-Layer Embeddings (a vocab x layers x --ple-width table gathered per token),
    # AltUp's four streams, LAuReL, a MatFormer width per layer (--mlp-widths), one full layer in
    # five and the last --kv-shared-layers layers reading earlier layers' cache
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM", lambda a: dict(
        intermediate_size=a.mlp_widths or a.hidden * 4, head_dim=a.head_dim,
        sliding_window=a.sliding_window, num_kv_shared_layers=a.kv_shared_layers,
        hidden_size_per_layer_input=a.ple_width, vocab_size_per_layer_input=a.vocab,
        altup_num_inputs=4, laurel_rank=a.laurel_rank,
        activation_sparsity_pattern=[0.0] * a.layers, tie_word_embeddings=True)),
    # LFM2: gated short convolutions (a conv-window state, no temporal state) with attention on
    # every third layer; conv_dim and block_dim as LiquidAI's configs carry them (vLLM's lfm2.py
    # reads both, transformers' Lfm2Config neither)
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, conv_dim=a.hidden, block_dim=a.hidden, conv_L_cache=3,
        layer_types=["full_attention" if i % 3 == 2 else "conv" for i in range(a.layers)],
        tie_word_embeddings=True)),
    # LFM2-MoE: the same layers, a dense first layer, then routed experts
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        num_dense_layers=1, conv_L_cache=3,
        layer_types=["full_attention" if i % 3 == 2 else "conv" for i in range(a.layers)],
        tie_word_embeddings=True)),
    # Cohere2-MoE: three sliding layers to one full, a dense first layer (its own width), routed
    # experts intermediate_size wide and a shared one
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim, sliding_window=a.sliding_window,
        mlp_layer_types=["dense"] + ["sparse"] * (a.layers - 1), prefix_dense_intermediate_size=a.hidden * 3,
        num_experts=8, num_experts_per_tok=2, num_shared_experts=1, tie_word_embeddings=True)),
    # EXAONE 4: three sliding-window layers to one full (sliding_window_pattern)
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim, sliding_window=a.sliding_window,
        sliding_window_pattern=4, tie_word_embeddings=False)),
    # OLMo 3: three sliding-window layers to one full (layer_types)
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, sliding_window=a.sliding_window, tie_word_embeddings=False)),
    # OLMoE: experts intermediate_size wide, no moe_intermediate_size in its config
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", lambda a: dict(
        intermediate_size=64, num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    # decoders of one attention shape that the reader takes through its generic path, each
    # checked for its parameters and KV pages: SmolLM3 (NoPE layers), Seed-OSS, Ministral 3,
    # Apertus (xIELU, no gate), Arcee AFM (ReLU^2, no gate), Jais 2 (biases, ReLU^2), dots.llm1
    # (DeepSeek-style experts), FlexOlmo (OLMoE-style experts)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", lambda a: dict(intermediate_size=a.hidden * 2)),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim)),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim)),
    "apertus": ("ApertusConfig", "ApertusForCausalLM", lambda a: dict(intermediate_size=a.hidden * 2)),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", lambda a: dict(intermediate_size=a.hidden * 2)),
    "jais2": ("Jais2Config", "Jais2ForCausalLM", lambda a: dict(intermediate_size=a.hidden * 2)),
    "dots1": ("Dots1Config", "Dots1ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=a.head_dim)),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, num_experts=4, num_experts_per_tok=2)),
    # GLM-4.7-Flash's layout (Glm4MoeLite): multi-head latent attention, a dense first layer, experts
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=a.kv_lora_rank, q_lora_rank=None,
        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, n_group=1, topk_group=1)),
    # attention-free: Mamba blocks alone (Mamba1 for Mamba and Falcon-Mamba, Mamba2), no MLP
    "mamba": ("MambaConfig", "MambaForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, state_size=16, conv_kernel=4, expand=2, tie_word_embeddings=True)),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, state_size=16, conv_kernel=4, expand=2, tie_word_embeddings=True)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", lambda a: dict(
        num_heads=4, head_dim=a.hidden * 2 // 4, state_size=16, n_groups=1, expand=2, conv_kernel=4,
        tie_word_embeddings=False)),
    # AFMoE (Arcee Trinity): a gate on every attention output, sliding and full layers, experts
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        num_dense_layers=1, num_shared_experts=1, sliding_window=a.sliding_window, head_dim=a.head_dim,
        score_func="sigmoid", route_norm=True, n_group=1, topk_group=1,   # vLLM's afmoe.py reads these
        tie_word_embeddings=False)),
    # sliding and full layers from Granite's SWA configs (dense and MoE), EXAONE-MoE's, and
    # Nemotron (squared ReLU, no gate)
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, sliding_window=a.sliding_window)),
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", lambda a: dict(
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=a.sliding_window)),
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        head_dim=a.head_dim, sliding_window=a.sliding_window)),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim)),
    # five sliding-window layers to one full-attention layer, one attention shape
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 4, head_dim=a.head_dim, sliding_window=a.sliding_window,
        tie_word_embeddings=True)),
    # Mamba1 layers with attention every fourth layer (offset 2), no experts
    "jamba": ("JambaConfig", "JambaForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, attn_layer_period=4, attn_layer_offset=2, num_experts=1,
        expert_layer_period=1, expert_layer_offset=0, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        use_mamba_kernels=False, tie_word_embeddings=False)),
    # gated-delta-net (linear attention) layers and one full-attention layer in four, a small MoE
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, full_attention_interval=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1,
        tie_word_embeddings=False)),
    # Qwen3.5 (dense): the same layer pattern, its delta-rule state kept in the config's
    # mamba_ssm_dtype (float32, as in the public checkpoints); heads of 64 make the float32 state
    # (68,608 B) outgrow a 128-token attention page of 2 x 64 heads (65,536 B), which a bfloat16
    # one (35,840 B) would not
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, full_attention_interval=4, mamba_ssm_dtype="float32",
        tie_word_embeddings=False)),
    # Mamba2, attention and MLP blocks (pattern M*M-)
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, num_hidden_layers=4, hybrid_override_pattern="M*M-",
        head_dim=a.head_dim, mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2,
        conv_kernel=4, expand=1, tie_word_embeddings=False)),
    # multi-head latent attention: one latent (kv_lora_rank + qk_rope_head_dim) per token and layer,
    # not split by TP; a dense first layer, then routed and shared experts
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, moe_intermediate_size=64, kv_lora_rank=a.kv_lora_rank,
        q_lora_rank=None, qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
        topk_method="noaux_tc",   # transformers saves the router's e_score_correction_bias; vLLM then loads it
        tie_word_embeddings=False)),
    # sliding (window --sliding-window) and full layers alternating, attention sinks, experts
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", lambda a: dict(
        intermediate_size=a.hidden, head_dim=a.head_dim, sliding_window=a.sliding_window,
        num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    # chunked local attention (--attention-chunk-size) on three layers in four, the fourth
    # global without RoPE; MoE on every other layer
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, intermediate_size_mlp=a.hidden * 4, head_dim=a.head_dim,
        attention_chunk_size=a.attention_chunk_size, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, tie_word_embeddings=False)),
    # sliding and full layers alternating 1:1, logit soft-capping
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 4, head_dim=a.head_dim, sliding_window=a.sliding_window,
        tie_word_embeddings=True)),
    # every layer sliding-window (Mistral-7B-v0.1's config)
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 4, head_dim=a.head_dim, sliding_window=a.sliding_window,
        tie_word_embeddings=False)),
    # Granite 4: Mamba2 layers and one attention layer in four, shared MLP, no routed experts
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, shared_intermediate_size=a.hidden * 2, num_local_experts=0,
        layer_types=["attention" if i % 4 == 1 else "mamba" for i in range(a.layers)],
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=1, position_embedding_type="nope", tie_word_embeddings=False)),
    # Falcon-H1: attention and Mamba2 side by side in every layer
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", lambda a: dict(
        intermediate_size=a.hidden * 2, head_dim=a.head_dim, mamba_d_ssm=128, mamba_n_heads=4,
        mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=1,
        tie_word_embeddings=False)),
}


ATTENTION_FREE = ("mamba", "falcon_mamba", "mamba2")


def build_arch(out: Path, a: argparse.Namespace) -> None:
    import torch
    import transformers

    config_class, model_class, fields = ARCHS[a.arch]
    shared = {"vocab_size": a.vocab, "hidden_size": a.hidden, "num_hidden_layers": a.layers,
              "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
              "max_position_embeddings": a.max_pos, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    if a.arch in ATTENTION_FREE:   # their configs have no attention heads and no length key
        shared = {k: v for k, v in shared.items()
                  if k not in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")}
    cfg = getattr(transformers, config_class)(**{**shared, **fields(a)})
    cfg.architectures = [model_class]
    getattr(transformers, model_class)(cfg).to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max-pos", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=("llama", *ARCHS), default="llama")
    p.add_argument("--head-dim", type=int, default=32, help="head_dim (gemma4: the sliding layers')")
    p.add_argument("--global-head-dim", type=int, default=64)
    p.add_argument("--global-kv-heads", type=int, default=1)
    p.add_argument("--sliding-window", type=int, default=128)
    p.add_argument("--kv-shared-layers", type=int, default=0)
    p.add_argument("--kv-lora-rank", type=int, default=128, help="deepseek_v3: the latent's width")
    p.add_argument("--attention-chunk-size", type=int, default=256, help="llama4")
    p.add_argument("--ple-width", type=int, default=16, help="gemma3n: hidden_size_per_layer_input")
    p.add_argument("--laurel-rank", type=int, default=8, help="gemma3n")
    p.add_argument("--mlp-widths", type=int, nargs="*", default=None,
                   help="gemma3n: intermediate_size per layer (MatFormer); one width for all if absent")
    a = p.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(a.out_dir, a.vocab, a.seed)
    build_model(a.out_dir, a)
    print(f"model written to {a.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
