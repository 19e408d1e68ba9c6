"""Step time, TTFT, TPOT and throughput of a vLLM replica: a calibrated roofline.

Why a roofline and not a lookup table: the daemon must predict setups nobody benchmarked (other
models, other GPUs, other TP), so the structure is physics (bytes moved per decode step over HBM
bandwidth, FLOPs per prefill token over tensor throughput, all-reduce per layer over the link) and
only a handful of efficiency factors are fitted, per GPU *class* (Hopper, Blackwell, ...), never
per model. The fit lives in `CALIBRATIONS` with the data it came from; `benchmarks/accuracy_latency.py`
measures it on rows it was and was not fitted to.

Two entry points:
- `step_time_s(setup, ...)`: one engine step (the simulator calls it every step, so it is a few
  float operations on a cached `Shape`).
- `predict(setup, traffic, concurrency=|rate=)`: steady state of continuous batching, closed loop
  (a fixed number of clients, as in benchmark sweeps) or open loop (Poisson arrivals).

Pure: no I/O, no clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Sequence

from exporter.errors import InputError
from exporter.model.gpus import find_gpu

# ---------------------------------------------------------------------------------------------
# Calibration: efficiency factors per GPU class


@dataclass(frozen=True)
class Calibration:
    """Fitted efficiency factors of one GPU class.

    bw_eff        share of datasheet HBM bandwidth a decode step achieves (weights + KV reads)
    flops_eff_*   share of the dtype's dense peak a prefill/verify GEMM achieves
    step_overhead_s   fixed cost of an engine step (scheduler, launch, sampler) at TP=1
    layer_sync_s  per-layer cost of a TP all-reduce (latency part; the byte part uses the link)
    per_token_s   per scheduled token and million activation elements it passes through
                  (`Shape.activation_width_m`): the small kernels between a layer's GEMMs (norms,
                  residual adds, rotary, activation function, activation quantization) read and
                  write about that many elements, so a 70B token costs five times an 8B one
    ttft_steps    engine steps between a request's arrival and its first token beyond its own
                  prefill (admission, output processing, streaming), as measured by clients
    ttft_fixed_s  fixed client-visible overhead (HTTP, tokenisation, detokenisation)
    moe_flops_eff share of the dense GEMM efficiency an MoE grouped GEMM keeps in prefill
    queue_factor  closed loop: share of the other running requests whose prefill a new request
                  waits behind (arrivals cluster when lengths are fixed)
    ttft_prefill_factor  a request's own prefill as its client sees it, relative to the prefill's
                  share of a busy mixed step (first-chunk scheduling, no overlap with decode)
    per_seq_s     host (CPU) cost per running request per step: input preparation, sampling
                  bookkeeping, output processing; not split over TP (one scheduler process)
    moe_bw_eff    share of `bw_eff` the fused-MoE kernel reaches reading routed-expert weights
                  (times the weight format's MOE_FORMAT_EFF below)
    sample_sort_s per decoding request and step, per 100k vocabulary entries: the top-k/top-p
                  sampler sorting that request's logits (only models whose generation_config sets
                  top_k/top_p, which vLLM applies by default); the whole vocabulary on every rank,
                  so not split over TP; bandwidth-bound (radix sort), scaled like per_token_s
    ref_bw_tbps   HBM bandwidth the class's `per_token_s` was measured at: the per-token GPU work
                  (norms, rotary, activation, quantization) is bandwidth-bound, so another GPU's
                  per-token cost scales with ref_bw / its bandwidth, and with 1/TP
    attn_bw_eff   share of `bw_eff` paged decode attention reaches reading the KV cache (its own
                  kernel, after the GEMMs: short per-request contexts in 16-token blocks)
    kv_capacity_scale  KV tokens the server really holds relative to the predicted pool: 1 a
                  priori; measured rows whose queueing shows another capacity (an FP8 KV scheme
                  the checkpoint carried, another memory setting) fit it (`calc --calibrate`);
                  the daemon reads the real pool from the server instead
    layer_s       fixed GPU time per decoder layer and step at any TP: the floor of the dozen
                  kernels a layer runs (norms, GEMMs, rotary, attention, activation, quant) under
                  CUDA graphs, which a small batch does not amortise; `layer_sync_s` is what an
                  all-reduce adds to it at TP > 1
    kv_read_scale KV bytes decode attention reads per context token relative to the predicted
                  cache dtype: 1 a priori; 0.5 is a server storing its KV cache in FP8 that calc
                  was not told about (`--kv-cache-dtype fp8`, common in Blackwell benchmark
                  recipes), fitted by `calc --calibrate` from how TPOT grows with context
    expert_touch_scale  MoE: independent draws per token of the step in the experts-touched law
                  (1 - (1 - k/E)^(tokens x scale)): 1 a priori (every token routes on its own,
                  uniformly); below 1 when a batch's tokens share experts (routing skewed toward
                  popular experts), so the routed weights read grow more evenly with the batch.
                  Fitted by `calc --calibrate` from how TPOT grows with concurrency; inert for
                  dense models
    moe_decode_token_scale  MoE: the routing work per token and MoE layer (top-k, sort, permute,
                  activation quantization; MOE_TOKEN_LAYER_S, charged on prompt tokens) that
                  decode tokens pay as well, as (scale - 1) x MOE_TOKEN_LAYER_S: 1 a priori (a
                  decode step's few routing rows sit under the MoE layers' kernel floor); above 1
                  where TPOT keeps growing with the batch after every expert is touched (FP8
                  MoE on B200/H200: 43-89 us per added request). Fitted by `calc --calibrate`
                  from rows at two or more loads; inert for dense models

    The step-time factors (what an online calibration fits, issue 15) are STEP_FACTORS; the
    TTFT/queueing factors are TTFT_FACTORS.
    """

    gpu_class: str
    bw_eff: float
    flops_eff_bf16: float
    flops_eff_fp8: float
    flops_eff_fp4: float
    step_overhead_s: float
    layer_sync_s: float
    per_token_s: float
    ttft_steps: float
    ttft_fixed_s: float
    moe_flops_eff: float
    queue_factor: float
    ttft_prefill_factor: float
    source: str
    per_seq_s: float = 0.0
    moe_bw_eff: float = 1.0
    ref_bw_tbps: float = 3.35
    attn_bw_eff: float = 1.0
    kv_capacity_scale: float = 1.0
    sample_sort_s: float = 0.0
    kv_read_scale: float = 1.0
    layer_s: float = 0.0
    expert_touch_scale: float = 1.0
    moe_decode_token_scale: float = 1.0


# the free factors of the step-time model, few and physical (fitted per GPU class offline by
# benchmarks/accuracy_latency.py --fit, online by the calibration of issue 15)
STEP_FACTORS = ("bw_eff", "flops_eff_bf16", "flops_eff_fp8", "flops_eff_fp4", "moe_flops_eff",
                "moe_bw_eff", "attn_bw_eff", "step_overhead_s", "per_seq_s", "per_token_s",
                "layer_sync_s", "sample_sort_s", "kv_read_scale", "layer_s")
TTFT_FACTORS = ("ttft_steps", "ttft_fixed_s", "queue_factor", "ttft_prefill_factor")

# Relative efficiency of vLLM's fused-MoE kernel per expert weight format, against the MXFP4
# kernel the Hopper `moe_bw_eff` was fitted on (gpt-oss-120b rows). FP8 experts run the
# block-scaled (128x128) Triton/CUTLASS fused_moe, which reads scales per block and reaches a
# lower share of HBM bandwidth at decode batch sizes: prior from issue 14's held-out report
# (FP8 MoE predicted ~1.5x too fast with the dense bandwidth) -> 1/1.5. 16-bit and int4
# (Marlin MoE) experts: no measurement, prior between the two [unverified].
MOE_FORMAT_EFF = {"mxfp4": 1.0, "fp8": 0.67, "bf16": 0.85, "int4": 0.85}
# Blackwell runs FP8 experts through native block-scaled grouped GEMMs (no Triton fused_moe),
# like its FP4 ones: no format penalty. Chosen on MiniMax-M2.5 FP8 on B200 (aiconfigurator's
# rows, the only FP8 MoE measured on Blackwell: 12.6 -> 8.1 % with the floor below), so not
# held out for it.
MOE_FORMAT_EFF_BY_CLASS = {("blackwell", "fp8"): 1.0}
# Block-FP8 experts pay a fixed time per MoE layer and step beyond their weight reads: the
# activations are quantized per 128-wide group before each of the two grouped GEMMs and the
# scales carried through (kernels the 4-bit and 16-bit paths do not run), which a decode batch
# of a few rows per expert does not amortise. 40 us per MoE layer: MiniMax-M2.5 FP8 on H200 runs
# 25-40 % slower than the expert roofline at c=4-8 and converges on it by c=64. Cross-checked
# across families (aiconfigurator's rows): chosen on MiniMax alone (30-40 us) it takes
# Qwen3-235B-A22B-FP8 on H200 from 33.5 to 25-27 %; chosen on Qwen3-235B alone (60 us) it takes
# MiniMax from 12.6 / 18.4 % (B200 / H200) to 10.9 / 13.3 %.
MOE_LAYER_FLOOR_S = {"fp8": 40e-6}

# A MoE layer's fixed time on a kernel path other than the one the Hopper factors were fitted on,
# keyed by GPU class and weight scheme. gpt-oss's MXFP4 experts run on Hopper through
# triton_kernels (routing, then matmul_ogs for each grouped GEMM: the shared H100 rows set
# `layer_s` with them), on Blackwell through FlashInfer's fused TRT-LLM MoE, which routes,
# runs both grouped GEMMs and finalizes in fewer launches (vllm mxfp4.py get_mxfp4_backend:
# SM100_FI_MXFP4_BF16 by default, _MXFP8_TRTLLM with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8).
# -17 us per MoE layer, read off SemiAnalysis InferenceMAX's gpt-oss-120b sweep on vLLM 0.13.0
# (18 B200 runs, TP1-8, c=4-16, 1k/1k, 8k/1k, 1k/8k; run 20667906037's agg_bmk.json): TPOT
# 16.7 -> 2.1 % (every run 12-21 % over before, the same ~0.6 ms at TP1 as at TP8; -16 and
# -18 us 2.2 / 2.4 %); its 8 H100/H200 runs, on the Hopper path, stay 0.6-1.2 %. Held out:
# aiconfigurator's gpt-oss B200 rows (0.15.1), TPOT 15.4 -> 10.7 %. NVFP4 experts (MiniMax,
# Kimi) are not moved: their B200 rows show no such offset.
MOE_LAYER_BY_CLASS_S = {("blackwell", "mxfp4"): -17e-6}

# An MLA layer's fixed time per step beyond a GQA layer's (`layer_s`, fitted on GQA models): the
# latent projections and their norms (q_a, kv_a with the decoupled rope key), and the absorbed
# W_UK / W_UV batched GEMMs around the latent attention, small kernels a decode batch does not
# amortise. 22 us per MLA layer, read off SemiAnalysis InferenceX's Kimi-K2.5 runs on vLLM 0.21
# (8192/1024 at c=4 and 8: H200 and B200 INT4 at TP8, B200 NVFP4 at TP8 and TP4; blog
# b200-nvfp4-vs-h200-int4-kimi-k2-vllm-perf-per-dollar, InferenceX-app @ 26a3586c): TPOT MAPE
# 10.5 -> 1.7 % over the 7 (every one 6-16 % under without it; 18 us 2.9 %, 20 us 2.2 %, 24 us
# 1.9 %). It was 18 us until the closed loop stopped charging a request's own prefill to its TPOT
# (these runs' 8k prompts at 4-8 clients had carried ~3 % of it). Held out: aiconfigurator's
# Kimi-K2.5 rows (0.15-0.17, 105 rows on B200 and H200), TPOT 12.1 / 11.8 -> 6.5 / 6.3 %, TTFT
# 10.0 / 10.7 -> 9.9 / 11.3 %. DeepSeek-R1 stays under-predicted where public runs exist
# (0.7.4.dev on 8 x H200, 3200/800 at c=4: 12.9 ms for 25.7): not explained by it.
MLA_LAYER_S = 22e-6

# Whether a routed-expert GEMM's math hides under its weight reads (roofline: the longer of the
# two) or adds to them. vLLM runs MoE experts through Triton kernels on Hopper (block FP8:
# `fused_moe`, which fused_moe/oracle/fp8.py puts first for TP on SM90; MXFP4: triton_kernels'
# matmul_ogs; BF16: `fused_moe`) and Marlin for INT4 weights on any class. At serving batch sizes
# each expert multiplies its weight tiles against a few rows (tokens x top-k / E), and these
# kernels load a tile, then compute on it: the math adds to the reads. Blackwell's FP8, FP4 and
# BF16 experts go through FlashInfer's TRT-LLM / CUTLASS grouped GEMMs (first in the same oracles,
# fp8.py and unquantized.py, off SM90), warp-specialized (TMA producer warps feed the tensor-core
# warps), which overlap the two.
# Chosen on the shared rows (Hopper only), cross-validated by leaving a model family out
# (benchmarks/accuracy_latency.py --cv, family folds TPOT / TTFT 6.9 / 24.1 -> 6.4 / 20.3 %);
# the Blackwell exception follows the kernels vLLM picks, and aiconfigurator's B200 rows agree
# with it (FP8 MiniMax-M2.5 and MXFP4 gpt-oss TTFT worse when serialised, INT4 Kimi-K2.5 on
# Marlin better): those rows were looked at, so they are not held out for it.
MOE_OVERLAPPED = {("blackwell", "fp8"), ("blackwell", "mxfp4"), ("blackwell", "bf16")}

# MoE prefill time that tensor parallelism does not split: per prompt token of the step and MoE
# layer, on every rank. With plain TP each rank runs the routing (gate, top-k), the sort of
# token-expert pairs by expert and the permutation of the activations over ALL tokens, and only
# the expert GEMMs' width is divided; measured MoE prefills stop shrinking with TP where dense ones
# do not: gpt-oss-120b on H100 (shared rows), 7,168 more prompt tokens cost 205 / 136 / 96 ms at
# TP 2 / 4 / 8 (= 67 ms + 276 ms / TP), while Llama-3.1-70B FP8's scale with 1/TP. Charged on
# prefill tokens (a decode step's few routing rows sit under the MoE layer's kernel floor).
# 0.15 us per token and MoE layer, with moe_flops_eff refitted beside it (0.483 -> 1.0, its
# physical bound: the split part then runs as efficiently as a dense GEMM). Chosen on the 60
# shared gpt-oss rows alone (TPOT / TTFT 7.6 / 15.5 -> 6.7 / 10.2 %; grid 0.075-0.2 us with
# moe_flops_eff <= 1). Held out: aiconfigurator's B200/H200 rows (MiniMax-M2.5, Kimi-K2.5,
# gpt-oss on Blackwell); see docs/model.md for the figures. A GEMM-width efficiency (narrow
# per-rank expert shards) was tried instead and explained little (held-out TTFT 38.5 -> 38.2 %).
# Since the per-token work follows the activation width (gpt-oss's is a quarter of Qwen3-32B's),
# the same grid on the gpt-oss rows prefers 0.2 us (TPOT / TTFT 7.3 / 12.3 -> 7.0 / 11.4 %); kept
# at 0.15: on aiconfigurator's MoE rows 0.2 costs TTFT (20.3 -> ~24 % over the 820), and those
# rows would then be choosing it.
MOE_TOKEN_LAYER_S = 0.15e-6
# The same on Blackwell's FlashInfer fused MoE (the MOE_OVERLAPPED paths: TRT-LLM / CUTLASS
# grouped GEMMs that route and permute inside the kernel, where Hopper's Triton path runs
# topk, moe_align_block_size and the permutations as kernels of their own): half, 0.075 us per
# token and MoE layer. Read off SemiAnalysis InferenceMAX's gpt-oss-120b B200 sweeps on vLLM
# 0.13.0 (GHA runs 20662362255 and 20667906037, the second MOE_LAYER_BY_CLASS_S's: 56
# configurations at c = 4-128, the two runs averaged), where TTFT at 8192/1024 and c = 4 falls
# 107 -> 82 -> 70 -> 72 ms over TP 1-8: 0.15 us leaves 40 ms of it at every TP (111 -> 102 ->
# 96 -> 93 predicted); 0.075 us, with the 16-bit layers at their own rate
# (Shape.wide_flops_per_token), 115 -> 87 -> 72 -> 65 (before Blackwell's fixed TTFT part,
# `ttft_fixed_s`, which adds 5 ms). Those 56, TPOT / TTFT without that part: 7.6 / 18.1 % at
# 0.15 us, 6.1 / 10.6 % at 0.1, 5.3 / 11.0 % at 0.075, 4.8 / 16.9 % at 0.05 (with it, 0.06 us
# and 8 ms are as good: 5.0 / 6.2 %). Held out: aiconfigurator's B200 rows (MiniMax-M2.5 FP8 and
# NVFP4, Kimi-K2.5 NVFP4, gpt-oss 0.15.1).
MOE_TOKEN_LAYER_FUSED_S = 0.075e-6


# Dequantizing MoE kernels (4-bit experts upcast in registers: MXFP4 through triton_kernels'
# matmul_ogs or Marlin on Hopper, INT4 through Marlin MoE) stream expert weights at a rate that
# does not grow with a faster HBM of the same class: the dequantization and the few rows per
# expert at decode batch sizes, not the memory, set it. Hopper's MoE factors were fitted on H100
# (3.35 TB/s); an H200 (4.8 TB/s) streams 4-bit experts at the H100 rate: gpt-oss-120b on H200
# (aiconfigurator's rows) runs 1.1-5.2 ms per step slower than H200 bandwidth predicts, growing
# with the experts touched and halving with each TP doubling, as H100's rate gives (0.8-5.6 ms);
# those rows chose this term (not held out for it); Kimi-K2.5 INT4 on H200 was not used and
# goes from 27 to 16 % TPOT error. Marlin MoE is the same kernel on Blackwell (INT4 has no
# native path there): Kimi-K2.5 INT4 on B200 ran ~1.75x slower than B200 bandwidth predicts at
# every concurrency, 35.5 -> 16.7 % with the same rate (those rows chose to extend it). FP8
# experts (tensor-core FP8, no upcast) do not follow it (MiniMax-M2.5 FP8 on H200 grows slower
# than H200 bandwidth predicts), nor Blackwell's native FP4 grouped GEMMs (MXFP4, NVFP4).
MOE_STREAM_CAP_TBPS = {("hopper", "mxfp4"): 3.35, ("hopper", "int4"): 3.35, ("blackwell", "int4"): 3.35}


# --enforce-eager: no CUDA graphs, so the host launches every kernel of every layer each step and
# the GPU waits on it when its own work is shorter: a step takes the longer of the GPU time and
# the launches. Per decoder layer, the median of three public eager runs whose step the launches
# set: Llama-2-7B at batch 1 on A100, 12 ms per token eager against 10.5 with graphs (vllm PR
# #1926, V0 of 2023: ~335 us per layer over 32 after the step's fixed cost); Qwen3-14B-AWQ alone on
# an A100 at 16k context under V1 0.9.1, 20.63 ms per token (vllm issue #20469: ~480 us over 40);
# Qwen2.5-7B (Qwen2.5-Omni's thinker) on A800 under vllm-omni, 22 ms eager against 13 (vllm-omni
# issue #7960: ~740 us over 28). The host CPU and the release set it, so expect +-40 %.
EAGER_LAYER_LAUNCH_S = 480e-6


_FIT_SOURCE = ("Nelder-Mead fit of the objective in benchmarks/accuracy_latency.py (--fit reruns it) on "
               "../shared/fixtures/throughput-observations.csv, H100-SXM and H200-SXM rows, c <= 256")

# Hopper is the only class with measured rows; the others start from the Hopper factors (the
# physics — bandwidth, peak FLOPs, link — differs per GPU through the catalog) and say so.
CALIBRATIONS: dict[str, Calibration] = {
    # refitted 2026-11-25 (second time) on 258 rows (H100-SXM: Qwen3-32B bf16/fp8, Llama-3.1-70B
    # fp8, gpt-oss-120b mxfp4; H200-SXM: Llama-3.1-70B fp8; c <= 256) with the per-token cost
    # split over TP, a per-request host cost, token-based admission, and attention as its own
    # roofline after the GEMMs (attn_bw_eff), the sampler's top-k/top-p sort (sample_sort_s, models
    # whose generation_config truncates), a weak prior on each factor; bw_eff bounded by
    # BW_EFF_MAX (0.93). Cross-validated figures:
    # `python benchmarks/accuracy_latency.py --cv`. FP4 GEMMs have no Hopper rows: the FP8
    # factor stands in for them.
    # Per-layer time: the fit put 2 x 26.7 us per layer into the all-reduce latency, fitted on
    # TP >= 2 rows, so TP1 came out 3.5-5 ms per step too fast (80-layer Llama-3.1-70B on H200
    # and B200, 36-layer gpt-oss on H200: 40-75 us per layer missing). That time is the layer's
    # kernel floor, present at any TP: split as layer_s 43.4 us + 2 x 5.0 us of all-reduce (the
    # same 53.4 us at TP >= 2; the split is the one the shared TP1 rows prefer, 16 rows of
    # Llama-3.1-70B on H200: TPOT 22.0 -> 14.8 %). moe_flops_eff refitted with MOE_TOKEN_LAYER_S
    # (0.483 -> 1.0, the gpt-oss rows alone).
    # per_token_s per million activation elements (it was one constant per token, 4.32 us, for a
    # 0.5M-wide gpt-oss and a 2.9M-wide Llama-3.1-70B alike): refitted alone, the other factors
    # held, 2.50 us at 3.35 TB/s, ~8 bytes of elementwise traffic per element. The shared rows
    # barely tell values apart (1.5-3.5 us: TPOT 5.90-5.85 %, TTFT 14.8-15.0 %), so the fit sits
    # at its prior, the old constant over Qwen3-32B's 2.0M width; fitted from a neutral start
    # with one family held out it comes to 1.65-1.94 us (the old constant: 3.6-5.4 us).
    "hopper": Calibration("hopper", bw_eff=0.930, flops_eff_bf16=0.569, flops_eff_fp8=0.789,
                          flops_eff_fp4=0.789, step_overhead_s=1.273e-3, layer_sync_s=5.0e-6,
                          per_token_s=2.50e-6, ttft_steps=3.83, ttft_fixed_s=0.0,
                          moe_flops_eff=1.0, queue_factor=0.0355, ttft_prefill_factor=1.49,
                          source=_FIT_SOURCE, per_seq_s=0.90e-6, moe_bw_eff=0.943,
                          ref_bw_tbps=3.35, attn_bw_eff=0.878, sample_sort_s=29.1e-6,
                          layer_s=43.4e-6),
    # Blackwell (B200/B300/GB200, RTX PRO 6000): no measured rows here, so not Hopper's numbers
    # stretched but each factor carried over by what it physically is:
    # - host costs (step_overhead_s, per_seq_s) and the all-reduce latency (layer_sync_s,
    #   vLLM's one-shot custom all-reduce over NVLink) do not depend on the GPU generation;
    # - per_token_s is GPU small-kernel work: it scales with bandwidth through ref_bw_tbps
    #   (kept at Hopper's reference, so a B200 at 8 TB/s pays 3.35/8 of it);
    # - efficiencies are shares of Blackwell's own datasheet peaks; the GEMM shares are lower
    #   than Hopper's because the same serving batch fills a 2.25x larger tensor-core array
    #   less (prior: Hopper's x 0.8 [unverified, to be fitted online, issue 15]); HBM3e
    #   bandwidth share as Hopper's HBM3 [unverified]; FP4 GEMMs (tcgen05) as FP8;
    # - sample_sort_s (the top-k/top-p sort, bandwidth-bound) scales like per_token_s;
    # - ttft_fixed_s: 5 ms, the one factor read off Blackwell rows. A lone short prompt's first
    #   token on B200 comes ~5 ms later than its prefill and steps add up to, which Hopper's
    #   fit (0 ms) does not show: SemiAnalysis InferenceMAX's gpt-oss-120b B200 runs on vLLM
    #   0.13.0 (MOE_TOKEN_LAYER_FUSED_S's 56 configurations) TTFT 10.9 -> 6.2 % (signed -8.6 ->
    #   0.0 %; 4 ms 6.6 %, 6 ms 6.0 % with +1.7 % signed), the 0.11.2 runs 10.4 -> 6.5 %; c=4 at
    #   922/922 over TP 1-8 44.8 / 35.1 / 29.8 / 28.9 ms measured, 36 / 28 / 23 / 21 before. The cause is not identified (host or
    #   FlashInfer planning time per request); held out, aiconfigurator's B200 rows agree across
    #   families (TTFT 19.6 -> 18.3 %: gpt-oss 17.7 -> 13.4, Llama-3.1-70B 28.4 -> 26.7, MiniMax
    #   18.5 -> 17.9; Kimi-K2.5 9.2 -> 9.8).
    # Built from the Hopper entry (just below the dict) so the two cannot drift apart.
}
CALIBRATIONS["blackwell"] = replace(
    CALIBRATIONS["hopper"], gpu_class="blackwell",
    flops_eff_bf16=round(CALIBRATIONS["hopper"].flops_eff_bf16 * 0.8, 3),
    flops_eff_fp8=round(CALIBRATIONS["hopper"].flops_eff_fp8 * 0.8, 3),
    flops_eff_fp4=round(CALIBRATIONS["hopper"].flops_eff_fp4 * 0.8, 3),
    ttft_fixed_s=5e-3,
    source="prior: Hopper fit carried over factor by factor, TTFT's fixed part from public B200 runs")
_UNFITTED_NOTE = "no measured rows for this class: Hopper factors applied to its own datasheet"


def gpu_class(gpu_name: str, vendor: str = "nvidia") -> str:
    """Architecture family of a catalog GPU (what the efficiency factors are shared across)."""
    row = find_gpu(gpu_name)
    if row is not None and row.arch != "unknown":
        return row.arch          # the catalog's `arch` (volta ... blackwell, cdna2 ... cdna4)
    n = gpu_name.upper()
    if vendor == "amd" or n.startswith("MI"):
        return "cdna3"
    if n.startswith(("H100", "H200", "GH200")):
        return "hopper"
    if n.startswith(("B200", "B100", "B300", "GB200", "GB300", "RTX-PRO-6000")):
        return "blackwell"
    if n.startswith(("A100", "A10", "RTX-3090", "A40")):
        return "ampere"
    if n.startswith(("L4", "L40", "RTX-4090")):
        return "ada"
    if n.startswith("T4"):
        return "turing"
    return "other"


# What public runs say about the a-priori latency on each class no factor was fitted on (the runs
# are named in docs/model.md and tests/model/test_public_startups_gpus.py); Hopper is the fit.
PRIOR_ACCURACY = {
    "blackwell": "public B200 sweeps put TPOT within 6-11 % (mean error by model family); small-active "
                 "MoE on the GDDR7 cards (RTX 5090, RTX PRO 6000) is predicted 20-45 % slow",
    "ampere": "a public A100 sweep ran 8-17 % slower than predicted, a single-stream AWQ run 2 % slower",
    "ada": "public single-stream L40S and RTX 4090 runs are within 8 %",
    "cdna3": "AMD's published MI300X tables run 1-22 % slower than predicted at batch 1 and 40-56 % "
             "slower at batch 128",
}


def prior_note(gpu_name: str, vendor: str = "nvidia") -> str | None:
    """A line for a prediction made with factors not fitted on the GPU's class: what they are and
    what public runs on the class showed. None on Hopper, the class the factors were fitted on."""
    cal = calibration_for(gpu_name, vendor)
    if cal.gpu_class == "hopper":
        return None
    seen = PRIOR_ACCURACY.get(cal.gpu_class, "no public run on this class was checked")
    return (f"latency on {gpu_name} ({cal.gpu_class}) is a prior: {cal.source.removeprefix('prior: ')}; "
            f"{seen}. Calibrate it on a measured run (calc --calibrate, vllm-drift sweep), or let "
            "serve's online calibration learn it from the server")


def calibration_for(gpu_name: str, vendor: str = "nvidia") -> Calibration:
    cls = gpu_class(gpu_name, vendor)
    cal = CALIBRATIONS.get(cls)
    if cal is not None:
        return cal
    return replace(CALIBRATIONS["hopper"], gpu_class=cls, source=_UNFITTED_NOTE)


# ---------------------------------------------------------------------------------------------
# Shape: everything a step needs, per GPU, precomputed once per setup


@dataclass(frozen=True)
class Shape:
    """Per-GPU quantities of one (model, GPU, TP, PP, dtype) setup.

    Bytes and FLOPs are per GPU of one tensor-parallel group (already divided by TP); pipeline
    stages run one after the other for a given batch, so a step's latency covers all layers.
    """

    dense_weight_bytes: float      # weights read every step (attention, dense MLP, lm_head)
    expert_weight_bytes: float     # all routed-expert weights on this GPU (0 for dense models)
    n_experts: int
    experts_per_token: int
    flops_per_token: float         # 2 x active params / TP (the lm_head's share included)
    kv_bytes_per_ctx_token: float  # KV bytes read per context token, full-attention layers
    swa_kv_bytes_per_token: float  # same for sliding-window layers (capped at the window)
    swa_window: int
    state_bytes_per_seq: float     # Mamba/linear-attention state read and written per request
    attn_flops_per_ctx_token: float  # 4 x heads x head_dim x full layers / TP, per (query, key)
    swa_attn_flops_per_ctx_token: float
    n_layers: int
    tp: int
    allreduce_bytes_per_token: float  # hidden x 2 B, per all-reduce
    bw_bytes_per_s: float
    peak_flops: float              # dense peak of the compute dtype
    link_bytes_per_s: float        # one-direction GPU-to-GPU bandwidth
    compute_dtype: str             # "bf16" | "fp8" | "fp4"
    gpu_name: str
    gpu_vendor: str
    expert_kernel_eff: float = 1.0  # MOE_FORMAT_EFF of the expert weight format
    sort_vocab: float = 0.0         # vocabulary the sampler sorts per request (0: no top-k/top-p)
    moe_floor_s: float = 0.0        # fixed time of the MoE layers per step (MOE_LAYER_FLOOR_S)
    mla_floor_s: float = 0.0        # fixed time of the MLA layers per step (MLA_LAYER_S)
    moe_token_s: float = 0.0        # per prompt token of a step, MoE time TP does not split (MOE_TOKEN_LAYER_S)
    expert_stream_bps: float = 0.0  # most HBM bytes/s the fused-MoE kernels of this GPU class
                                    # stream expert weights at (0: the GPU's bandwidth)
    allreduce_hops: float = 1.0     # latency multiple of one all-reduce: 1 with vLLM's one-shot
                                    # custom all-reduce, tp-1 for NCCL's ring on >2 PCIe GPUs
    eager_launch_s: float = 0.0     # --enforce-eager: host time launching one step's kernels
    head_flops_per_token: float = 0.0  # 2 x vocab x hidden / TP: the lm_head's part of
                                    # flops_per_token, paid only by tokens that are sampled
    expert_flops_per_token: float = 0.0  # the routed experts' part of flops_per_token (2 x top-k
                                    # x expert params x MoE layers / TP) where the MoE kernel's
                                    # math adds to its weight reads; 0 where the kernel overlaps
                                    # the two (MOE_OVERLAPPED) and for dense models
    host_weight_bytes: float = 0.0  # --cpu-offload-gb: weights kernels read from pinned host
                                    # memory (UVA) every step instead of HBM, dense part
    host_expert_bytes: float = 0.0  # the routed experts among them (read as far as tokens touch them)
    host_bytes_per_s: float = 1.0   # the host link's read rate (GPU.host_read_bytes_per_s)
    wide_flops_per_token: float = 0.0  # the part of flops_per_token (lm_head aside) in layers the
                                    # checkpoint keeps in the model dtype, run as 16-bit GEMMs
                                    # though compute_dtype is narrower (gpt-oss's attention and
                                    # router under MXFP4 experts, ModelOpt NVFP4 MoE checkpoints'
                                    # attention); with the lm_head's, at `wide_peak_flops`
    wide_peak_flops: float = 0.0    # dense peak of those 16-bit GEMMs; 0 when compute_dtype is
                                    # 16-bit already (everything at `peak_flops`)
    activation_width_m: float = 1.0  # millions of activation elements a token passes through,
                                    # all layers (ModelArch.activation_width / 1e6, which
                                    # shape_for always sets): scales the per-token GPU work
                                    # (`Calibration.per_token_s`)


def _flops_eff(cal: Calibration, shape: Shape) -> float:
    eff = {"fp8": cal.flops_eff_fp8, "fp4": cal.flops_eff_fp4}.get(shape.compute_dtype,
                                                                     cal.flops_eff_bf16)
    if shape.n_experts > 0:
        eff *= cal.moe_flops_eff
    return eff


def step_time_shape(shape: Shape, cal: Calibration, decode_seqs: float, decode_context_tokens: float,
                    prefill_tokens: float, prefill_context_tokens: float = 0.0,
                    tokens_per_seq: float = 1.0,
                    prefill_chunks: Sequence[tuple[float, float]] = ()) -> float:
    """Seconds of one engine step (see `step_time_s`). `tokens_per_seq` > 1 for spec-decode
    verification (each decoding request carries 1 + k tokens). `prefill_chunks`: the (tokens,
    context already cached) of each request's chunk when the step carries several; without it the
    prefill tokens are one request's chunk."""
    b = decode_seqs
    tokens = b * tokens_per_seq + prefill_tokens
    if tokens <= 0:
        return 0.0
    # memory: weights (MoE: only the experts some token routes to, read by the fused-MoE kernel
    # at its own efficiency) + KV of every context token
    w = shape.dense_weight_bytes
    w_exp = 0.0
    touched = 0.0
    if shape.n_experts:
        miss = 1.0 - shape.experts_per_token / shape.n_experts
        touched = 1.0 - miss ** (tokens * cal.expert_touch_scale)
        w_exp = shape.expert_weight_bytes * touched
    ctx_per_seq = decode_context_tokens / b if b else 0.0
    kv = decode_context_tokens * shape.kv_bytes_per_ctx_token
    if shape.swa_kv_bytes_per_token:
        kv += b * min(ctx_per_seq, shape.swa_window) * shape.swa_kv_bytes_per_token
    kv += prefill_context_tokens * (shape.kv_bytes_per_ctx_token + shape.swa_kv_bytes_per_token)
    if shape.state_bytes_per_seq:
        kv += 2.0 * b * shape.state_bytes_per_seq
    bw = cal.bw_eff * shape.bw_bytes_per_s
    # GEMMs (dense weights, routed experts) and attention are separate kernels of the step, each
    # bound by its own roofline, one after the other: the KV read does not hide under the GEMMs'
    # compute (a prefill-heavy mixed step pays both)
    t_dense = w / bw
    t_experts = 0.0
    if w_exp:
        bw_exp = cal.bw_eff * min(shape.bw_bytes_per_s, shape.expert_stream_bps or math.inf)
        t_experts = w_exp / (bw_exp * cal.moe_bw_eff * shape.expert_kernel_eff)
    eff_peak = _flops_eff(cal, shape) * shape.peak_flops
    # logits only where a token is sampled (vLLM's logits_indices): every decoding request's
    # positions, one per prefill; a prompt's other tokens skip the lm_head GEMM
    sampled = b * tokens_per_seq + (1.0 if prefill_tokens else 0.0)
    flops = shape.flops_per_token * tokens - shape.head_flops_per_token * max(tokens - sampled, 0.0)
    # the layers left in the model dtype (and the lm_head) run 16-bit GEMMs at their own rate
    wide = 0.0
    t_wide = 0.0
    if shape.wide_peak_flops:
        head = shape.head_flops_per_token * min(sampled, tokens)
        wide = min(shape.wide_flops_per_token * tokens + head, flops)
        t_wide = wide / (cal.flops_eff_bf16 * shape.wide_peak_flops)
    if shape.expert_flops_per_token:
        # MoE through Triton or Marlin kernels (not MOE_OVERLAPPED): the dense GEMMs on their
        # roofline, then the routed experts' weight reads and their math, one after the other
        f_exp = min(shape.expert_flops_per_token * tokens, flops - wide)
        t_gemm = max(t_dense, (flops - f_exp - wide) / eff_peak + t_wide) + t_experts + f_exp / eff_peak
    else:
        t_gemm = max(t_dense + t_experts, (flops - wide) / eff_peak + t_wide)
    # attention: decode queries each over their context; prefill causal over the chunk plus the
    # already-computed prefix, each request's over its own (the varlen kernels run a step's
    # chunks as separate sequences, none attending to another request's tokens)
    attn_flops = tokens_per_seq * (decode_context_tokens * shape.attn_flops_per_ctx_token
                                   + b * min(ctx_per_seq, shape.swa_window)
                                   * shape.swa_attn_flops_per_ctx_token)
    chunks = prefill_chunks or (((prefill_tokens, prefill_context_tokens),) if prefill_tokens else ())
    for p, c in chunks:
        span = c + p / 2.0
        attn_flops += p * (span * shape.attn_flops_per_ctx_token
                           + min(span, shape.swa_window) * shape.swa_attn_flops_per_ctx_token)
    t_attn = max(kv * cal.kv_read_scale / (bw * cal.attn_bw_eff), attn_flops / eff_peak)
    # host: a fixed cost plus one per request in the batch; GPU small kernels: per token, on
    # this rank's slice (split over TP), and the sampler's sort per request (whole vocabulary on
    # every rank), both at this GPU's bandwidth relative to the class reference
    seqs = b + (1.0 if prefill_tokens else 0.0)
    bw_scale = cal.ref_bw_tbps * 1e12 / shape.bw_bytes_per_s
    if shape.host_weight_bytes or shape.host_expert_bytes:
        # offloaded layers' GEMMs read their weights over the host link, at its rate (UVA)
        t_gemm += (shape.host_weight_bytes + shape.host_expert_bytes * touched) / shape.host_bytes_per_s
    t = (t_gemm + t_attn + cal.step_overhead_s + cal.layer_s * shape.n_layers
         + shape.moe_floor_s + shape.mla_floor_s
         + shape.moe_token_s * (prefill_tokens + (cal.moe_decode_token_scale - 1.0) * b * tokens_per_seq)
         + cal.per_seq_s * seqs
         + cal.per_token_s * shape.activation_width_m * bw_scale / shape.tp * tokens
         + cal.sample_sort_s * shape.sort_vocab / 1e5 * bw_scale * seqs)
    if shape.tp > 1:
        per_ar = cal.layer_sync_s * shape.allreduce_hops + (2.0 * (shape.tp - 1) / shape.tp * tokens
                                     * shape.allreduce_bytes_per_token / shape.link_bytes_per_s)
        t += 2 * shape.n_layers * per_ar
    if shape.eager_launch_s:
        # without CUDA graphs the GPU runs no faster than the host launches its kernels
        t = max(t, cal.step_overhead_s + cal.per_seq_s * seqs + shape.eager_launch_s)
    return t


