"""The daemon's prediction follows the server's own `enable_prefix_caching` (cache_config_info):
on a Mamba hybrid it decides how many state blocks a request holds, so how many requests fit."""
from __future__ import annotations

from exporter.drift.predict import predict, resolve_hints
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup

MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def tokens(prefix_caching):
    p = predict(resolve_hints([MODEL], "H100"), tp=1, pp=1, quantization=None, cache_dtype="auto",
                gpu_memory_utilization=0.9, max_model_len=32768.0, max_num_seqs=None,
                max_num_batched_tokens=None, block_size=None, vllm_version="0.32.0", traffic={}, slo={},
                prices={}, prefix_caching=prefix_caching)
    return p.kv_cache_tokens


def test_prefix_caching_as_the_server_reports_it():
    default, off = tokens(None), tokens(False)
    assert default == tokens(True)           # 0.32's default for a hybrid: on ('align' mode)
    setup = Setup.build(MODEL, "H100", gpu_memory_utilization=0.9, max_model_len=32768, vllm_version="0.32.0")
    assert setup.enable_prefix_caching
    assert default == kv_capacity(setup).tokens
    assert off == kv_capacity(setup.with_(enable_prefix_caching=False)).tokens
    assert off > default                     # one state block per Mamba layer instead of three
