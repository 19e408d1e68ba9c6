"""`--enable-lora`: the stacked adapter buffers vLLM preallocates beside every linear layer, the
embedding and the lm_head (kv_cache.lora_bytes; lora/layers/*.py `create_lora_weights`, read in
the 0.11.0 and 0.15.0 wheels), counted with the weights because they exist before the profile.

Public startups nothing was fitted on:
- Llama-3.1-8B-Instruct, vLLM 0.8.2 (V1), one A100, `--enable-lora` with max_loras 2 and
  max_lora_rank 16 (the logged Namespace; a public blog post on the Gateway API inference
  extension, 2025): "Model loading took 15.1749 GB", where this model without LoRA logs 14.9889.
- Mistral-7B-Instruct-v0.2, vLLM 0.14.0, one RTX PRO 6000 Blackwell, `--enable-lora --max-loras 1
  --max-lora-rank 16 --max-model-len 4096 --gpu-memory-utilization 0.95 --max-num-seqs 256` (a
  public support report): "Model loading took 13.58 GiB", "GPU KV cache size: 622,464 tokens".
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.discovery.vllm_args import parse_vllm_args
from exporter.model.kv_cache import kv_capacity, lora_bytes
from exporter.model.setup import Setup

GIB = 2**30
MISTRAL = dict(model="mistralai/Mistral-7B-Instruct-v0.2", gpu="RTX-PRO-6000", vllm_version="0.14.0",
               max_model_len=4096, gpu_memory_utilization=0.95, max_num_seqs=256)


def test_public_startups_with_lora():
    llama = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="A100-40GB", vllm_version="0.8.2")
    with_lora = kv_capacity(Setup.build(**llama, max_loras=2, max_lora_rank=16))
    assert with_lora.memory.weights_gib == pytest.approx(15.1749, abs=0.01)
    assert with_lora.memory.weights_gib - kv_capacity(Setup.build(**llama)).memory.weights_gib == \
        pytest.approx(15.1749 - 14.9889, abs=0.01)
    mistral = kv_capacity(Setup.build(**MISTRAL, max_loras=1, max_lora_rank=16))
    assert mistral.memory.weights_gib == pytest.approx(13.58, abs=0.01)
    assert mistral.tokens == pytest.approx(622464, rel=0.01)


def test_the_buffers_follow_vllms_shapes():
    """Per Llama-3.1-8B layer at rank 16: qkv A 3 x 16 x 4096, B 6144 x 16; o A 16 x 4096, B 4096
    x 16; gate_up A 2 x 16 x 4096, B 28672 x 16; down A 16 x 14336, B 4096 x 16 (TP1), for each
    adapter, in bf16; plus the embedding's and the lm_head's."""
    setup = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", vllm_version="0.15.0",
                        max_loras=4, max_lora_rank=16)
    layer = 16 * (3 * 4096 + 6144 + 4096 + 4096 + 2 * 4096 + 28672 + 14336 + 4096)
    ends = 128256 * 16 + 4096 * 16 + 16 * 4096 + 128256 * 16       # no extra vocabulary from 0.15
    assert lora_bytes(setup) == (32 * layer + ends) * 4 * 2
    # TP splits the B of column layers and the A of row layers; --fully-sharded-loras the rest
    tp2 = setup.rebuilt(tp=2)
    assert lora_bytes(tp2) < lora_bytes(setup) < 2 * lora_bytes(tp2)
    assert lora_bytes(tp2.rebuilt(fully_sharded_loras=True)) < lora_bytes(tp2)
    assert lora_bytes(setup.rebuilt(max_loras=0)) == 0.0
    # the adapters' memory grows with both flags
    assert lora_bytes(setup.rebuilt(max_lora_rank=64)) == pytest.approx(4 * lora_bytes(setup))


def test_calc_and_the_daemon_take_the_flags():
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", MISTRAL["model"], "--gpu", "RTX-PRO-6000",
                          "--vllm-version", "0.14.0", "--max-model-len", "4096", "--enable-lora", "--max-loras", "4",
                          "--max-lora-rank", "32", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["setup"]["max_loras"], doc["setup"]["max_lora_rank"]) == (4, 32)
    four = lora_bytes(Setup.build(**{**MISTRAL, "max_loras": 4, "max_lora_rank": 32}))
    assert doc["memory"]["lora_gib"] == pytest.approx(four / GIB, abs=0.001)
    assert four > 7.5 * lora_bytes(Setup.build(**{**MISTRAL, "max_loras": 1, "max_lora_rank": 16}))
    # --max-loras alone does nothing: vLLM reads it only with --enable-lora
    plain = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", MISTRAL["model"], "--gpu",
                            "RTX-PRO-6000", "--max-loras", "4", "--json"], capture_output=True, text=True, timeout=60)
    assert "lora_gib" not in json.loads(plain.stdout)["memory"]
    hints = parse_vllm_args(["vllm", "serve", MISTRAL["model"], "--enable-lora", "--max-loras", "4",
                             "--max-lora-rank", "32"])
    assert (hints["enable_lora"], hints["max_loras"], hints["max_lora_rank"]) == (True, 4, 32)
    from exporter.config import TargetSpec
    from exporter.drift.predict import identify, server_flags
    ident = identify(TargetSpec(url="http://127.0.0.1:9/metrics", model=MISTRAL["model"], gpu="RTX-PRO-6000",
                                labels={"enable_lora": "true", "max_loras": "4", "max_lora_rank": "32"}),
                     MISTRAL["model"])
    assert (ident.max_loras, ident.max_lora_rank) == (4, 32)