# ---------------------------------------------------------------------------------------------
# Steady state of continuous batching


@dataclass(frozen=True)
class Operating:
    """Steady state at one load point (internal; `Prediction` is the public view)."""

    ttft_s: float
    tpot_s: float
    requests_per_s: float
    output_tokens_per_s: float
    step_time_s: float
    running: float          # mean requests holding a KV slot
    capacity: float         # most requests that can run at once (max_num_seqs, KV)
    queue_wait_s: float     # waiting for a slot (0 unless saturated)
    prefill_s: float        # own prefill steps
    saturated: bool
    ttft_p99_s: float = math.inf


# Preemption stalls per output token, in decode steps, that steady_state books at most past the KV
# pool (benchmarks/preemption_stalls.py measures them on the V1 scheduler's rules against it).
STALL_BOUND_STEPS = 1.0


def _chunks(prefill: float, budget: float) -> list[float]:
    if prefill <= 0:
        return []
    budget = max(budget, 16.0)
    n = int(math.ceil(prefill / budget - 1e-9))
    last = prefill - (n - 1) * budget
    return [budget] * (n - 1) + [last]


def steady_state(shape: Shape, cal: Calibration, *, prompt: float, output: float, hit: float,
                 max_batched_tokens: int, max_seqs: int, kv_tokens: float, block_size: int = 16,
                 clients: float | None = None, rate: float | None = None,
                 tokens_per_step: float = 1.0, tokens_per_seq: float = 1.0) -> Operating:
    """Closed loop (`clients`) or open loop (`rate` in req/s) steady state.

    `tokens_per_step`: output tokens a decoding request gains per step (speculative decoding:
    the expected accepted length; 1 without), `tokens_per_seq`: tokens each decoding request
    puts through the model per step (1 + k when verifying k drafts).
    """
    prompt_new = prompt * (1.0 - hit)
    out = max(output, 1.0)
    # KV slots: the resident tokens of a request average prompt + half its output over its life
    footprint = prompt_new + out / 2.0 + block_size / 2.0
    shared = prompt * hit
    kv_slots = max((kv_tokens - shared) / footprint, 0.0)
    capacity = max(min(float(max_seqs), kv_slots), 0.0)
    if capacity < 1.0:
        return Operating(math.inf, math.inf, 0.0, 0.0, math.inf, 0.0, capacity, math.inf, math.inf, True)
    ctx = prompt + out / 2.0
    steps_out = max((out - 1.0) / tokens_per_step, 0.0)   # decode steps after the first token
    n = min(clients, capacity) if clients is not None else 1.0
    tbar = step_time_shape(shape, cal, n, n * ctx, 0.0, tokens_per_seq=tokens_per_seq)
    ttft = prefill = wait_p = tail = 0.0
    x = 0.0
    saturated = False
    for _ in range(60):
        r_own = ttft + steps_out * tbar
        saturated = False
        if rate is not None:
            x = rate
            n_new = rate * r_own
            if n_new >= capacity:
                saturated = True
                n_new = capacity
        else:
            x = n / max(r_own, 1e-9)
            n_new = min(clients, capacity)
        b = max(n_new * (steps_out * tbar) / max(r_own, 1e-9), min(n_new, 1.0)) if r_own > 0 else n_new
        t_d = step_time_shape(shape, cal, b, b * ctx, 0.0, tokens_per_seq=tokens_per_seq)
        done = 0.0
        extra = 0.0
        prefill = 0.0
        chunks = _chunks(prompt_new, max_batched_tokens - b * tokens_per_seq)
        for c in chunks:
            t_p = step_time_shape(shape, cal, b, b * ctx, c, shared + done, tokens_per_seq=tokens_per_seq)
            prefill += t_p
            extra += t_p - t_d
            done += c
        # time accounting of continuous batching: every decode step costs t_d, and each request
        # adds `extra` once (its prefill chunks riding in decode steps). Closed loop: each of the
        # n - 1 other clients prefills once per cycle r = ttft + a * tbar, and a request's own
        # prefill is in its TTFT, never between its tokens, so tbar * (1 - (n - 1) * extra / r) =
        # t_d is a quadratic in tbar (a lone client decodes at t_d).
        a = steps_out
        if rate is None and a > 0:
            others = max(n_new - 1.0, 0.0)
            q = ttft - others * extra - a * t_d
            tbar_new = (-q + math.sqrt(q * q + 4.0 * a * t_d * ttft)) / (2.0 * a) if ttft > 0 \
                else max(t_d + others * extra / a, t_d)
        else:
            tbar_new = t_d / (1.0 - min(x * extra, 0.95))
        xr = x if rate is not None else n_new / max(ttft + a * tbar_new, 1e-9)
        # A lone request (under two in the system) finds the engine idle: no other request's
        # chunks share its prefill steps and no step is under way when it arrives, so its TTFT is
        # its prefill and the step that emits the first token, not the busy server's
        # ttft_prefill_factor and ttft_steps (fitted where four or more clients run). Blended up
        # to two in the system. Public single-stream runs on GPUs no factor was fitted on: an
        # A100 16k-token AWQ prefill 4.58 s -> 3.08 s (3.35 measured), a 4090 2k prefill +89 ->
        # +24 %, a 30-token prompt on a 4090 37 -> 15 ms (14)
        busy = min(max(n_new - 1.0, 0.0), 1.0)
        own = len(chunks) * t_d + (1.0 + busy * (cal.ttft_prefill_factor - 1.0)) * extra
        steps_first = min(cal.ttft_steps, 1.0) + busy * max(cal.ttft_steps - 1.0, 0.0)
        if rate is None:
            # closed loop with fixed lengths: clients that started together finish together, so
            # arrivals cluster and the prefills ahead of a new request grow with the number of
            # clients, not with utilisation (fitted share `queue_factor` of them is ahead)
            wait_p = cal.queue_factor * max(n_new - 1.0, 0.0) * own
        else:
            rho = xr * own  # Poisson arrivals: M/D/1 wait behind other prefills
            if rho >= 0.95 or x * extra >= 0.95:
                saturated = True  # prefill work alone fills the GPU: the queue grows
            rho = min(rho, 0.95)
            wait_p = rho / (2.0 * (1.0 - rho)) * own
        tail = _wait_p99(wait_p, rho if rate is not None else None)
        ttft_new = cal.ttft_fixed_s + steps_first * tbar_new + own + wait_p
        conv = abs(tbar_new - tbar) < 1e-7 * tbar and abs(ttft_new - ttft) < 1e-7 * max(ttft, 1e-9)
        tbar = 0.5 * tbar + 0.5 * tbar_new
        ttft = 0.5 * ttft + 0.5 * ttft_new
        n = n_new
        if conv:
            break
    r_own = ttft + steps_out * tbar
    queue = 0.0
    stall = 0.0
    if clients is not None:
        if clients > capacity:
            # more clients than the pool holds: by Little's law each request spends
            # (clients/capacity - 1) x r_own waiting in all. V1 admits a request once its prompt's
            # blocks are free and later preempts (recompute) the newest when decodes outgrow the
            # pool, so that wait splits: the prompt's share of the footprint before the first
            # token, the output's share as stalls between tokens.
            # When max_num_seqs is the limit, nothing is preempted and all of it is before the
            # first token.
            total_wait = (clients / capacity - 1.0) * r_own
            before = 1.0
            if kv_slots < max_seqs:
                # V1 admits by blocks, not requests: a waiting request starts once the blocks
                # of its prompt are free (`allocate_slots` for its first chunk), and decodes
                # that outgrow the pool preempt the newest running request, which has had its
                # first token (v1/core/sched/scheduler.py). So a client waits before its first
                # token only for the part of the excess demand its prompt alone cannot fit in:
                # (clients x prompt - pool) of (clients x footprint - pool), in tokens
                demand_prompt = clients * (prompt_new + block_size) - (kv_tokens - shared)
                demand_all = clients * footprint - (kv_tokens - shared)
                before = min(max(demand_prompt / demand_all, 0.0), 1.0) if demand_all > 0 else 0.0
            # a preempted request goes back to the FRONT of the queue and is re-admitted as soon
            # as blocks free up, so its stalls cannot exceed what the running set's own decode
            # takes (one step's worth per output token); past that bound the overload is
            # clients waiting for their first admission (the c=512 sweeps: TTFT of minutes,
            # clean TPOT)
            stall = min((1.0 - before) * total_wait, STALL_BOUND_STEPS * steps_out * tbar)
            queue = total_wait - stall
            saturated = True
        x = min(clients, capacity) / r_own
    elif saturated:
        queue = math.inf
        x = min(x, capacity / r_own)  # what the replica completes while the queue grows
    tpot = (tbar + (stall / steps_out if steps_out > 0 else 0.0)) / tokens_per_step
    # p99: the prefill-queue tail, and when clients queue for a slot, the last of them waits about
    # twice the mean (uniform spread of positions in the queue)
    p99 = ttft - wait_p + tail + 2.0 * queue
    return Operating(ttft_s=ttft + queue, tpot_s=tpot, requests_per_s=x,
                     output_tokens_per_s=x * out, step_time_s=tbar, running=n,
                     capacity=capacity, queue_wait_s=queue, prefill_s=prefill, saturated=saturated,
                     ttft_p99_s=p99)


