"""Two structural pieces of the step/capacity model that come from the checkpoint, not the flags:
the KV format a pre-quantized checkpoint asks for, and the top-k/top-p sort its generation_config
turns on."""
from dataclasses import replace

from exporter.model import perf
from exporter.model.architectures import arch_from_config, resolve_model
from exporter.model.setup import Setup

LLAMA8 = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256,
          "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def _arch(qc):
    return arch_from_config(dict(LLAMA8, quantization_config=qc), name="x", where="test")


def test_modelopt_kv_cache_quant_algo_gives_fp8_kv_and_twice_the_tokens():
    mo = _arch({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})
    ct = _arch({"quant_method": "compressed-tensors", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}})
    s_mo, s_ct = Setup.build(mo, "H100-SXM-80GB"), Setup.build(ct, "H100-SXM-80GB")
    assert (mo.kv_cache_quant, s_mo.kv_cache_dtype, s_mo.kv_dtype_bytes) == ("fp8", "fp8", 1)
    assert (ct.kv_cache_quant, s_ct.kv_cache_dtype, s_ct.kv_dtype_bytes) == (None, "auto", 2)
    ratio = perf.kv_tokens_for(s_mo) / perf.kv_tokens_for(s_ct)
    assert 1.95 < ratio < 2.05
    # an explicit flag still wins
    assert Setup.build(mo, "H100-SXM-80GB", kv_cache_dtype="bfloat16").kv_dtype_bytes == 2


def test_compressed_tensors_kv_cache_scheme_and_runtime_fp8_keep_their_kv():
    kv8 = _arch({"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"},
                 "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}})
    assert Setup.build(kv8, "H100-SXM-80GB").kv_cache_dtype == "fp8"
    # runtime --quantization fp8 on a 16-bit checkpoint: vLLM keeps the model dtype for the KV cache
    s = Setup.build("meta-llama/Llama-3.1-70B", "H100-SXM-80GB", tp=2, quantization="fp8")
    assert s.kv_cache_dtype == "auto" and s.kv_dtype_bytes == 2


def test_sampler_sort_only_for_truncating_generation_configs_and_not_split_over_tp():
    assert resolve_model("Qwen/Qwen3-32B").sampling_sorts
    assert resolve_model("meta-llama/Llama-3.1-70B").sampling_sorts
    assert not resolve_model("openai/gpt-oss-120b").sampling_sorts
    cal = perf.calibration_for("H100-SXM-80GB")
    assert cal.sample_sort_s > 0
    off = replace(cal, sample_sort_s=0.0)
    extra = {}
    for tp in (2, 8):
        shape = perf.shape_for(Setup.build("Qwen/Qwen3-32B", "H100-SXM-80GB", tp=tp))
        assert shape.sort_vocab == 151936
        extra[tp] = [perf.step_time_shape(shape, cal, b, b * 1500.0, 0.0)
                     - perf.step_time_shape(shape, off, b, b * 1500.0, 0.0) for b in (16, 64)]
        # per request: four times the batch, four times the cost
        assert abs(extra[tp][1] / extra[tp][0] - 4.0) < 1e-6
    # the whole vocabulary is sorted on every rank: the same cost at TP 2 and TP 8
    assert abs(extra[8][1] - extra[2][1]) < 1e-9
    oss = perf.shape_for(Setup.build("openai/gpt-oss-120b", "H100-SXM-80GB", tp=2))
    assert oss.sort_vocab == 0


def test_nvfp4_of_a_base_model_is_a_modelopt_checkpoint_with_an_fp8_cache_from_0_13():
    # vLLM cannot quantize to NVFP4 at load time: NVFP4 of a BF16/FP8 model is a ModelOpt
    # checkpoint (nvidia/*-NVFP4), whose hf_quant_config names an FP8 KV cache
    new = Setup.build("meta-llama/Llama-3.1-70B", "B200", quantization="fp4", vllm_version="0.19.0")
    old = Setup.build("meta-llama/Llama-3.1-70B", "B200", quantization="fp4", vllm_version="0.12.0")
    assert (new.kv_cache_dtype, old.kv_cache_dtype) == ("fp8", "auto")
    ratio = perf.kv_tokens_for(new) / perf.kv_tokens_for(
        Setup.build("meta-llama/Llama-3.1-70B", "B200", quantization="fp4", vllm_version="0.19.0",
                    kv_cache_dtype="bfloat16"))
    assert 1.95 < ratio < 2.05
    # the alias names the same checkpoint; FP8 weights of the same model keep a BF16 cache
    assert Setup.build("nvidia/MiniMax-M2.5-NVFP4", "B200", tp=2).kv_cache_dtype == "fp8"
    assert Setup.build("MiniMaxAI/MiniMax-M2.5", "B200", tp=2).kv_cache_dtype == "auto"
    # an MXFP4 model's own FP4 checkpoint names no KV scheme
    assert Setup.build("openai/gpt-oss-120b", "B200", quantization="fp4").kv_cache_dtype == "auto"


def test_an_fp8_cache_holds_twice_the_tokens_but_decode_reads_them_at_the_bf16_cost():
    bf16 = Setup.build("meta-llama/Llama-3.1-70B", "H200", quantization="fp8")
    fp8 = Setup.build("meta-llama/Llama-3.1-70B", "H200", quantization="fp8", kv_cache_dtype="fp8")
    cal = perf.calibration_for("H200")
    a, b = perf.shape_for(bf16), perf.shape_for(fp8)
    assert perf.FP8_KV_READ_COST == 1.0
    for batch, ctx in ((8, 2000.0), (64, 8000.0)):
        t16 = perf.step_time_shape(a, cal, batch, batch * ctx, 0.0)
        t8 = perf.step_time_shape(b, cal, batch, batch * ctx, 0.0)
        assert abs(t8 - t16) < 1e-12
    assert 1.95 < perf.kv_tokens_for(fp8) / perf.kv_tokens_for(bf16) < 2.05
    # with the cost at the FP8 bytes, the same long-context step would be faster: the constant
    # is what keeps it at the BF16 time
    assert perf._kv_read_bytes(fp8) == perf._kv_read_bytes(bf16)
