"""The GPU product names other tools report, mapped onto our GPU catalog.

Why a module: DCGM's `modelName` (`NVIDIA H100 80GB HBM3`), GPU feature discovery's
`nvidia.com/gpu.product` node label (`NVIDIA-H100-80GB-HBM3`, `...-SHARED` when time-sliced,
`...-MIG-1g.10gb` for a MIG slice), GKE's `cloud.google.com/gke-accelerator` (`nvidia-l4`) and
amd-smi (`AMD Instinct MI300X`) all name the same cards differently. There is one lookup for all of
them, `exporter.model.gpus.find_gpu`; this is its telemetry-facing name. A MIG slice, an ambiguous
short name or an unknown card maps to None: never to a guess. Pure.
"""
from __future__ import annotations

from exporter.model.gpus import find_gpu


def catalog_gpu(product: str | None) -> str | None:
    """Our catalog name for a reported GPU product, or None when no row answers to it."""
    gpu = find_gpu(product)
    return gpu.name if gpu is not None else None