def _wait_p99(mean_wait: float, rho: float | None) -> float:
    """99th percentile of the wait behind other prefills.

    Open loop (M/D/1): a request waits with probability ~rho, and the wait of those that do is
    close to exponential with mean mean_wait/rho, so P(W > t) ~ rho exp(-t rho / mean_wait).
    Closed loop (clustered arrivals): the last of a cluster waits about twice the mean."""
    if mean_wait <= 0:
        return 0.0
    if rho is None:
        return 2.0 * mean_wait
    if rho <= 0.01:
        return 0.0
    return mean_wait / rho * math.log(rho / 0.01)


# ---------------------------------------------------------------------------------------------
# From a Setup (architecture x GPU x engine flags) to a Shape


_FP8_SCHEMES = ("fp8", "w8a8", "int8")
_FP4_SCHEMES = ("nvfp4", "fp4", "mxfp4")


def compute_dtype(setup: Any) -> str:
    """The GEMM input format vLLM runs for this weight scheme on this GPU: fp8 schemes use FP8
    tensor cores where the GPU has them; FP4 weights run FP4 GEMMs only where the GPU has FP4
    tensor cores (Blackwell), otherwise they are dequantised to 16-bit (Marlin/Triton), like
    w4a16/AWQ/GPTQ. MXFP4 experts (gpt-oss) take FP8 activations there, not FP4 ones: FlashInfer's
    MXFP4 x MXFP8 MoE, which vLLM's recipe turns on for Blackwell
    (VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, recipes models/openai/gpt-oss-120b.yaml, and every
    InferenceMAX B200 run), so their math runs at the FP8 rate. The layers a checkpoint leaves in
    the model dtype run 16-bit GEMMs whatever this says (`Shape.wide_flops_per_token`)."""
    q = setup.quantization
    if q == "mxfp4" and setup.gpu.fp4_tflops > 0 and setup.gpu.fp8_tflops > 0:
        return "fp8"
    if q in _FP4_SCHEMES and setup.gpu.fp4_tflops > 0:
        return "fp4"
    if q in _FP8_SCHEMES and setup.gpu.fp8_tflops > 0:
        return "fp8"
    return "bf16"


