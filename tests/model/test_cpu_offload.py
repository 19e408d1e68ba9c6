"""`--cpu-offload-gb`: the weights vLLM keeps in pinned host memory (kv_cache.offloaded_bytes) and
the host link every step then reads them over (perf.Shape.host_*), as vLLM 0.11-0.15 do it
(model_executor/models/utils.py `maybe_offload_to_cpu`, called by `make_layers` on each decoder
layer in order: whole parameters move until the rank's budget is reached; with the V1 engine the
kernels read them in place through UVA)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.discovery.vllm_args import parse_vllm_args
from exporter.errors import InputError
from exporter.model.gpus import find_gpu
from exporter.model.kv_cache import kv_capacity, offloaded_bytes
from exporter.model.perf import predict
from exporter.model.setup import Setup
from exporter.model.traffic import Traffic

GIB = 2**30
LLAMA8 = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="RTX-4090", max_model_len=8192, vllm_version="0.11.0")


def test_whole_parameters_move_until_the_budget_is_reached():
    # a Llama-3.1-8B layer in bf16: qkv 4096 x 6144, o 4096 x 4096, gate_up 4096 x 28672, down
    # 14336 x 4096 -> 436,207,616 bytes; 4 GiB is crossed by the tenth layer's down_proj
    layer = 2 * 4096 * (6144 + 4096 + 28672 + 14336)
    moved, experts = offloaded_bytes(Setup.build(**LLAMA8, cpu_offload_gb=4))
    assert (moved, experts) == (10 * layer, 0.0)
    # 0.06 GiB: the qkv_proj of the first layer alone crosses it
    assert offloaded_bytes(Setup.build(**LLAMA8, cpu_offload_gb=0.04))[0] == 2 * 4096 * 6144
    # never more than the decoder layers hold: the embedding and lm_head stay on the GPU
    assert offloaded_bytes(Setup.build(**LLAMA8, cpu_offload_gb=100))[0] == 32 * layer
    # split over TP: each rank moves its own shards under the same per-GPU budget, crossed at the
    # twentieth layer's gate_up_proj
    assert offloaded_bytes(Setup.build(**{**LLAMA8, "gpu": "L4"}, tp=2, cpu_offload_gb=4))[0] == \
        pytest.approx((19 * layer + 2 * 4096 * (6144 + 4096 + 28672)) / 2)


def test_the_pool_grows_by_what_moved_and_a_model_too_big_fits():
    base = kv_capacity(Setup.build(**LLAMA8))
    off = kv_capacity(Setup.build(**LLAMA8, cpu_offload_gb=4))
    moved = offloaded_bytes(Setup.build(**LLAMA8, cpu_offload_gb=4))[0]
    assert (base.memory.weights_gib - off.memory.weights_gib) * GIB == pytest.approx(moved)
    assert (off.memory.kv_cache_gib - base.memory.kv_cache_gib) * GIB == pytest.approx(moved, rel=0.001)
    big = dict(model="Qwen/Qwen3-30B-A3B", gpu="RTX-4090", max_model_len=8192, vllm_version="0.11.0")
    with pytest.raises(InputError, match="the weights alone need"):
        kv_capacity(Setup.build(**big))
    assert kv_capacity(Setup.build(**big, cpu_offload_gb=40)).tokens > 0


def test_every_step_reads_the_offloaded_weights_over_the_host_link():
    """At batch 1 a step of a dense model reads every offloaded byte over the host link (an RTX
    4090: PCIe 4.0, 0.68 x 32 GB/s) instead of HBM: TPOT grows by about moved / 21.8 GB/s (4.36 GB:
    ~200 ms, single-digit tokens per second). An MoE model's offloaded experts are read only as far
    as the batch's tokens route to them."""
    tr = Traffic(prompt_tokens_mean=512, output_tokens_mean=256)
    link = find_gpu("RTX-4090").host_read_bytes_per_s
    assert link == pytest.approx(0.68 * 32e9)
    base = predict(Setup.build(**LLAMA8), tr, concurrency=1).tpot_s
    setup = Setup.build(**LLAMA8, cpu_offload_gb=4)
    moved = offloaded_bytes(setup)[0]
    slower = predict(setup, tr, concurrency=1).tpot_s - base
    hbm_saved = moved / (0.93 * find_gpu("RTX-4090").bandwidth_bytes_per_s)
    assert slower == pytest.approx(moved / link - hbm_saved, rel=0.05)
    moe = Setup.build("Qwen/Qwen3-30B-A3B", "RTX-4090", max_model_len=8192, vllm_version="0.11.0",
                      cpu_offload_gb=40)
    moved, experts = offloaded_bytes(moe)
    assert experts > 0.9 * moved
    tpot = predict(moe, tr, concurrency=1).tpot_s
    assert tpot < 0.5 * moved / link          # 8 of 128 experts a token: a fraction of them read
    assert predict(moe, tr, concurrency=64).tpot_s > 2 * tpot   # a batch touches most of them


