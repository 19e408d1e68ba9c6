"""`backend_of`: which device a vLLM server runs on, from what it exposes, on the real captures of
vLLM 0.32 on CPU (tests/fixtures/vllm-cpu) and real GPU servers (../shared/fixtures/prom)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.model.backends import backend_of
from exporter.parse.canonical import parse_vllm

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"
CPU_CAPTURES = sorted(CPU.glob("*.prom"))


def _snapshot(path: Path):
    (snap,) = parse_vllm(path.read_bytes(), target="t", timestamp=0.0)
    return snap


@pytest.mark.parametrize("path", CPU_CAPTURES, ids=lambda p: p.name)
def test_real_cpu_server_is_recognised_as_observation_only(path):
    snap = _snapshot(path)
    version = json.loads((CPU / "version.json").read_text())["version"]   # "0.32.0": no local tag
    backend = backend_of(version=version, metric_names=snap.families, cache_config=snap.cache_config)
    assert backend.kind == "cpu" and backend.observation_only and backend.is_gpu is False
    assert "block_size 128" in backend.evidence[0]


def test_cpu_evidence_needs_both_signs():
    cfg = dict(_snapshot(CPU / "vllm-0.32.0-cpu-idle.prom").cache_config)
    # block 128 alone: CUTLASS MLA on Blackwell forces it too, so no verdict
    assert backend_of(cache_config={**cfg, "kv_cache_memory_bytes": "None"}).kind == "unknown"
    # the user chose 128: says nothing about the device
    assert backend_of(cache_config={**cfg, "user_specified_block_size": "True"}).kind == "unknown"
    # CUDA/ROCm's own choice
    assert backend_of(cache_config={**cfg, "block_size": "16", "kv_cache_memory_bytes": "None"}).kind == "gpu"


def test_real_gpu_servers_are_never_observation_only(captures):
    assert captures
    for name, body in captures.items():
        for snap in parse_vllm(body, target="t", timestamp=0.0):
            backend = backend_of(metric_names=snap.families, cache_config=snap.cache_config)
            assert not backend.observation_only, (name, backend)


@pytest.mark.parametrize("version, kind", [
    ("0.8.5+cpu", "cpu"), ("0.9.0+tpu", "tpu"), ("0.10.0+xpu", "xpu"), ("0.6.4+gaudi000", "hpu"),
    ("0.6.2+neuron214", "neuron"), ("0.9.2+rocm641", "rocm"), ("0.6.3+cu118", "cuda"),
    ("0.32.0", "unknown"), (None, "unknown"), ("0.11.0+custom", "unknown"),
])
def test_version_local_tags(version, kind):
    assert backend_of(version=version).kind == kind


@pytest.mark.parametrize("device, kind", [
    ("TPU v5e", "tpu"), ("tpu-v6e-slice", "tpu"), ("Intel Gaudi 3", "hpu"), ("HL-225 Gaudi2", "hpu"),
    ("AWS Trainium2", "neuron"), ("inf2", "neuron"), ("Intel Data Center GPU Max 1550", "xpu"), ("cpu", "cpu"),
    ("NVIDIA H100 80GB HBM3", "cuda"), ("AMD Instinct MI300X", "rocm"),
])
def test_device_names(device, kind):
    backend = backend_of(device=device, version="0.9.0+cu126")
    assert backend.kind == kind        # a named device outranks the build tag


def test_metric_names_with_a_backend_word():
    assert backend_of(metric_names=["vllm:num_requests_running", "vllm:tpu_hbm_usage_bytes"]).kind == "tpu"
    # process_cpu_seconds_total is on every server: "cpu" in a metric name is no evidence
    assert backend_of(metric_names=["process_cpu_seconds_total", "vllm:num_cpu_blocks"]).kind == "unknown"


@pytest.mark.parametrize("text", ["nightly", "nightly-5b8c30d62b754b57", "main", "latest"])
def test_a_main_branch_build_follows_the_newest_modelled_release(text):
    from exporter.model.setup import DEFAULT_VLLM_VERSION, parse_version
    assert parse_version(text) == DEFAULT_VLLM_VERSION
    with pytest.raises(Exception, match="cannot read"):
        parse_version("tuesday")