# An FP8 KV cache halves the pool's bytes per token (twice the tokens fit) but not the time
# decode attention spends per cached token: the kernels dequantize every K/V element to the
# compute dtype in registers (FlashInfer/FlashAttention paged decode), so a token costs what a
# BF16 one does. 1.0 = as slow as the model dtype's bytes, 0.5 = bandwidth-bound on the FP8
# bytes. Measured on aiconfigurator's rows, whose harness runs every FP8/NVFP4 deployment with an
# FP8 cache (its generator: FP8 KV for fp8/fp8_block/nvfp4 checkpoints, aiconfigurator_core
# sdk/models/helpers.py): with the pool FP8 and the reads at 0.5, TPOT 15.2 % on 832 B200/H200
# rows, at 0.75 14.1 %, at 1.0 13.6 %, at 1.25 13.7 %; every family moves the same way
# (Llama-3.1-70B H200 10.7 -> 5.2 %, MiniMax-M2.5 NVFP4 B200 20.9 -> 15.0 %, Llama-3.1-70B NVFP4
# B200 14.0 -> 9.4 %). Chosen there, so not held out for it; the shared table (the same harness)
# agrees: 8.0 -> 5.9 % at 1.0.
FP8_KV_READ_COST = 1.0


def _kv_read_bytes(setup: Any, kind: str = "full") -> float:
    """Time-equivalent KV bytes decode attention reads per token in one layer of `kind`: the
    stored bytes for a cache in the model dtype, the model dtype's bytes times FP8_KV_READ_COST
    for a narrower one."""
    from exporter.model import kv_cache as kvc
    stored = kvc.token_bytes_per_layer(setup, kind)
    if setup.kv_cache_dtype == "auto" or setup.kv_dtype_bytes >= setup.dtype_bytes:
        return float(stored)
    wide = kvc.token_bytes_per_layer(replace(setup, kv_cache_dtype="auto"), kind)
    return FP8_KV_READ_COST * wide