def test_public_offloaded_runs():
    """vllm PR #6496 (the flag's own PR, vLLM 0.5.2): Meta-Llama-3-70B-Instruct on one GH200 with
    `--cpu-offload-gb 70 --gpu-memory-utilization 0.95` logged "Loading model weights took 61.2922
    GB" (GiB: 70.55 B x 2 bytes less 70 GiB) and ran ~4.1 tokens/s single stream over NVLink-C2C.
    A r/Vllm post ("35x performance tax"): Qwen2-7B on an RTX 4090, 56.87 tokens/s, 1.65 with
    `--cpu-offload-gb 20` (every layer offloaded). The link efficiency (gpus.HOST_LINK_EFFICIENCY)
    was chosen on the two speeds; the weights are the parameter walk's alone."""
    tr = Traffic(prompt_tokens_mean=128, output_tokens_mean=256)
    gh200 = Setup.build("meta-llama/Meta-Llama-3-70B-Instruct", "GH200-96GB", cpu_offload_gb=70,
                        gpu_memory_utilization=0.95, max_model_len=8192, vllm_version="0.5.2")
    assert kv_capacity(gh200).memory.weights_gib == pytest.approx(61.2922, abs=0.01)
    assert 1 / predict(gh200, tr, concurrency=1).tpot_s == pytest.approx(4.1, rel=0.12)
    qwen = dict(model="Qwen/Qwen2-7B-Instruct", gpu="RTX-4090", max_model_len=4096, vllm_version="0.6.0")
    assert 1 / predict(Setup.build(**qwen), tr, concurrency=1).tpot_s == pytest.approx(56.87, rel=0.05)
    offloaded = Setup.build(**qwen, cpu_offload_gb=20)
    assert offloaded_bytes(offloaded)[0] == pytest.approx(13.05e9, rel=0.01)   # every decoder layer
    assert 1 / predict(offloaded, tr, concurrency=1).tpot_s == pytest.approx(1.65, rel=0.05)


def test_calc_and_the_daemon_take_the_flag():
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", LLAMA8["model"], "--gpu", "RTX-4090",
                          "--max-model-len", "8192", "--cpu-offload-gb", "4", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["setup"]["cpu_offload_gb"] == 4.0
    assert doc["memory"]["cpu_offload_gib"] == pytest.approx(4.0625, abs=0.001)
    assert doc["memory"]["host_read_gbs"] == 21.8
    bad = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", LLAMA8["model"], "--gpu", "RTX-4090",
                          "--cpu-offload-gb", "-2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--cpu-offload-gb" in bad.stderr
    hints = parse_vllm_args(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--cpu-offload-gb", "4"])
    assert hints["cpu_offload_gb"] == 4.0
    from exporter.drift.predict import ServerFlags
    flags = ServerFlags(vllm_version=(0, 11, 0), cpu_offload_gb=hints["cpu_offload_gb"])
    setup = flags.build(Setup.build(**LLAMA8).model, find_gpu("RTX-4090"))
    assert setup.cpu_offload_gb == 4.0
