"""The daemon's prediction follows the server's own `enable_prefix_caching` (cache_config_info):
on a Mamba hybrid it decides how many state blocks a request holds, so how many requests fit."""
from __future__ import annotations

from exporter.drift.predict import ServerFlags, predict, resolve_hints
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup

MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def tokens(prefix_caching):
    flags = ServerFlags(gpu_memory_utilization=0.9, max_model_len=32768, vllm_version="0.32.0",
                        enable_prefix_caching=prefix_caching)
    p = predict(resolve_hints([MODEL], "H100"), flags, traffic={}, slo={}, prices={})
    return p.kv_cache_tokens


def test_prefix_caching_as_the_server_reports_it():
    default, off = tokens(None), tokens(False)
    assert default == tokens(True)           # 0.32's default for a hybrid: on ('align' mode)
    setup = Setup.build(MODEL, "H100", gpu_memory_utilization=0.9, max_model_len=32768, vllm_version="0.32.0")
    assert setup.enable_prefix_caching
    assert default == kv_capacity(setup).tokens
    assert off == kv_capacity(setup.with_(enable_prefix_caching=False)).tokens
    assert off > default                     # one state block per Mamba layer instead of three


def test_a_device_described_from_the_pool_counts_the_servers_prefix_caching():
    """A GPU hint with no catalog row is described from the server's KV pool: the memory that makes
    the model's predicted pool the observed one. On a hybrid the server's `enable_prefix_caching`
    decides the state blocks per request, and max_model_len how many tokens one request stands
    for, so the tokens a pool holds; the description must use the server's own flags and the
    pool's bytes per token (not the full-attention bytes per token), or the described device
    predicts another pool than the one observed."""
    from exporter.drift.inputs import DriftInput
    from exporter.drift.predict import Identity, described

    observed = 4_000_000.0
    for label in (True, False):
        ident = Identity(target="t", model_name=MODEL, resolved=resolve_hints([MODEL], "RTX-9090-96GB"),
                         device_hint="RTX-9090-96GB")
        assert ident.resolved.gpu is None                 # no catalog row: described from the pool
        x = DriftInput(target="t", model_name=MODEL, kv_cache_tokens=observed, gpu_memory_utilization=0.9,
                       max_model_len=32768.0, enable_prefix_caching=label)
        res = described(ident, x, "0.32.0")
        assert res.gpu is not None and res.gpu.unprofiled
        setup = Setup.build(res.model, res.gpu, gpu_memory_utilization=0.9, max_model_len=32768,
                            vllm_version="0.32.0", enable_prefix_caching=label)
        # memory is rounded to 0.1 GiB: the pool it predicts is the observed one within that
        assert abs(kv_capacity(setup, check_fits=False).tokens / observed - 1) < 0.01, label