def _wide_params_on_rank(setup: Any) -> float:
    """Linear parameters on one TP rank (routed experts and lm_head aside) that the checkpoint
    keeps in the model dtype: every dense layer under MXFP4 (it quantizes only the routed
    experts), else the parts `unquantized_parts` names."""
    from exporter.model.architectures import unquantized_parts
    m, tp = setup.model, setup.tp
    linear, experts, _ = m.layer_params()
    rep = m.replicated_linear_params()
    if setup.quantization == "mxfp4":
        keep, rep_keep = linear - experts, rep
    else:
        parts = unquantized_parts(m, setup.quantization)
        keep = m.unquantized_linear_params(parts)
        rep_keep = rep if "attention" in parts else 0
    return (keep - rep_keep) / tp + rep_keep


@lru_cache(maxsize=4096)
def shape_for(setup: Any) -> Shape:
    """Precompute the per-GPU bytes and FLOPs of `setup` (cached: setups are frozen)."""
    from exporter.model import kv_cache as kvc
    from exporter.model.architectures import CHUNKED, FULL, SLIDING

    m, tp, pp = setup.model, setup.tp, setup.pp
    native = setup.dtype_bytes
    # the bytes a step streams: the MXFP4 experts as the checkpoint holds them, not the Marlin
    # layout's padded allocation (2880 -> 3072 wide): vLLM's default MXFP4 MoE backend on Hopper
    # (Triton, triton_kernels installed) pads the per-rank intermediate size to 64 only and not the
    # hidden size (mxfp4.py create_weights), and the padded rows read as zeros cost nothing the
    # shared gpt-oss rows show (TPOT 9.0 % streaming the padding, 7.1 % without)
    weights = sum(kvc.weights_bytes(setup, s, padded=False) for s in range(pp))
    # the input embedding is a gather, not a read of the whole table; the rotary cache is tiny reads
    emb = m.vocab_size * m.hidden_size * native / tp
    if not m.tie_word_embeddings:
        weights -= emb
    weights -= m.rope_cache_size * native
    # so is the Per-Layer Embedding table's (Gemma 3n, Gemma 4 E models): each token gathers its row
    weights -= m.ple_embedding_params * native / tp
    _, experts, other = m.layer_params()
    expert_bytes = 0.0
    if m.is_moe and experts:
        # the dense part as kv_cache.weights_bytes counts it; the rest is routed-expert weight,
        # read only for experts some token picks
        dense_part = kvc.dense_linear_bytes(setup) + other * native + emb  # emb: the lm_head
        expert_bytes = max(weights - dense_part, 0.0)
    dense = max(weights - expert_bytes, 0.0)
    # --cpu-offload-gb: those bytes leave the HBM read for the host link's
    host = [kvc.offloaded_bytes(setup, s) for s in range(pp)]
    host_experts = sum(e for _, e in host)
    host_dense = sum(b for b, _ in host) - host_experts
    dense = max(dense - host_dense, 0.0)
    expert_bytes = max(expert_bytes - host_experts, 0.0)
    flop_params = (m.active_params - m.ple_embedding_params
                   - (m.embedding_params if not m.tie_word_embeddings else 0))
    types = m.layer_types or tuple(["full"] * m.num_layers)
    n_swa = sum(1 for t in types if t in (SLIDING, CHUNKED))
    n_state = m.state_layers
    n_full = m.attention_layers - n_swa     # full-context attention: neither windowed nor recurrent/MLP-only
    # the KV bytes decode attention reads per token, at what an FP8 cache costs in time, and the
    # width of QK^T plus PV per head (a layer kind may have its own shape: Gemma 4's full layers)
    windowed = [t for t in types if t in (SLIDING, CHUNKED)]
    heads = m.num_heads / tp
    if m.attention == "mla":
        full_dim = swa_dim = (2 * m.kv_lora_rank + m.qk_rope_head_dim) / 2.0  # absorbed MLA: latent QK + V
    else:
        full_dim = (m.kv_shape(FULL).head_dim + m.kv_shape(FULL).v_head_dim) / 2.0
        swa_dim = sum((m.kv_shape(t).head_dim + m.kv_shape(t).v_head_dim) / 2.0 for t in windowed) / max(n_swa, 1)
    window = m.sliding_window or m.attention_chunk_size or 1
    cd = compute_dtype(setup)
    gpu = setup.gpu
    swa_bytes = sum(_kv_read_bytes(setup, t) for t in windowed)
    q = setup.quantization
    fmt = ("mxfp4" if q in _FP4_SCHEMES else "fp8" if q in _FP8_SCHEMES
           else "int4" if q in ("gptq", "awq", "w4a16", "w8a16", "gptq-int8") else "bf16")
    # vLLM's custom all-reduce (one shot over NVLink/P2P) is off on more than two PCIe-only GPUs
    # ("Custom allreduce is disabled because it's not supported on more than two PCIe-only
    # GPUs", distributed/device_communicators/custom_all_reduce.py); NCCL's ring then pays a
    # latency per hop
    cls = gpu_class(gpu.name, gpu.vendor)
    link = str(getattr(gpu, "interconnect", "") or "")
    hops = 1.0 if (link.startswith(("NVLink", "Infinity")) or tp <= 2) else float(tp - 1)
    return Shape(
        dense_weight_bytes=dense,
        expert_weight_bytes=expert_bytes,
        n_experts=m.num_experts if m.is_moe else 0,
        experts_per_token=m.experts_per_token if m.is_moe else 0,
        # replicated GEMMs (MLA down-projections) run whole on every rank
        flops_per_token=2.0 * (flop_params / tp + m.replicated_linear_params() * (1.0 - 1.0 / tp)),
        kv_bytes_per_ctx_token=_kv_read_bytes(setup, FULL) * n_full,
        swa_kv_bytes_per_token=swa_bytes,
        swa_window=window,
        state_bytes_per_seq=n_state * setup.state_bytes(),
        attn_flops_per_ctx_token=4.0 * heads * full_dim * n_full,
        swa_attn_flops_per_ctx_token=4.0 * heads * swa_dim * n_swa,
        n_layers=m.num_layers,
        tp=tp,
        allreduce_bytes_per_token=m.hidden_size * 2.0,
        bw_bytes_per_s=gpu.hbm_bandwidth_tbps * 1e12,
        peak_flops=gpu.tflops(cd) * 1e12,
        link_bytes_per_s=max(gpu.interconnect_gbps, 1.0) / 2.0 * 1e9,
        compute_dtype=cd,
        gpu_name=gpu.name,
        gpu_vendor=gpu.vendor,
        expert_kernel_eff=MOE_FORMAT_EFF_BY_CLASS.get((cls, fmt), MOE_FORMAT_EFF[fmt]),
        moe_floor_s=(MOE_LAYER_FLOOR_S.get(fmt, 0.0) + MOE_LAYER_BY_CLASS_S.get((cls, q), 0.0))
        * len(m.moe_layers) if m.is_moe else 0.0,
        mla_floor_s=MLA_LAYER_S * m.attention_layers if m.attention == "mla" else 0.0,
        moe_token_s=(MOE_TOKEN_LAYER_FUSED_S if (cls, fmt) in MOE_OVERLAPPED else MOE_TOKEN_LAYER_S)
        * len(m.moe_layers) if m.is_moe else 0.0,
        expert_stream_bps=MOE_STREAM_CAP_TBPS.get((cls, fmt), 0.0) * 1e12,
        sort_vocab=float(m.vocab_size) if getattr(m, "sampling_sorts", False) else 0.0,
        allreduce_hops=hops,
        eager_launch_s=EAGER_LAYER_LAUNCH_S * m.num_layers if setup.enforce_eager else 0.0,
        head_flops_per_token=2.0 * m.vocab_size * m.hidden_size / tp,
        expert_flops_per_token=(2.0 * experts * m.experts_per_token / m.num_experts / tp
                                if m.is_moe and experts and (cls, fmt) not in MOE_OVERLAPPED else 0.0),
        activation_width_m=m.activation_width / 1e6,
        wide_flops_per_token=2.0 * _wide_params_on_rank(setup) if cd != "bf16" else 0.0,
        wide_peak_flops=gpu.tflops("bf16") * 1e12 if cd != "bf16" else 0.0,
        host_weight_bytes=host_dense, host_expert_bytes=host_experts,
        host_bytes_per_s=gpu.host_read_bytes_per_s,
    )


