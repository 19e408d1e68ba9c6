"""The physics of issue 14 on hand-computable cases: experts over tp x dp ranks (with and without
expert parallelism), the V0 era's device-wide non-torch memory, the per-token cost split over
TP, per-GPU-class factors, the fused-MoE kernel efficiency per weight format, the all-reduce
latency by interconnect, the MoE kernels that serialise the experts' math after their reads, and
admission by KV blocks rather than by requests."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import fields, replace

import pytest

from exporter.model import kv_cache, perf
from exporter.model.kv_cache import GIB, non_torch_bytes, weights_bytes
from exporter.model.setup import Setup

MOE = "Qwen/Qwen3-235B-A22B"       # 128 routed experts, 8 per token, 94 layers
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"  # 8 experts: not divisible by 3 ranks


def _experts_bytes(setup: Setup) -> float:
    _, experts, _ = setup.model.layer_params()
    return experts * setup.dtype_bytes


def test_data_parallel_spreads_the_experts_over_tp_times_dp_ranks():
    one = Setup.build(MOE, "H200", tp=4, max_model_len=8192)
    two = one.with_(dp=2)
    # vLLM's fused-MoE layer is tensor-parallel over tp x dp GPUs: the expert weights per GPU
    # halve, everything else (attention, dense parts, embeddings) is per engine, unchanged
    assert weights_bytes(one) - weights_bytes(two) == pytest.approx(_experts_bytes(one) / 8, rel=1e-9)
    assert two.total_gpus == 8 and two.num_gpus == 4


def test_expert_parallel_gives_whole_experts_and_the_limiting_rank_the_remainder():
    base = Setup.build(MIXTRAL, "H100", tp=1, max_model_len=8192)
    tp3 = base.with_(tp=3)
    ep3 = tp3.with_(expert_parallel=True)
    # 8 experts over 3 ranks: ranks hold 3, 3, 2; the KV pool is the minimum over ranks, so the
    # rank with 3 whole experts decides (tensor-split experts would be 8/3 each)
    diff = weights_bytes(ep3) - weights_bytes(tp3)
    assert diff == pytest.approx(_experts_bytes(base) * (3 / 8 - 1 / 3), rel=1e-9)


def test_expert_parallel_is_ignored_for_dense_models():
    s = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", tp=2, max_model_len=8192,
                    expert_parallel=True)
    assert s.expert_parallel is False


def test_v0_before_0_6_4_counts_the_cuda_context_and_nccl_init_as_non_torch():
    old = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "T4", tp=1, max_model_len=4096,
                      vllm_version="0.6.3")
    new = old.with_(vllm_version=(0, 6, 4))
    c = kv_cache.CALIBRATION
    assert non_torch_bytes(old) - non_torch_bytes(new) == pytest.approx(c["cuda_context_gib"] * GIB)
    # NCCL's init-time NVLS buffers on an NVSwitch system; PCIe ranks' are inside the growth
    old2, new2 = old.with_(tp=2), new.with_(tp=2)
    assert non_torch_bytes(old2) - non_torch_bytes(new2) == pytest.approx(c["cuda_context_gib"] * GIB)
    h100 = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", tp=2, max_model_len=4096,
                       vllm_version="0.6.3")
    assert non_torch_bytes(h100) - non_torch_bytes(h100.with_(vllm_version=(0, 6, 4))) == pytest.approx(
        (c["cuda_context_gib"] + c["nccl_init_gib"]) * GIB)


def test_calc_json_still_prints_the_document_when_max_model_len_does_not_fit():
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model",
                          "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len",
                          "131072", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    kv = doc["kv_cache"]
    assert kv["fits"] is False and kv["tokens"] > 0
    assert kv["blocks_per_request"] > kv["gpu_blocks"]
    # the one-line error names the same estimated maximum length vLLM's error names
    assert f"estimated maximum model length is {kv['estimated_max_model_len']}" in out.stderr
    assert 0 < kv["estimated_max_model_len"] < 131072
    assert len(out.stderr.strip().splitlines()) == 1


def test_calc_refuses_a_pipeline_vllm_016_refused_though_its_stages_hold_the_pool():
    """The same document and exit 2 where the refusal is vLLM 0.14-0.16's whole-model check on a
    pipeline stage (vllm issue #32105): the pool itself holds the request."""
    args = [sys.executable, "-m", "exporter", "calc", "--model", "zai-org/GLM-4.7-FP8", "--gpu",
            "A100-80GB", "--pp", "8", "--gpu-memory-utilization", "0.925", "--max-model-len", "202752",
            "--json"]
    out = subprocess.run(args + ["--vllm-version", "0.16.0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    kv = json.loads(out.stdout)["kv_cache"]
    assert kv["fits"] is False and kv["blocks_per_request"] <= kv["gpu_blocks"]
    assert "all 8 pipeline stages against one stage's memory" in out.stderr
    assert f"estimated maximum model length is {kv['estimated_max_model_len']}" in out.stderr
    assert 0 < kv["estimated_max_model_len"] < 202752
    fixed = subprocess.run(args + ["--vllm-version", "0.17.0"], capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["kv_cache"]["fits"] is True


@pytest.mark.parametrize("util,available_gib,largest", [(0.9, 48.66, 205728), (0.95, 55.65, 235296)])
def test_data_parallel_moe_profiles_every_dp_ranks_tokens(util, available_gib, largest):
    """vllm-project/recipes PR #12: Qwen3-Coder-480B-A35B-Instruct-FP8 with -dp=8
    --enable-expert-parallel on 141 GB H20s (139.8 GiB: the two pools differ by 0.05 x that) at
    0.10.1: "62.00 GiB KV cache is needed, which is larger than the available KV cache memory
    (48.66 GiB) ... the estimated maximum model length is 205728" (55.65 GiB and 235296 at 0.95).
    The experts of each rank see all eight ranks' dummy tokens, cut at the 32768-token fused-MoE
    chunk: sized for one rank's 8192 the pool came out 5.4 GiB (11 %) too large."""
    s = Setup.build("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "H20-96GB", gpu_memory_gib=139.8, dp=8,
                    expert_parallel=True, gpu_memory_utilization=util, max_model_len=262144,
                    vllm_version="0.10.1")
    with pytest.raises(kv_cache.InputError, match=r"needs 62\.0 GiB") as exc:
        kv_cache.kv_capacity(s)
    estimated = int(re.search(r"estimated maximum model length is (\d+)", str(exc.value)).group(1))
    assert estimated == pytest.approx(largest, rel=0.02)
    assert kv_cache.kv_capacity(s, check_fits=False).memory.kv_cache_gib == pytest.approx(available_gib, abs=0.7)
    # the tokens each rank's experts are sized for, by release
    def tokens(v, ep=True):
        return kv_cache.moe_profile_tokens(s.with_(vllm_version=v, expert_parallel=ep))
    assert tokens((0, 10, 1)) == 32768 and tokens((0, 17, 0)) == 16384 and tokens((0, 19, 0)) == 8 * 8192
    assert tokens((0, 17, 0), ep=False) == 16384 and tokens((0, 11, 1), ep=False) == 32768
    assert kv_cache.moe_profile_tokens(s.with_(dp=1)) == s.max_num_batched_tokens


def test_calc_accepts_data_and_expert_parallel():
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", MOE, "--gpu", "H200",
                          "--tp", "4", "--data-parallel", "2", "--enable-expert-parallel",
                          "--max-model-len", "8192", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["setup"]["data_parallel"] == 2 and doc["setup"]["expert_parallel"] is True
    assert doc["kv_cache"]["fits"] is True


def test_per_token_cost_is_split_over_tp_ranks_and_scales_with_bandwidth():
    s = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", max_model_len=8192)
    cal = perf.calibration_for(s.gpu.name)
    sh1 = perf.shape_for(s)
    # same shape on 8 ranks, all-reduce and FLOPs/bytes unchanged: only the per-token term moves
    sh8 = replace(sh1, tp=8, link_bytes_per_s=math.inf)
    lat0 = replace(cal, layer_sync_s=0.0)
    d1 = perf.step_time_shape(sh1, lat0, 0, 0, 2000) - perf.step_time_shape(sh1, lat0, 0, 0, 1000)
    d8 = perf.step_time_shape(sh8, lat0, 0, 0, 2000) - perf.step_time_shape(sh8, lat0, 0, 0, 1000)
    assert d1 - d8 == pytest.approx(1000 * cal.per_token_s * sh1.activation_width_m * (1 - 1 / 8), rel=1e-9)
    fast = replace(sh1, bw_bytes_per_s=2 * sh1.bw_bytes_per_s)
    t_fast = perf.step_time_shape(fast, cal, 0, 0, 1, 0)
    t_slow = perf.step_time_shape(sh1, cal, 0, 0, 1, 0)
    assert t_slow > t_fast  # bytes and the per-token work both take half the time


def test_per_token_work_follows_the_activation_width_a_token_passes_through():
    """The norms, residual adds, rotary, activation function and activation quantization between
    a layer's GEMMs touch the residual stream and the MLP width the token activates: a 70B token
    costs five times an 8B one, and an MoE token pays only its top-k experts' width."""
    def width(model):
        return Setup.build(model, "H100", max_model_len=8192).model.activation_width

    assert width("meta-llama/Llama-3.1-8B-Instruct") == 32 * (4096 + 14336)
    assert width("meta-llama/Llama-3.1-70B-Instruct") == 80 * (8192 + 28672)
    assert width("openai/gpt-oss-120b") == 36 * (2880 + 4 * 2880)          # top-4 of 128 experts
    assert width("Qwen/Qwen3-235B-A22B") == 94 * (4096 + 8 * 1536)         # top-8 of 128
    cal = replace(perf.calibration_for("H100"), layer_sync_s=0.0)
    costs = {}
    for model in ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"):
        sh = replace(perf.shape_for(Setup.build(model, "H100", max_model_len=8192)), tp=1)
        # the per-token term alone: no GEMM, attention or weight read changes it
        bare = replace(cal, per_token_s=0.0)
        costs[model] = (perf.step_time_shape(sh, cal, 0, 0, 1000) - perf.step_time_shape(sh, bare, 0, 0, 1000)) / 1000
    assert costs["meta-llama/Llama-3.1-70B-Instruct"] / costs["meta-llama/Llama-3.1-8B-Instruct"] == \
        pytest.approx(80 * (8192 + 28672) / (32 * (4096 + 14336)), rel=1e-9)
    # ~8 bytes of elementwise traffic per activation element at the class's reference bandwidth:
    # a microsecond or two per 8B token on an H100, several for a 70B one
    assert 1e-6 < costs["meta-llama/Llama-3.1-8B-Instruct"] < 3e-6 < costs["meta-llama/Llama-3.1-70B-Instruct"] < 12e-6


def test_blackwell_has_its_own_class_and_host_costs_carry_over():
    assert perf.gpu_class("B200-180GB") == "blackwell"
    hop, bw = perf.calibration_for("H100"), perf.calibration_for("B200")
    assert bw.gpu_class == "blackwell" and bw is not hop
    assert bw.step_overhead_s == hop.step_overhead_s and bw.per_seq_s == hop.per_seq_s
    assert bw.flops_eff_bf16 < hop.flops_eff_bf16


def test_step_factors_are_fields_of_the_one_calibration_dataclass():
    names = {f.name for f in fields(perf.Calibration)}
    assert set(perf.STEP_FACTORS) <= names and set(perf.TTFT_FACTORS) <= names


def test_fp8_experts_are_read_at_the_fp8_moe_kernel_efficiency():
    fp8 = perf.shape_for(Setup.build(MOE, "H200", tp=8, quantization="fp8", max_model_len=8192))
    assert fp8.expert_kernel_eff == perf.MOE_FORMAT_EFF["fp8"] < 1.0
    cal = perf.calibration_for("H200")
    ideal = replace(fp8, expert_kernel_eff=1.0)
    # at batch 64 nearly every expert is touched; the gap is exactly those bytes at the lower rate
    b = 64
    touched = fp8.expert_weight_bytes * (1 - (1 - fp8.experts_per_token / fp8.n_experts) ** b)
    bw = cal.bw_eff * fp8.bw_bytes_per_s * cal.moe_bw_eff
    gap = perf.step_time_shape(fp8, cal, b, b * 100, 0) - perf.step_time_shape(ideal, cal, b, b * 100, 0)
    assert gap == pytest.approx(touched / bw * (1 / fp8.expert_kernel_eff - 1), rel=1e-6)


def test_all_reduce_latency_grows_with_ranks_on_pcie_only():
    pcie = perf.shape_for(Setup.build("meta-llama/Llama-3.1-8B-Instruct", "L40S", tp=4, max_model_len=4096))
    nvl = perf.shape_for(Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", tp=4, max_model_len=4096))
    two = perf.shape_for(Setup.build("meta-llama/Llama-3.1-8B-Instruct", "L40S", tp=2, max_model_len=4096))
    # vLLM's custom all-reduce is off on more than two PCIe-only GPUs: NCCL's ring pays per hop
    assert pcie.allreduce_hops == 3 and nvl.allreduce_hops == 1 and two.allreduce_hops == 1


def _over(prompt: float, out: float, factor: float, **kw):
    s = Setup.build("meta-llama/Llama-3.1-70B-Instruct", "H200", quantization="fp8", max_model_len=16384, **kw)
    sh, cal, kv = perf.shape_for(s), perf.calibration_for(s.gpu.name), perf.kv_tokens_for(s)
    cap = perf.steady_state(sh, cal, prompt=prompt, output=out, hit=0.0, max_batched_tokens=s.max_num_batched_tokens,
                            max_seqs=s.max_num_seqs, kv_tokens=kv, clients=1.0).capacity
    return perf.steady_state(sh, cal, prompt=prompt, output=out, hit=0.0,
                             max_batched_tokens=s.max_num_batched_tokens, max_seqs=s.max_num_seqs,
                             kv_tokens=kv, clients=math.ceil(cap * factor)), cap


def test_short_prompts_over_kv_capacity_are_admitted_by_blocks_and_stall_instead():
    # 1k prompts, 8k outputs, 1.3x the clients the pool holds on average: every prompt fits the
    # pool, so vLLM admits them (by blocks) and the overload shows up as preemption stalls
    op, cap = _over(1024, 8192, 1.3)
    assert op.saturated and op.queue_wait_s == pytest.approx(0.0, abs=1e-9)
    light, _ = _over(1024, 8192, 0.9)
    assert op.tpot_s > 1.2 * light.tpot_s


def test_long_prompts_over_kv_capacity_wait_before_their_first_token():
    op, cap = _over(8192, 512, 1.5)
    assert op.queue_wait_s > 0.5 * op.ttft_s


def test_when_max_num_seqs_binds_all_the_wait_is_before_the_first_token():
    op, cap = _over(128, 128, 2.0, max_num_seqs=16)
    assert cap == 16 and op.queue_wait_s > 0
    light, _ = _over(128, 128, 1.0, max_num_seqs=16)
    assert op.tpot_s == pytest.approx(light.tpot_s, rel=0.05)


def test_v0_chunked_prefill_default_skips_sliding_window_models():
    # V0 enabled chunked prefill by itself above 32k context, except for sliding-window models:
    # those profiled one prefill of the whole max_model_len
    dense = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB", vllm_version="0.6.3")
    swa = Setup.build("openai/gpt-oss-20b", "A100-80GB", vllm_version="0.6.3")
    assert dense.enable_chunked_prefill and dense.max_num_batched_tokens == 512
    assert not swa.enable_chunked_prefill
    assert swa.max_num_batched_tokens == swa.max_model_len == 131072
    # V1 chunks every model
    assert Setup.build("openai/gpt-oss-20b", "A100-80GB", vllm_version="0.10.0").enable_chunked_prefill


def test_an_exact_checkpoint_size_rescales_the_derived_weights_when_loaded_as_stored():
    s = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", tp=2, max_model_len=8192)
    rope = s.model.max_position_embeddings * s.model.rotary_dim * s.dtype_bytes
    derived = weights_bytes(s) - rope
    # a model object that carries the safetensors byte count (added by model resolution):
    # 2 % more than the config fields derive -> every rank holds 2 % more
    linear, _, other = s.model.layer_params()
    total = (linear + other) * 2 + 2 * s.model.vocab_size * s.model.hidden_size * 2

    class Exact(type(s.model)):
        weight_bytes = total * 1.02
    exact_model = Exact(**{f.name: getattr(s.model, f.name) for f in fields(s.model)})
    assert weights_bytes(s.with_(model=exact_model)) - rope == pytest.approx(derived * 1.02, rel=1e-9)
    # runtime quantization loads something else than the checkpoint: no correction
    q = s.with_(model=exact_model, quantization="fp8")
    assert weights_bytes(q) == pytest.approx(weights_bytes(s.with_(quantization="fp8")), rel=1e-12)


def test_dequantizing_moe_kernels_on_hopper_stream_experts_at_the_h100_rate():
    """4-bit experts (MXFP4, INT4) are upcast in the kernel, whose rate does not follow an H200's
    faster HBM: the experts' share of a decode step takes as long on H200 as on H100, while the
    dense weights and an FP8 MoE (no upcast) do speed up by the bandwidth ratio."""
    def expert_time(model, gpu, quant=None):
        s = Setup.build(model, gpu, tp=1, quantization=quant, max_model_len=8192)
        shape, cal = perf.shape_for(s), perf.calibration_for(s.gpu.name)
        no_experts = replace(shape, expert_weight_bytes=0.0)
        step = perf.step_time_shape(shape, cal, 64, 64 * 1024, 0.0)
        return step - perf.step_time_shape(no_experts, cal, 64, 64 * 1024, 0.0), shape
    h100, s100 = expert_time("openai/gpt-oss-120b", "H100")
    h200, s200 = expert_time("openai/gpt-oss-120b", "H200")
    assert s200.expert_stream_bps == pytest.approx(3.35e12) and s100.expert_stream_bps == pytest.approx(3.35e12)
    assert h200 == pytest.approx(h100, rel=0.02)
    fp8_100, _ = expert_time(MOE, "H100", "fp8")
    fp8_200, s = expert_time(MOE, "H200", "fp8")
    assert s.expert_stream_bps == 0.0
    assert fp8_100 / fp8_200 == pytest.approx(4.8 / 3.35, rel=0.02)
    # Blackwell's grouped GEMMs read FP4 natively: no cap; INT4 runs Marlin MoE there too
    assert expert_time("openai/gpt-oss-120b", "B200")[1].expert_stream_bps == 0.0
    assert expert_time("moonshotai/Kimi-K2.5", "B200")[1].expert_stream_bps == pytest.approx(3.35e12)


def test_block_fp8_experts_pay_a_floor_per_moe_layer_and_blackwell_reads_them_natively():
    """FP8 experts quantize their activations per group before each grouped GEMM: a fixed time
    per MoE layer (MOE_LAYER_FLOOR_S) that the 16-bit path of the same model does not pay.
    Blackwell's grouped GEMMs read FP8 experts without Hopper's format penalty."""
    def shape(gpu, quant):
        return perf.shape_for(Setup.build(MOE, gpu, tp=4, quantization=quant, max_model_len=8192))
    fp8, bf16 = shape("H200", "fp8"), shape("H200", None)
    n_moe = len(Setup.build(MOE, "H200", tp=4, max_model_len=8192).model.moe_layers)
    assert n_moe == 94
    assert fp8.moe_floor_s == pytest.approx(perf.MOE_LAYER_FLOOR_S["fp8"] * 94) and bf16.moe_floor_s == 0.0
    cal = perf.calibration_for("H200")
    with_floor = perf.step_time_shape(fp8, cal, 4, 4 * 1024, 0.0)
    assert with_floor - perf.step_time_shape(replace(fp8, moe_floor_s=0.0), cal, 4, 4 * 1024, 0.0) \
        == pytest.approx(94 * 40e-6)
    assert fp8.expert_kernel_eff == perf.MOE_FORMAT_EFF["fp8"] < 1.0
    assert shape("B200", "fp8").expert_kernel_eff == 1.0


def test_triton_and_marlin_moe_add_the_experts_math_to_their_reads_blackwell_overlaps_them():
    """Where vLLM runs the routed experts through Triton (Hopper: block FP8, MXFP4, BF16) or
    Marlin (INT4, any class), a step pays the experts' weight reads and then their math; the
    dense GEMMs stay on their roofline. Blackwell's FP8 / FP4 grouped GEMMs (FlashInfer) overlap
    the two, so the whole step's GEMMs keep the one roofline there."""
    def parts(model, gpu, quant=None, tp=2):
        s = Setup.build(model, gpu, tp=tp, quantization=quant, max_model_len=8192)
        return perf.shape_for(s), perf.calibration_for(s.gpu.name), s.model
    shape, cal, m = parts("MiniMaxAI/MiniMax-M2.5", "H200", "fp8")
    # 2 FLOPs x top-8 x one expert's params x 62 MoE layers, halved over TP 2
    assert shape.expert_flops_per_token == pytest.approx(2 * 8 * m.expert_params() * 62 / 2)
    assert 0 < shape.expert_flops_per_token < shape.flops_per_token
    # 512 decoding requests: every expert touched, so their reads are all the expert bytes
    b, ctx = 512, 512 * 1536.0
    one_roofline = replace(shape, expert_flops_per_token=0.0)
    step = perf.step_time_shape(shape, cal, b, ctx, 0.0)
    no_math = perf.step_time_shape(one_roofline, cal, b, ctx, 0.0)
    peak = cal.flops_eff_fp8 * shape.peak_flops
    expert_math = shape.expert_flops_per_token * b / peak
    # the lm_head (and any layer the checkpoint keeps in 16 bits) at the 16-bit rate
    wide = (shape.wide_flops_per_token + shape.head_flops_per_token) * b
    assert shape.wide_peak_flops == pytest.approx(989e12) and wide > 0
    dense_math = ((shape.flops_per_token - shape.expert_flops_per_token) * b - wide) / peak \
        + wide / (cal.flops_eff_bf16 * shape.wide_peak_flops)
    dense_read = shape.dense_weight_bytes / (cal.bw_eff * shape.bw_bytes_per_s)
    all_weights = shape.dense_weight_bytes + shape.expert_weight_bytes  # all touched at 512
    assert (dense_math + expert_math) < all_weights / (cal.bw_eff * shape.bw_bytes_per_s)
    assert expert_math > 1e-3               # a millisecond or more of expert math per step
    # one roofline over all GEMMs (no_math) hides every FLOP under the reads; serialised, the
    # step adds the experts' math and whatever of the dense math outlasts the dense reads
    assert step - no_math == pytest.approx(expert_math + max(dense_math - dense_read, 0.0), rel=1e-6)
    # so each added request costs its KV read plus its share of the experts' math
    added = perf.step_time_shape(shape, cal, b + 64, ctx + 64 * 1536.0, 0.0) - step
    kv_read = 64 * 1536 * shape.kv_bytes_per_ctx_token * cal.kv_read_scale / (
        cal.bw_eff * shape.bw_bytes_per_s * cal.attn_bw_eff)
    assert added > kv_read + 64 * shape.expert_flops_per_token / peak
    assert perf.step_time_shape(one_roofline, cal, b + 64, ctx + 64 * 1536.0, 0.0) - no_math \
        < kv_read + 64 * shape.expert_flops_per_token / peak
    # Kimi-K2.5's INT4 experts run Marlin on Blackwell too: serialised there
    assert parts("moonshotai/Kimi-K2.5", "B200", tp=8)[0].expert_flops_per_token > 0
    # Blackwell FP8, MXFP4 and BF16 experts: overlapped, one roofline over all the step's GEMMs
    for model, quant in (("MiniMaxAI/MiniMax-M2.5", "fp8"), ("openai/gpt-oss-120b", None), (MOE, None)):
        assert parts(model, "B200", quant)[0].expert_flops_per_token == 0.0
    # dense models have no expert part
    assert parts("meta-llama/Llama-3.1-70B", "H200", "fp8")[0].expert_flops_per_token == 0.0


def test_moe_prefill_keeps_a_per_token_part_that_tp_does_not_split():
    cal = perf.calibration_for("H100-SXM-80GB")
    per_tp = {}
    for tp in (2, 8):
        shape = perf.shape_for(Setup.build("openai/gpt-oss-120b", "H100-SXM-80GB", tp=tp))
        assert shape.moe_token_s == pytest.approx(perf.MOE_TOKEN_LAYER_S * 36)
        off = replace(shape, moe_token_s=0.0)
        prefill = [perf.step_time_shape(s, cal, 4, 4 * 1000.0, 7168.0) for s in (shape, off)]
        decode = [perf.step_time_shape(s, cal, 64, 64 * 2000.0, 0.0) for s in (shape, off)]
        # on every rank, for every prompt token: the same at TP 2 and TP 8
        assert prefill[0] - prefill[1] == pytest.approx(perf.MOE_TOKEN_LAYER_S * 36 * 7168)
        assert decode[0] == decode[1]          # a decode step's routing rows are not charged
        per_tp[tp] = prefill[0]
    # so quadrupling TP takes a 7,168-token MoE prefill down by far less than 4x
    assert per_tp[2] / per_tp[8] < 3.0
    dense = perf.shape_for(Setup.build("meta-llama/Llama-3.1-70B", "H100-SXM-80GB", tp=2, quantization="fp8"))
    assert dense.moe_token_s == 0.0


def test_a_checkpoint_reads_the_layers_its_quantization_left_at_16_bits():
    # Kimi-K2.5's INT4 release quantizes only the routed experts (its quantization_config ignores
    # self_attn, shared_experts and the dense MLP): those are read at 2 bytes a parameter
    s = Setup.build("moonshotai/Kimi-K2.5", "H200", tp=8, max_model_len=8192)
    assert s.quantization == "w4a16"
    assert s.model.quant_skip == {"attention", "shared_experts", "dense_mlp"}
    keep = s.model.unquantized_linear_params(s.model.quant_skip)
    m = s.model
    moe = set(m.moe_layers)
    by_hand = sum(m.attention_params_per_layer() + (m.shared_expert_params() if i in moe
                                                    else m.dense_mlp_params())
                  for i in range(m.num_layers))
    assert keep == by_hand
    all_quantized = s.with_(model=replace(m, quant_skip=frozenset()))
    q = 0.5 + 2 / 128
    rep = m.replicated_linear_params()   # MLA's down-projections: whole on every rank
    per_rank = (keep - rep) / 8 + rep
    assert weights_bytes(s) - weights_bytes(all_quantized) == pytest.approx(per_rank * (2 - q), rel=1e-9)
    # the 16-bit layers are read every step: the dense bytes per rank grow by the same amount
    dense = perf.shape_for(s).dense_weight_bytes - perf.shape_for(all_quantized).dense_weight_bytes
    assert dense == pytest.approx(per_rank * (2 - q), rel=1e-6)
    assert perf.shape_for(s).expert_weight_bytes == pytest.approx(
        perf.shape_for(all_quantized).expert_weight_bytes, rel=1e-6)


def test_nvfp4_of_an_moe_model_keeps_attention_at_16_bits_and_a_dense_one_does_not():
    from exporter.model.architectures import resolve_model, unquantized_parts
    # ModelOpt's NVFP4 MoE releases list every layer's self_attn in exclude_modules
    assert resolve_model("nvidia/MiniMax-M2.5-NVFP4").quant_skip == {"attention"}
    native = Setup.build("MiniMaxAI/MiniMax-M2.5", "B200", tp=2, max_model_len=8192)
    assert native.model.quant_skip == frozenset()        # its block-FP8 release quantizes attention
    fp4 = Setup.build("MiniMaxAI/MiniMax-M2.5", "B200", tp=2, max_model_len=8192, quantization="fp4")
    assert unquantized_parts(fp4.model, fp4.quantization) == {"attention"}
    dense = Setup.build("meta-llama/Llama-3.1-70B-Instruct", "B200", tp=2, quantization="fp4")
    assert unquantized_parts(dense.model, dense.quantization) == frozenset()
    # runtime FP8 quantizes every linear layer
    rt = Setup.build("Qwen/Qwen3-30B-A3B", "H100", quantization="fp8", max_model_len=8192)
    assert unquantized_parts(rt.model, rt.quantization) == frozenset()


def test_fp4_of_an_mxfp4_checkpoint_is_that_checkpoint():
    # gpt-oss described as --quantization fp4 (how measured tables name it) is the same deployment
    # as gpt-oss with no flag: one KV pool, one step time
    def calc(*extra):
        out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", "openai/gpt-oss-120b",
                              "--gpu", "H100", "--tp", "2", "--concurrency", "32", "--json", *extra],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    plain, fp4 = calc(), calc("--quantization", "fp4")
    assert fp4["kv_cache"]["tokens"] == plain["kv_cache"]["tokens"]
    assert fp4["predicted"]["tpot_s"] == pytest.approx(plain["predicted"]["tpot_s"], rel=1e-12)
    assert Setup.build("openai/gpt-oss-120b", "H100", quantization="fp4").quantization == "mxfp4"
    assert Setup.build("openai/gpt-oss-120b", "H100", quantization="nvfp4").quantization == "nvfp4"


def test_the_step_streams_mxfp4_experts_as_stored_while_the_allocation_is_padded():
    s = Setup.build("openai/gpt-oss-120b", "H100", tp=2, max_model_len=8192)
    assert weights_bytes(s) > weights_bytes(s, padded=False)
    # the padding is on the routed experts only (hidden 2880 -> 3072, per-rank intermediate
    # 1440 -> 1536: 1.138x)
    _, experts, _ = s.model.layer_params()
    stored = experts * (0.5 + 1 / 32) / 2
    assert weights_bytes(s) - weights_bytes(s, padded=False) == pytest.approx(
        stored * (1536 / 1440 * 3072 / 2880 - 1), rel=1e-9)
    shape = perf.shape_for(s)
    assert shape.expert_weight_bytes == pytest.approx(stored, rel=1e-6)


def test_mla_down_projections_are_whole_on_every_tp_rank():
    # vLLM builds fused_qkv_a_proj (q_a + kv_a) with disable_tp=True: each rank holds and reads it
    s8 = Setup.build("moonshotai/Kimi-K2.5", "H200", tp=8, max_model_len=8192)
    m = s8.model
    rep = m.replicated_linear_params()
    assert rep == m.num_layers * m.hidden_size * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)

    class Split(type(m)):   # the same model with every attention weight split over TP
        def replicated_linear_params(self) -> int:
            return 0
    split = s8.with_(model=Split(**{f.name: getattr(m, f.name) for f in fields(m)}))
    # Kimi's attention is 16-bit in its INT4 release: 7/8 of the replicated part more per rank,
    # in the allocation and in what a step reads
    assert weights_bytes(s8) - weights_bytes(split) == pytest.approx(rep * 2 * 7 / 8, rel=1e-9)
    assert perf.shape_for(s8).dense_weight_bytes - perf.shape_for(split).dense_weight_bytes == pytest.approx(
        rep * 2 * 7 / 8, rel=1e-6)
    assert perf.shape_for(s8).expert_weight_bytes == pytest.approx(perf.shape_for(split).expert_weight_bytes,
                                                                   rel=1e-6)
    # and their GEMMs run whole on every rank
    assert perf.shape_for(s8).flops_per_token - perf.shape_for(split).flops_per_token == pytest.approx(
        2 * rep * 7 / 8, rel=1e-9)
    # GQA models replicate nothing
    assert Setup.build("meta-llama/Llama-3.1-70B-Instruct", "H200", tp=8).model.replicated_linear_params() == 0


def test_layers_a_checkpoint_keeps_in_16_bits_run_16_bit_gemms():
    """A quantized checkpoint's layers left in the model dtype (gpt-oss: all but the routed
    experts; ModelOpt's NVFP4 MoE releases: attention) and the lm_head run 16-bit GEMMs at the
    16-bit peak, not at the quantized experts' rate; gpt-oss's MXFP4 experts take FP8 activations
    on Blackwell (FlashInfer MXFP4 x MXFP8, vLLM's recipe there)."""
    def shape(model, gpu, quant=None, tp=2):
        s = Setup.build(model, gpu, tp=tp, quantization=quant, max_model_len=8192)
        return perf.shape_for(s), s.model
    oss, m = shape("openai/gpt-oss-120b", "B200")
    linear, experts, _ = m.layer_params()
    assert oss.compute_dtype == "fp8" and oss.peak_flops == pytest.approx(4500e12)
    assert oss.wide_flops_per_token == pytest.approx(2 * (linear - experts) / 2)
    assert oss.wide_peak_flops == pytest.approx(2250e12)
    hopper, _ = shape("openai/gpt-oss-120b", "H200")
    assert hopper.compute_dtype == "bf16" and hopper.wide_peak_flops == 0.0   # all 16-bit already
    nvfp4, mm = shape("MiniMaxAI/MiniMax-M2.5", "B200", "nvfp4")
    attention = sum(mm.attention_params_per_layer(i) for i in range(mm.num_layers) if mm.has_attention(i))
    assert nvfp4.compute_dtype == "fp4" and nvfp4.wide_flops_per_token == pytest.approx(2 * attention / 2)
    llama, _ = shape("meta-llama/Llama-3.1-70B", "H200", "fp8")
    assert llama.wide_flops_per_token == 0.0 and llama.wide_peak_flops == pytest.approx(989e12)  # the lm_head
    # a compute-bound prefill step pays the 16-bit share at the 16-bit rate
    cal = perf.calibration_for("B200")
    split = perf.step_time_shape(oss, cal, 0, 0.0, 8192)
    narrow = perf.step_time_shape(replace(oss, wide_peak_flops=0.0), cal, 0, 0.0, 8192)
    wide = oss.wide_flops_per_token * 8192 + oss.head_flops_per_token
    assert split - narrow == pytest.approx(
        wide / (cal.flops_eff_bf16 * 2250e12) - wide / (cal.flops_eff_fp8 * 4500e12), rel=1e-6)
