"""KV-cache capacity: hand-computable page arithmetic, real vLLM startup lines, impossible setups."""
from __future__ import annotations

import csv
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from exporter.errors import InputError
from exporter.model.kv_cache import (GIB, blocks_per_request, bytes_per_token, capacity_from_pool,
                                     kv_capacity, kv_groups, weights_bytes)
from exporter.model.setup import Setup

from conftest import REPO, VLLM_CPU
SHARED = REPO.parent / "shared"


def setup(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", **kw):
    kw.setdefault("max_model_len", 8192)
    kw.setdefault("gpu_memory_utilization", 0.95)
    kw.setdefault("vllm_version", "0.19.0")
    return Setup.build(model, gpu, **kw)


# ---- bytes per token, by hand -----------------------------------------------------------------

def test_llama_31_8b_bytes_per_token():
    # 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
    assert bytes_per_token(setup()) == 2 * 32 * 8 * 128 * 2 == 131072
    assert bytes_per_token(setup(kv_cache_dtype="fp8")) == 65536
    assert bytes_per_token(setup(dtype="float32")) == 262144
    assert bytes_per_token(setup(tp=2)) == 65536           # KV heads split over TP
    assert bytes_per_token(setup(tp=16)) == 2 * 32 * 1 * 128 * 2  # more ranks than heads: one each


def test_mla_is_replicated_not_divided_by_tp():
    for tp in (1, 2, 4):
        # 27 layers x (kv_lora_rank 512 + rope 64) x 2 bytes, the same on every rank
        assert bytes_per_token(setup("deepseek-ai/DeepSeek-V2-Lite-Chat", tp=tp)) == 27 * 576 * 2 == 31104
    assert bytes_per_token(setup("deepseek-ai/DeepSeek-V3", "H200", tp=8)) == 61 * 576 * 2 == 70272
    assert bytes_per_token(setup("deepseek-ai/DeepSeek-V3", "H200", tp=8, kv_cache_dtype="fp8")) == 61 * 576


def test_deepseek_sparse_attention_indexer_cache_beside_the_latent():
    """DeepSeek-V3.2 adds a lightning indexer to every MLA layer, with a cache of its own: one
    fp8 key of 128 per token and a float32 scale per 128 (132 B, DeepseekV32IndexerCache). Both
    are MLA specs that need the same token slots, so vLLM keeps them in one group and sums their
    pages (UniformTypeKVCacheSpecs): 1,152 + 132 B per token and layer at bf16, 656 + 132 with
    the fp8_ds_mla layout. DeepSeek-V3, without the indexer, keeps 1,152."""
    v3, v32 = (setup(m, gpu="H200", tp=8, vllm_version="0.29.0")
               for m in ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3.2"))
    assert bytes_per_token(v3) == 61 * (512 + 64) * 2
    assert bytes_per_token(v32) == 61 * ((512 + 64) * 2 + 128 + 4)
    assert bytes_per_token(v32.with_(kv_cache_dtype="fp8_ds_mla")) == 61 * (656 + 132)
    # about the same pool, 10 % fewer tokens; the indexer's projections (0.86B) are on every rank
    assert 0.88 < kv_capacity(v32).tokens / kv_capacity(v3).tokens < 0.90
    extra = v32.model.replicated_linear_params() - v3.model.replicated_linear_params()
    assert extra == 61 * (1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128)


def test_gqa_with_fewer_kv_heads_than_ranks():
    # Qwen3-30B-A3B: 4 KV heads at TP4 -> 1 per rank: 2 x 48 x 1 x 128 x 2 (reference section 1.3)
    assert bytes_per_token(setup("Qwen/Qwen3-30B-A3B", tp=4)) == 24576


def test_pipeline_stage_holds_its_share_of_layers():
    assert bytes_per_token(setup(pp=2)) == 131072 // 2


# ---- hybrid groups and padding -------------------------------------------------------------------

def test_gemma3_sliding_window_groups_and_padding():
    s = setup("google/gemma-3-27b-it")
    g = kv_groups(s)
    # 52 sliding + 10 full layers: group size 10, 6 sliding groups (8 padding layers) + 1 full
    assert g.group_size == 10 and g.kinds.count("sliding") == 6 and g.kinds.count("full") == 1
    # one 8192-token request: full group 512 blocks; each sliding group
    # ceil(min(1023 + 8192, 8192) / 16) + 1 = 513 blocks
    assert blocks_per_request(s, g) == 512 + 6 * 513 == 3590


def test_gemma3_window_saves_memory_when_max_model_len_exceeds_the_chunk():
    s = setup("google/gemma-3-27b-it", max_model_len=65536, max_num_batched_tokens=2048)
    # full: 4096 blocks; sliding: ceil((1023 + 2048) / 16) + 1 = 193 blocks per group
    assert blocks_per_request(s) == 4096 + 6 * 193


def test_gpt_oss_two_equal_groups_and_token_count():
    s = setup("openai/gpt-oss-20b", tp=2, gpu_memory_utilization=0.9)
    g = kv_groups(s)
    assert (g.group_size, len(g.kinds)) == (12, 2)
    assert g.page_bytes == 16 * 4 * 64 * 2 * 2  # 16 tokens x 4 heads/rank x 64 dims x K,V x 2 B
    # the logged startup (vLLM 0.19): 59.32 GiB available -> 323,972 blocks -> 2,591,776 tokens
    tokens, blocks, _ = capacity_from_pool(s, 59.32 * GIB)
    assert blocks == pytest.approx(323972, abs=10)
    assert tokens == blocks // 2 * 16


def test_llama_max_concurrency_matches_the_log():
    # 29,751 blocks logged with "Maximum concurrency ... 58.11x" at 8192 and 232.43x at 2048
    assert 29751 / blocks_per_request(setup()) == pytest.approx(58.11, abs=0.005)
    assert 29751 / blocks_per_request(setup(max_model_len=2048)) == pytest.approx(232.43, abs=0.005)


def test_min_over_pipeline_stages():
    s = setup(pp=2)
    cap = kv_capacity(s)
    # the last stage (lm_head + sampler) has less room than the first, and it binds
    assert weights_bytes(s, 1) >= weights_bytes(s, 0)
    assert cap.memory.activation_gib > 1.5


# ---- page arithmetic reproduces real startup lines from the logged pool ------------------------

def _breakdown_rows():
    path = SHARED / "fixtures" / "kv-memory-breakdown.csv"
    if not path.exists():
        pytest.skip(f"shared reference data not found at {path}")
    return [r for r in csv.DictReader(open(path)) if r["kv_tokens"] and r["pp"] == "1"]


def test_logged_pool_gives_the_logged_tokens():
    rows = _breakdown_rows()
    assert len(rows) >= 20
    for r in rows:
        s = setup(r["model"], tp=int(r["tp"]), dtype=r["dtype"], kv_cache_dtype=r["kv_cache_dtype"],
                  max_model_len=int(r["max_model_len"]), gpu_memory_utilization=float(r["gpu_memory_utilization"]))
        tokens, _, _ = capacity_from_pool(s, float(r["kv_cache_gib"]) * GIB)
        truth = int(r["kv_tokens"])
        # the log rounds the pool to 0.01 GiB; that is the only slack
        assert abs(tokens - truth) / truth <= 0.006 / float(r["kv_cache_gib"]) + 1e-4, r["model"]


def test_non_kv_terms_track_the_measured_breakdown():
    for r in _breakdown_rows():
        # the checkpoint id says the scheme (fp8-dynamic, w8a8, w4a16, gpt-oss's mxfp4)
        s = setup(r["model"], tp=int(r["tp"]), dtype=r["dtype"], kv_cache_dtype=r["kv_cache_dtype"],
                  max_model_len=int(r["max_model_len"]),
                  gpu_memory_utilization=float(r["gpu_memory_utilization"]))
        if "runtime" in r["quantization"]:
            continue  # runtime fp8 of a bf16 checkpoint: the id does not say so
        m = kv_capacity(s).memory
        assert m.weights_gib == pytest.approx(float(r["weights_gib"]), rel=0.06), r["model"]
        assert m.activation_gib == pytest.approx(float(r["peak_activation_gib"]), abs=0.35), r["model"]
        assert m.kv_cache_gib == pytest.approx(float(r["kv_cache_gib"]), abs=0.8), r["model"]


def test_accuracy_on_shared_observations_does_not_regress():
    path = REPO / "benchmarks" / "accuracy_kv.py"
    spec = importlib.util.spec_from_file_location("accuracy_kv", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if not (SHARED / "fixtures" / "kv-capacity-observations.csv").exists():
        pytest.skip("shared reference data not found")
    rows = bench.evaluate(SHARED)
    # rows whose setup the CSV cannot express (pipeline parallel, runtime quantization) aside
    known = [r for r in rows if not re.search(r"PIPELINE PARALLEL|runtime --quantization", r["notes"])]
    mape = sum(r["err"] for r in known) / len(known)
    assert mape <= 2.0, f"KV tokens MAPE {mape:.2f}%"
    uniform_v019 = [r for r in known if r["dataset"] == "v0.19.0" and "gpt-oss" not in r["model"]
                    and "Llama-4" not in r["model"]]
    assert sorted(r["err"] for r in uniform_v019)[len(uniform_v019) // 2] <= 0.5  # median


def test_pipeline_parallel_runs_from_the_sweep():
    # llm-d-planner sweep, vLLM 0.19, H100: PP2 1,075,312 tokens and PP4 2,257,264
    assert kv_capacity(setup(pp=2, gpu_memory_gib=79.19)).tokens == pytest.approx(1075312, rel=0.01)
    assert kv_capacity(setup(pp=4, gpu_memory_gib=79.19)).tokens == pytest.approx(2257264, rel=0.01)


# ---- versions ------------------------------------------------------------------------------------

def test_v021_subtracts_the_cudagraph_estimate():
    old, new = kv_capacity(setup()), kv_capacity(setup(vllm_version="0.21.0"))
    assert old.memory.cudagraph_gib == 0 and new.memory.cudagraph_gib > 0
    assert new.tokens < old.tokens


def test_pre_017_profiles_a_larger_sampler():
    assert kv_capacity(setup(vllm_version="0.11.2")).memory.activation_gib > \
        2 * kv_capacity(setup(vllm_version="0.19.0")).memory.activation_gib


def test_v0_logs_gpu_blocks_and_profiles_max_model_len():
    s = setup(gpu="RTX-3090", tp=2, vllm_version="0.6.4", max_model_len=8192, gpu_memory_utilization=0.9)
    assert s.v0 and s.max_num_batched_tokens == 8192 and s.max_num_seqs == 256
    cap = kv_capacity(s)
    assert cap.tokens == cap.gpu_blocks * 16
    # the profile's peak is the larger of the forward's and the sampler's (its sort of 256 rows of
    # logits, 1.19 GiB here): a forward over 32,768 tokens outgrows it
    longer = kv_capacity(setup(gpu="RTX-3090", tp=2, vllm_version="0.6.4", max_model_len=32768,
                               gpu_memory_utilization=0.9))
    assert longer.memory.activation_gib > cap.memory.activation_gib


def test_default_batch_knobs_follow_the_gpu():
    assert (setup(gpu="H100").max_num_seqs, setup(gpu="H100").max_num_batched_tokens) == (1024, 8192)
    assert (setup(gpu="L40S").max_num_seqs, setup(gpu="L40S").max_num_batched_tokens) == (256, 2048)
    assert (setup(gpu="A100-80GB").max_num_seqs, setup(gpu="A100-80GB").max_num_batched_tokens) == (256, 2048)
    assert Setup.build("Qwen/Qwen3-8B", "H100", vllm_version="0.28.0").gpu_memory_utilization == 0.92


# ---- impossible setups -----------------------------------------------------------------------------

def test_pipeline_stages_refused_as_vllm_014_to_016_refused_them():
    """vllm issue #32105: GLM-4.7-FP8 on eight A100s, --pipeline-parallel-size 8, max_model_len
    202752, on a build between 0.14 and 0.15: "(71.16 GiB KV cache is needed, which is larger than
    the available KV cache memory (28.57 GiB). Based on the available memory, the estimated maximum
    model length is 81392." Those 71.16 GiB are all 92 layers' cache, not a stage's 12 layers
    (9.28 GiB): 0.14-0.16 checked the whole model against one stage; 0.13 and 0.17 start."""
    def glm(v, **kw):
        return Setup.build("zai-org/GLM-4.7-FP8", "A100-80GB", pp=8, max_model_len=202752,
                           gpu_memory_utilization=0.925, max_num_seqs=128, enable_prefix_caching=True,
                           vllm_version=v, **kw)
    for v in ("0.14.0", "0.15.1", "0.16.0"):
        with pytest.raises(InputError, match=r"needs 71\.16 GiB .* all 8 pipeline stages"):
            kv_capacity(glm(v))
        assert not kv_capacity(glm(v), check_fits=False).fits
    for v in ("0.13.0", "0.17.0"):
        cap = kv_capacity(glm(v))
        assert cap.fits and cap.fit_blocks == cap.gpu_blocks
    # the pool vLLM logged: the length it names, from the page arithmetic alone
    logged = glm("0.15.1", kv_cache_memory_bytes=int(28.57 * GIB))
    with pytest.raises(InputError) as exc:
        kv_capacity(logged)
    largest = int(re.search(r"estimated maximum model length is (\d+)", str(exc.value)).group(1))
    assert largest == pytest.approx(81392, rel=0.001)
    # a length the check passes starts on the same release
    assert kv_capacity(logged.with_(max_model_len=largest)).fits


def test_weights_that_do_not_fit_are_refused():
    with pytest.raises(InputError, match="does not fit"):
        kv_capacity(setup("meta-llama/Llama-3.1-405B-Instruct", "L4"))


def test_max_model_len_too_large_names_the_largest_that_fits():
    s = setup("meta-llama/Llama-3.1-70B-Instruct", tp=2, max_model_len=131072)
    with pytest.raises(InputError) as exc:
        kv_capacity(s)
    m = re.search(r"estimated maximum model length is (\d+)", str(exc.value))
    assert m, str(exc.value)
    largest = int(m.group(1))
    assert 0 < largest < 131072
    assert kv_capacity(s.with_(max_model_len=largest)).max_concurrency >= 1.0
    with pytest.raises(InputError):
        kv_capacity(s.with_(max_model_len=largest + 16))


def test_mamba_hybrid_state_pages(tmp_path):
    import json
    from exporter.model.architectures import load_hf_config
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "jamba", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 2048, "vocab_size": 1000, "max_position_embeddings": 8192,
        "attn_layer_period": 4, "attn_layer_offset": 3, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2}))
    arch = load_hf_config(tmp_path)
    assert arch.layer_types.count("full") == 2 and arch.layer_types.count("mamba") == 6
    # Jamba's mixers are Mamba1 (vLLM's mamba1_state_shape): conv 3 x 2048 x 2 B + ssm 2048 x 16 x 2 B
    assert arch.state_bytes_per_layer == 3 * 2048 * 2 + 2048 * 16 * 2
    # split over TP like the heads: one of two ranks holds half of each
    assert arch.state_bytes(2) == arch.state_bytes_per_layer // 2
    s = Setup.build(arch, "L4", max_model_len=4096, vllm_version="0.19.0")
    g = kv_groups(s)
    # attention page (2 heads x 128 x K,V x 2 B = 1 KiB per token) grows to cover one state page
    assert g.block_size % 16 == 0 and g.page_bytes >= arch.state_bytes_per_layer
    assert g.page_bytes - 16 * 1024 < arch.state_bytes_per_layer
    # two attention layers -> group size 2: one attention group, three mamba groups of one page each
    assert g.group_size == 2 and g.kinds.count("mamba") == 3
    assert blocks_per_request(s, g) == -(-4096 // g.block_size) + 3


def test_nemotron_h_pool_pages_hold_only_its_attention_and_mamba_layers():
    """Nemotron-3 Nano: 6 attention layers of 2 KV heads, 23 Mamba2 layers, 23 MoE-only layers
    that hold nothing. vLLM raises the attention block size (in kernel blocks of 16) until one
    attention page covers one rank's Mamba state, and groups the layers by the smallest count."""
    from exporter.model.architectures import MAMBA, resolve_model
    arch = resolve_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    for tp in (1, 2):
        s = Setup.build(arch, "H100-SXM-80GB", tp=tp, max_model_len=32768, vllm_version="0.19.0")
        per_layer = 2 * (2 // tp) * 128 * 2           # K and V of the rank's KV heads, bf16
        assert bytes_per_token(s) == 6 * per_layer
        g = kv_groups(s)
        assert g.block_size == 16 * -(-arch.state_bytes(tp) // (16 * per_layer))
        assert g.page_bytes == g.block_size * per_layer >= arch.state_bytes(tp)
        assert g.group_size == 6 and g.kinds.count(MAMBA) == 4 and g.kinds.count("full") == 1
        cap = kv_capacity(s)
        assert cap.tokens > 0 and cap.max_concurrency > 1


def test_nemotron_h_block_size_matches_what_vllm_logged():
    """nvidia/NVIDIA-Nemotron-Nano-9B-v2 on one GPU: vLLM's hybrid page alignment gave
    "attention page sizes ... 672 tokens" (vllm issue #24280, 2025-09-04): 8 KV heads of 128 at
    bf16 are 4 KiB per token and layer, one Mamba2 state (128 heads x 80, 8 groups, d_state 128,
    conv 4) at the model dtype is 2,695,168 B, and 16 x ceil(2,695,168 / (16 x 4096)) = 672.
    From the release that reads Nemotron-H's SSM dtype from its config the state of a config that
    names none stays 16-bit, and from the one that defaults it to float32 the block doubles."""
    import json
    from exporter.model.architectures import arch_from_config
    pattern = ("M-" * 24 + "M*M*M*M*")[:56]
    cfg = {"model_type": "nemotron_h", "num_hidden_layers": 56, "hidden_size": 4480,
           "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 15680, "mlp_hidden_act": "relu2", "vocab_size": 131072,
           "max_position_embeddings": 131072, "hybrid_override_pattern": pattern,
           "mamba_num_heads": 128, "mamba_head_dim": 80, "n_groups": 8, "ssm_state_size": 128,
           "conv_kernel": 4, "torch_dtype": "bfloat16"}
    arch = arch_from_config(json.loads(json.dumps(cfg)), name="nemotron-nano-9b-v2", where="test")
    for version, block in (("0.10.2", 672), ("0.19.0", 672), ("0.20.0", 1312)):
        s = Setup.build(arch, "H100-SXM-80GB", max_model_len=32768, vllm_version=version)
        assert kv_groups(s).block_size == block, version
    # a config that names float32 (Nemotron-3) has it from the release that reads the config
    arch32 = arch_from_config({**cfg, "mamba_ssm_cache_dtype": "float32"}, name="nemotron-nano-9b-v2", where="test")
    assert kv_groups(Setup.build(arch32, "H100-SXM-80GB", max_model_len=32768,
                                 vllm_version="0.10.2")).block_size == 672
    assert kv_groups(Setup.build(arch32, "H100-SXM-80GB", max_model_len=32768,
                                 vllm_version="0.19.0")).block_size == 1312


QWEN35_27B = {   # Qwen3.5-27B's text config, the fields the KV accounting reads (public checkpoint)
    "model_type": "qwen3_5_text", "num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 24,
    "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320,
    "max_position_embeddings": 262144, "full_attention_interval": 4, "linear_num_key_heads": 16,
    "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "torch_dtype": "bfloat16"}


def test_qwen35_layers_from_the_interval_and_its_delta_rule_state_in_float32():
    """A Qwen3.5 config without layer_types gets them as its config class derives them: full
    attention every full_attention_interval-th layer, gated delta nets between. vLLM keeps the
    delta-rule state in the config's mamba_ssm_dtype (Qwen3_5ForConditionalGenerationConfig, from
    0.17, the first release with Qwen3.5); Qwen3-Next has no such hook. The state then decides the
    attention block: conv 3 x (2 x 16 x 128 + 48 x 128) x 2 B + 48 x 128 x 128 x 4 B = 3,207,168 B
    per layer, 16 x ceil(3,207,168 / (16 x 4 KiB)) = 784 tokens. A request of 262,144 tokens then
    holds 335 attention blocks and 2 state blocks in each of the 3 gated-delta-net groups with
    prefix caching (1 without): 17,520,656,384 B, the reservation a peer planner traced from
    vLLM 0.29's source for the same config."""
    from exporter.model.architectures import FULL, LINEAR, arch_from_config
    arch = arch_from_config(QWEN35_27B, name="qwen3.5-27b", where="test")
    assert arch.layer_types == tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(64))
    assert arch.attn_output_gate   # vLLM's Qwen3NextAttention defaults the output gate on
    assert arch.state_bytes_per_layer == 3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4
    s = Setup.build(arch, "H100", max_model_len=262144, max_num_batched_tokens=8192, vllm_version="0.29.0")
    g = kv_groups(s)
    assert g.block_size == 784 and g.kinds.count(LINEAR) == 3 and g.group_size == 16
    assert blocks_per_request(s, g) == 335 + 3 * 2
    assert blocks_per_request(s, g) * g.page_bytes * g.group_size == 17_520_656_384
    assert blocks_per_request(s.with_(enable_prefix_caching=False), g) == 335 + 3
    # the raised block is a multiple of the kernel alignment: 16 before 0.20, 32 on Blackwell for
    # heads of 256 before 0.18 (FlashInfer), from 0.20 the configured block size when larger
    for gpu, version, block, raised in (("B200", "0.17.0", 16, 800), ("B200", "0.18.0", 16, 784),
                                        ("H100", "0.19.0", 64, 784), ("H100", "0.20.0", 64, 832),
                                        ("B200", "0.20.0", 16, 784)):
        s = Setup.build(arch, gpu, max_model_len=262144, block_size=block, vllm_version=version)
        assert kv_groups(s).block_size == raised, (gpu, version, block)
    # in the model dtype (no mamba_ssm_dtype, or Qwen3-Next, which ignores it) the block halves
    for cfg in ({k: v for k, v in QWEN35_27B.items() if k != "mamba_ssm_dtype"},
                {**QWEN35_27B, "model_type": "qwen3_next"}):
        other = arch_from_config(cfg, name="other", where="test")
        assert kv_groups(Setup.build(other, "H100", max_model_len=262144, vllm_version="0.29.0")).block_size == 400


GEMMA4_31B = {   # google/gemma-4-31B-it's text config, the fields the KV accounting reads
    "model_type": "gemma4_text", "num_hidden_layers": 60, "hidden_size": 5376, "num_attention_heads": 32,
    "num_key_value_heads": 16, "head_dim": 256, "num_global_key_value_heads": 4, "global_head_dim": 512,
    "attention_k_eq_v": True, "sliding_window": 1024, "intermediate_size": 21504, "vocab_size": 262144,
    "max_position_embeddings": 262144, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
    "torch_dtype": "bfloat16"}


def test_gemma4_31b_request_at_full_context_by_batches_in_flight():
    """Gemma-4-31B: 50 sliding layers of 16 KV heads x 256 and 10 full layers of 4 x 512 (K = V
    kept as two tensors): the full page is half the sliding one, so the full group's block is 32.
    At 262,144 tokens a request holds 8,192 full blocks and, in each of the 5 sliding groups,
    ceil((1,023 + in-flight tokens) / 16) + 1: from 0.26 under async scheduling two batches of
    8,192 (1,089 each: 13,637 pages of 2.5 MiB, the reservation a peer planner traced from vLLM
    0.29's source), with 2,048 batched tokens 9,797; one batch before 0.26."""
    from exporter.model.architectures import arch_from_config
    arch = arch_from_config(GEMMA4_31B, name="gemma-4-31b", where="test")
    for version, mnbt, blocks in (("0.29.0", 8192, 8192 + 5 * 1089), ("0.29.0", 2048, 8192 + 5 * 321),
                                  ("0.25.1", 8192, 8192 + 5 * 577)):
        s = Setup.build(arch, "H100", max_model_len=262144, max_num_batched_tokens=mnbt, vllm_version=version)
        g = kv_groups(s)
        assert g.block_size_of("full") == 32 and g.kinds.count("sliding") == 5
        assert blocks_per_request(s, g) == blocks, (version, mnbt)
        assert g.page_bytes * g.group_size == 2_621_440


# ---- pages of different sizes, against real vLLM 0.32 (vllm-cpu) --------------------------------

KV_LAYOUTS = json.loads((VLLM_CPU / "kv-layouts.json").read_text())


@pytest.mark.parametrize("name", sorted(KV_LAYOUTS["runs"]))
def test_unified_pages_give_the_blocks_and_tokens_real_vllm_logged(name, tmp_path):
    """Tiny Gemma 4 models whose full layers have a shape of their own (a smaller page: larger
    block; a page that does not divide: padded; a larger page: the sliding layers' block grows)
    or whose last layers share an earlier layer's cache, and tiny hybrids (Qwen3-Next's gated
    delta nets, Nemotron-H's Mamba2: state pages padded to the attention page, 2 or 3 state blocks
    per request with prefix caching, 1 without), booted by vLLM 0.32 with a fixed pool
    (tools/vllm_cpu/kv_layouts.py). `calc`, given the same flags and config.json, must print the
    blocks, tokens and concurrency vLLM printed."""
    run = KV_LAYOUTS["runs"][name]
    (tmp_path / "config.json").write_text(json.dumps(run["config"]))
    serve = run["serve"]
    flag = {k: serve[serve.index(k) + 1] for k in ("--max-model-len", "--max-num-seqs",
                                                    "--max-num-batched-tokens", "--kv-cache-memory-bytes")}
    info = run["cache_config_info"]
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", str(tmp_path), "--gpu", "H100",
                          "--vllm-version", KV_LAYOUTS["vllm"].split("+")[0], "--block-size", info["block_size"],
                          *[x for kv in flag.items() for x in kv],
                          *[f for f in serve if f == "--no-enable-prefix-caching"],
                          *[x for i, f in enumerate(serve) if f == "--mamba-ssm-cache-dtype" for x in serve[i:i + 2]],
                          "--no-async-scheduling",   # vLLM's CPU platform turns it off (platforms/cpu.py)
                          "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kv = json.loads(out.stdout)["kv_cache"]
    logged = next(ln for ln in run["log"] if "KV cache size" in ln)
    tokens, conc = re.search(r"KV cache size: ([\d,]+) tokens, .*: ([\d.]+)x", logged).groups()
    assert kv["tokens"] == int(tokens.replace(",", "")) == int(info["kv_cache_size_tokens"])
    assert kv["gpu_blocks"] == int(info["num_gpu_blocks"])
    assert round(kv["max_concurrency"], 2) == float(conc)


def test_prefix_caching_default_by_release():
    """V1 turns prefix caching on; for Mamba / linear-attention hybrids only from 0.28 (vllm PR
    #50991), where their state blocks per request go from 1 to 3 (Mamba2, 0.32)."""
    hybrid = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert not setup(hybrid, vllm_version="0.27.0").enable_prefix_caching
    assert setup(hybrid, vllm_version="0.28.0").enable_prefix_caching
    assert setup(vllm_version="0.27.0").enable_prefix_caching
    assert not setup(vllm_version="0.7.3").enable_prefix_caching
    old, new = setup(hybrid, vllm_version="0.27.0"), setup(hybrid, vllm_version="0.32.0")
    groups = kv_groups(new)
    assert groups == kv_groups(old) and groups.kinds.count("mamba") == 4   # 23 Mamba2 layers in groups of 6
    assert blocks_per_request(new) == blocks_per_request(old) + 2 * 4
    assert blocks_per_request(new.with_(enable_prefix_caching=False)) == blocks_per_request(old)


def test_sliding_windows_are_sized_for_every_batch_in_flight_from_026():
    """From 0.26 (vllm PR #47728) a sliding-window request is sized at startup for the tokens of
    every batch in flight (`max_in_flight_tokens`): two under async scheduling, vLLM's GPU default
    from 0.14, at PP 1; the pipeline's PP batches otherwise, one more on the V2 runner (dense,
    non-hybrid models from 0.26). The CPU runs of kv-layouts.json were made without it (the CPU
    platform turns async scheduling off): the sizing they show is one batch."""
    def sliding_blocks(model, version, **kw):
        s = Setup.build(model, "H100", tp=kw.pop("tp", 2), max_model_len=131072, max_num_batched_tokens=8192,
                        vllm_version=version, **kw)
        groups = kv_groups(s)
        return s, blocks_per_request(s, groups) - groups.kinds.count("full") * 131072 // s.block_size

    for version, flags, batches in (("0.25.0", {}, 1), ("0.26.0", {}, 2), ("0.32.0", {}, 2),
                                    ("0.32.0", {"async_scheduling": False}, 1),
                                    ("0.13.0", {"async_scheduling": None}, 1)):
        s, blocks = sliding_blocks("openai/gpt-oss-20b", version, **flags)
        assert s.max_in_flight_tokens == batches * 8192, (version, flags)
        window = s.model.sliding_window   # 128: a sliding group's blocks hold window - 1 + in flight
        per_group = blocks // kv_groups(s).kinds.count("sliding")
        assert per_group == -(-(window - 1 + batches * 8192) // s.block_size) + 1
    assert not Setup.build("openai/gpt-oss-20b", "H100", vllm_version="0.13.0").async_scheduling
    # PP 2: the V1 runner (a MoE model) keeps 2 batches in flight, the V2 runner (dense) 3
    assert Setup.build("openai/gpt-oss-20b", "H100", pp=2, vllm_version="0.32.0").max_in_flight_tokens == 2 * 8192
    gemma = Setup.build("google/gemma-3-27b-it", "H100", pp=2, vllm_version="0.32.0")
    assert gemma.max_in_flight_tokens == 3 * gemma.max_num_batched_tokens
    # fewer requests of the model's full context fit: a 128-token window holds 1,033 blocks, not 521
    old = kv_capacity(sliding_blocks("openai/gpt-oss-20b", "0.25.0")[0])
    new = kv_capacity(sliding_blocks("openai/gpt-oss-20b", "0.26.0")[0])
    assert old.gpu_blocks == new.gpu_blocks and new.max_concurrency < old.max_concurrency