def step_time_s(setup: Any, *, decode_seqs: int, decode_context_tokens: int, prefill_tokens: int,
                prefill_context_tokens: int = 0,
                prefill_chunks: Sequence[tuple[float, float]] = (),
                calibration: Calibration | None = None) -> float:
    """Seconds one vLLM engine step takes on `setup`.

    decode_seqs requests each generate one token, attending over `decode_context_tokens` tokens in
    total; `prefill_tokens` prompt tokens (one or more chunks) are computed in the same step,
    attending over `prefill_context_tokens` tokens already in the cache (prefix hits, earlier
    chunks); `prefill_chunks` gives each request's (tokens, cached context) when there are
    several. `calibration`: fitted factors instead of the GPU class's (`predict`'s). Cheap: the
    per-setup work is cached."""
    if calibration is not None:
        return step_time_shape(shape_for(setup), calibration, decode_seqs, decode_context_tokens,
                               prefill_tokens, prefill_context_tokens, prefill_chunks=prefill_chunks)
    last = _LAST_STEP_SETUP
    if last and last[0] is setup:  # the simulator asks about the same setup every step:
        shape, cal = last[1], last[2]  # skip hashing the nested dataclasses
    else:
        shape = shape_for(setup)
        cal = calibration_for(shape.gpu_name, shape.gpu_vendor)
        _LAST_STEP_SETUP[:] = [setup, shape, cal]
    return step_time_shape(shape, cal, decode_seqs, decode_context_tokens, prefill_tokens,
                           prefill_context_tokens, prefill_chunks=prefill_chunks)


