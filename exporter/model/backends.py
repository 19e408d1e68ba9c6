"""Which kind of device a vLLM server runs on, from what the server itself exposes.

Why: vLLM also serves on CPUs, TPUs, Intel XPUs and Gaudi (HPU), and AWS Neuron. Those servers
export the same `vllm:` metrics, so KV pressure, preemptions and queueing are found as on a GPU, but
GPU-tier and $/hour findings compare against GPUs they are not and must not be raised. No vLLM
metric names the device; what does, in order of strength:

* a device name the operator or a tool gave (`targets[].gpu`, DCGM `modelName`, the node label):
  `TPU v5e`, `Intel Gaudi 3`, `cpu`, or a catalog GPU;
* the local tag of `/version` (vLLM's setup.py appends `+cpu`, `+tpu`, `+xpu`, `+gaudi...`,
  `+neuron...`, `+rocm...`, `+cu...` to source builds of non-default targets);
* a metric name carrying a backend word (`..._tpu_...`, `neuron`, `hpu`);
* `cache_config_info`: vLLM's CPU platform picks 128-token blocks when the user did not choose
  (`user_specified_block_size="False"`; CUDA and ROCm pick 16) and sizes the KV pool by a fixed
  byte count (`VLLM_CPU_KVCACHE_SPACE` / `--kv-cache-memory-bytes`, so `kv_cache_memory_bytes` is
  set) instead of profiling free GPU memory (`None` on GPUs unless the flag is given). Block 128
  alone is not enough: the CUTLASS MLA backend on Blackwell forces it too.

`/v1/models` carries nothing device-specific (checked on the real CPU captures), so it is not an
input. Pure.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from exporter.model.gpus import find_gpu, non_gpu_kind

OBSERVATION_ONLY = frozenset({"cpu", "tpu", "xpu", "hpu", "neuron"})
_GPU_KINDS = frozenset({"cuda", "rocm", "gpu"})
# vLLM setup.py: get_vllm_version() local version labels per target device
_LOCAL_TAG = (("cpu", "cpu"), ("tpu", "tpu"), ("xpu", "xpu"), ("gaudi", "hpu"), ("hpu", "hpu"),
              ("neuron", "neuron"), ("rocm", "rocm"), ("cu", "cuda"))
_METRIC_WORDS = {"tpu": "tpu", "neuron": "neuron", "neuroncore": "neuron", "hpu": "hpu", "gaudi": "hpu",
                 "habana": "hpu", "xpu": "xpu"}


@dataclass(frozen=True)
class Backend:
    """`kind`: cuda | rocm | gpu (a GPU, vendor not known) | cpu | tpu | xpu | hpu | neuron |
    unknown (no evidence either way: treated as a GPU, vLLM's common case). `evidence`: why."""

    kind: str
    evidence: tuple[str, ...] = ()

    @property
    def observation_only(self) -> bool:
        """No GPU-tier, $/hour or GPU step-time findings: only what the metrics show directly."""
        return self.kind in OBSERVATION_ONLY

    @property
    def is_gpu(self) -> bool | None:
        if self.kind in _GPU_KINDS:
            return True
        return False if self.kind in OBSERVATION_ONLY else None


def _from_version(version: str | None) -> tuple[str, str] | None:
    if not version or "+" not in version:
        return None
    tag = version.split("+", 1)[1].strip().lower()
    for prefix, kind in _LOCAL_TAG:
        if tag.startswith(prefix) and (prefix != "cu" or re.match(r"cu\d", tag)):
            return kind, f"/version {version!r}: local tag +{tag} is vLLM's {kind} build"
    return None


def _from_metrics(names: Iterable[str]) -> tuple[str, str] | None:
    if isinstance(names, frozenset):    # a scrape's family set (shared by a target's snapshots)
        return _from_metric_set(names)
    return _from_metric_list(names)


@functools.lru_cache(maxsize=256)
def _from_metric_set(names: frozenset[str]) -> tuple[str, str] | None:
    return _from_metric_list(sorted(names))


def _from_metric_list(names: Iterable[str]) -> tuple[str, str] | None:
    for name in names:
        for word in re.split(r"[^a-z0-9]+", name.lower()):
            if word in _METRIC_WORDS:
                return _METRIC_WORDS[word], f"metric {name!r} names the {_METRIC_WORDS[word]} backend"
    return None


def _from_cache_config(cfg: Mapping[str, str] | None) -> tuple[str, str] | None:
    if not cfg:
        return None
    chosen_by_vllm = cfg.get("user_specified_block_size") == "False"
    block = cfg.get("block_size")
    pool = cfg.get("kv_cache_memory_bytes")
    if not chosen_by_vllm:
        return None
    if block == "128" and pool not in (None, "", "None"):
        return "cpu", (f"cache_config_info: vLLM chose block_size 128 (CPU's default; GPUs get 16) and a "
                       f"fixed KV pool of {pool} bytes instead of profiling GPU memory")
    if block == "16":
        return "gpu", "cache_config_info: vLLM chose block_size 16, the CUDA/ROCm default"
    return None


def backend_of(*, version: str | None = None, metric_names: Iterable[str] = (),
               cache_config: Mapping[str, str] | None = None, device: str | None = None) -> Backend:
    """The backend a server runs on. `version`: `/version`'s string; `metric_names`: family names
    seen on `/metrics`; `cache_config`: the `vllm:cache_config_info` labels; `device`: a device name
    from configuration, DCGM or a node label. The strongest evidence wins."""
    if device and device.strip():
        kind = non_gpu_kind(device)
        if kind is not None:
            return Backend(kind, (f"device {device!r} is a {kind} device",))
        gpu = find_gpu(device)
        if gpu is not None:
            return Backend("rocm" if gpu.vendor == "amd" else "cuda" if gpu.vendor == "nvidia" else "gpu",
                           (f"device {device!r} is the catalog GPU {gpu.name}",))
    for found in (_from_version(version), _from_metrics(metric_names), _from_cache_config(cache_config)):
        if found is not None:
            return Backend(found[0], (found[1],))
    return Backend("unknown", ("nothing the server exposes names its device",))