_LAST_STEP_SETUP: list = []


# ---------------------------------------------------------------------------------------------
# Public prediction


@dataclass(frozen=True)
class Prediction:
    """Steady-state latency and throughput of one replica at a load point.

    `saturated` means the load exceeds what the replica can run at once: at a fixed concurrency
    the excess clients queue (their wait is in ttft_s); at an arrival rate the queue grows without
    bound and ttft_s is infinite (JSON: null)."""

    ttft_s: float
    tpot_s: float
    output_tokens_per_s: float
    requests_per_s: float
    step_time_s: float
    kv_limited_concurrency: float   # requests of this traffic's size the KV pool holds at once
    max_running: float              # min(max_num_seqs, kv_limited_concurrency)
    running: float                  # mean requests running
    queue_wait_s: float
    saturated: bool
    binding: str                    # what caps the running batch: "max_num_seqs" | "KV capacity"
    spec_tokens_per_step: float = 1.0
    ttft_p99_s: float = math.inf    # tail of the prefill queue (what a p99 SLO is checked against)

    def as_dict(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return None if v is None or math.isinf(v) or math.isnan(v) else round(v, 6)
        return {"ttft_s": num(self.ttft_s), "ttft_p99_s": num(self.ttft_p99_s), "tpot_s": num(self.tpot_s),
                "output_tokens_per_s": num(self.output_tokens_per_s),
                "requests_per_s": num(self.requests_per_s), "step_time_s": num(self.step_time_s),
                "kv_limited_concurrency": num(self.kv_limited_concurrency),
                "max_running": num(self.max_running), "running": num(self.running),
                "queue_wait_s": num(self.queue_wait_s), "saturated": self.saturated,
                "binding": self.binding, "spec_tokens_per_step": round(self.spec_tokens_per_step, 4)}


def tpot_floor_s(setup: Any, *, prompt_tokens: float, output_tokens: float, concurrency: float,
                 tpot_s: float, ttft_s: float | None = None) -> float:
    """The least mean TPOT `setup`'s GPU can deliver a closed loop of `concurrency` clients
    sending these lengths, at the request rate the measured latencies themselves imply; 0.0 where
    no bound is drawn (pipeline or data parallel, a single output token, no KV pool).

    No model factor is used, only the datasheet, at 100 % of it: each step reads the dense weights
    (of an MoE layer's experts, only the top-k one token picks) and the running requests' KV
    (stored at one byte per element, whatever the cache dtype; attention's math left out), and
    runs the GEMMs of its decode tokens and of the other clients' prompts (Little's law:
    concurrency / (TTFT + (output - 1) x TPOT) requests per second, each with `prompt_tokens` to
    compute; a request's own prompt is before its first token), the GEMMs no faster than the
    longer of their weight read and their math at peak.
    A measured TPOT under this was not the work the row states: a cached prefix, shorter prompts,
    or fewer requests in flight than its concurrency. A speculative setup may emit up to 1 + k
    tokens a step, so its floor is divided by that."""
    if setup.pp > 1 or setup.dp > 1 or output_tokens <= 1 or tpot_s <= 0 or concurrency < 1:
        return 0.0
    shape = shape_for(setup)
    pool = kv_tokens_for(setup)
    if pool <= 0 or shape.peak_flops <= 0 or shape.bw_bytes_per_s <= 0:
        return 0.0
    per_token = shape.flops_per_token - shape.head_flops_per_token   # a prompt token skips the lm_head
    if ttft_s is None or ttft_s <= 0:
        ttft_s = prompt_tokens * per_token / shape.peak_flops        # its own prefill, at peak
    rate = concurrency / (ttft_s + (output_tokens - 1.0) * tpot_s)
    # a request's tokens wait on the other clients' prompts, its own came before its first token
    others_rate = rate * (concurrency - 1.0) / concurrency
    prefill_share = others_rate * prompt_tokens * per_token / shape.peak_flops
    if prefill_share >= 1.0:
        return math.inf        # the prompts alone need more than the GPU's peak
    ctx = prompt_tokens + output_tokens / 2.0
    running = min(concurrency, float(setup.max_num_seqs), pool / ctx)
    wide = shape_for(replace(setup, kv_cache_dtype="auto")).kv_bytes_per_ctx_token
    kv_read = running * ctx * wide / max(setup.dtype_bytes, 1) / shape.bw_bytes_per_s
    decode_math = running * shape.flops_per_token / shape.peak_flops
    # every step reads the dense weights and, per MoE layer, at least the top-k experts one token picks
    weights = shape.dense_weight_bytes + (shape.expert_weight_bytes * shape.experts_per_token / shape.n_experts
                                          if shape.n_experts else 0.0)
    floor = max((weights / shape.bw_bytes_per_s + kv_read),
                (kv_read + decode_math) / (1.0 - prefill_share))
    k = setup.speculative.num_speculative_tokens if setup.speculative else 0
    return floor / (1.0 + k)


@lru_cache(maxsize=4096)
def kv_tokens_for(setup: Any) -> float:
    """Token slots of the KV pool (what `kv_capacity` predicts vLLM logs); 0 if nothing fits."""
    from exporter.model.kv_cache import kv_capacity
    try:
        cap = kv_capacity(setup, check_fits=False)
    except InputError:
        return 0.0
    return float(max(cap.tokens, 0))


def kv_pool_tokens(setup: Any, calibration: Calibration | None = None) -> float:
    """KV tokens the server holds: the predicted pool, scaled by a calibration that fitted it
    (`kv_capacity_scale`, 1 a priori)."""
    return kv_tokens_for(setup) * (calibration.kv_capacity_scale if calibration is not None else 1.0)


def predict(setup: Any, traffic: Any, *, concurrency: float | None = None,
            rate: float | None = None, spec: Any = None,
            calibration: Calibration | None = None) -> Prediction:
    """Latency and throughput of `setup` under `traffic`.

    concurrency: closed loop (that many clients, each sending its next request when the last one
    finished; TTFT includes waiting for a slot when they exceed what fits). rate: open loop
    (requests/s). Neither: the traffic's own concurrency or rate, else one client.
    spec: an optional `spec_decode.SpecConfig` (tokens gained and verified per step); the
    traffic's observed acceptance only describes the drafts, whether speculation runs is this.
    calibration: factors fitted to measurements (`exporter.model.calibrate`) instead of the GPU
    class's a-priori ones.
    """
    if concurrency is None and rate is None:
        concurrency = traffic.concurrency
        rate = traffic.arrival_rate_rps if concurrency is None else None
        if concurrency is None and rate is None:
            concurrency = 1
    if concurrency is not None and concurrency < 1:
        raise InputError(f"concurrency must be >= 1 (got {concurrency})")
    if rate is not None and rate <= 0:
        raise InputError(f"rate must be > 0 requests/s (got {rate})")
    shape = shape_for(setup)
    cal = calibration or calibration_for(shape.gpu_name, shape.gpu_vendor)
    per_step, per_seq = 1.0, 1.0
    if spec is not None and getattr(spec, "num_tokens", 0) > 0:
        per_step, per_seq = spec.expected_tokens, 1.0 + spec.num_tokens
    kv_tokens = kv_pool_tokens(setup, cal)
    op = steady_state(shape, cal, prompt=traffic.prompt_tokens_mean, output=traffic.output_tokens_mean,
                      hit=traffic.prefix_hit_ratio, max_batched_tokens=setup.max_num_batched_tokens,
                      max_seqs=setup.max_num_seqs, kv_tokens=kv_tokens, block_size=setup.block_size,
                      clients=None if concurrency is None else float(concurrency), rate=rate,
                      tokens_per_step=per_step, tokens_per_seq=per_seq)
    kv_conc = kv_slots(traffic, kv_tokens, setup.block_size)
    binding = "KV capacity" if kv_conc < setup.max_num_seqs else "max_num_seqs"
    return Prediction(ttft_s=op.ttft_s, tpot_s=op.tpot_s, output_tokens_per_s=op.output_tokens_per_s,
                      requests_per_s=op.requests_per_s, step_time_s=op.step_time_s,
                      kv_limited_concurrency=kv_conc, max_running=op.capacity, running=op.running,
                      queue_wait_s=op.queue_wait_s, saturated=op.saturated, binding=binding,
                      spec_tokens_per_step=per_step, ttft_p99_s=op.ttft_p99_s)


def kv_slots(traffic: Any, kv_tokens: float, block_size: int = 16) -> float:
    """Requests of this traffic's mean size that the KV pool holds at once (time-averaged
    footprint: the new prompt plus half the output, shared prefixes counted once)."""
    prompt_new = traffic.prompt_tokens_mean * (1.0 - traffic.prefix_hit_ratio)
    footprint = prompt_new + traffic.output_tokens_mean / 2.0 + block_size / 2.0
    return max((kv_tokens - traffic.prompt_tokens_mean * traffic.prefix_hit_ratio) / footprint, 0.0)
