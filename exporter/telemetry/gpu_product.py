"""Mapping the GPU product names other tools report onto our GPU catalog.

Why: the same card is `NVIDIA-H100-80GB-HBM3` in the `nvidia.com/gpu.product` node label (GPU
feature discovery), `NVIDIA H100 80GB HBM3` in DCGM's `modelName` label, `nvidia-h100-80gb` in
GKE's `cloud.google.com/gke-accelerator`, and `H100-SXM-80GB` in our catalog. The catalog's own
alias lookup (`exporter.model.gpus.resolve_gpu`) ignores case and punctuation; this module first
removes what those tools add around the product name (vendor words, MIG profiles, the `-SHARED`
suffix of time-slicing). Pure.
"""
from __future__ import annotations

import re
from functools import lru_cache

from exporter.errors import CatalogError
from exporter.model.gpus import resolve_gpu

# GPU feature discovery: `<product>-MIG-1g.10gb` for MIG slices, `<product>-SHARED` for
# time-sliced GPUs (NVIDIA k8s-device-plugin docs, "gpu-feature-discovery" labels). A MIG slice
# has a fraction of the card's memory, so it maps to no catalog entry rather than the whole card.
_MIG = re.compile(r"(?i)[-_ ]MIG[-_ ]")
_SUFFIXES = re.compile(r"(?i)[-_ ]SHARED$")
_VENDOR_WORDS = re.compile(r"(?i)^(?:nvidia|amd|tesla|geforce)[-_ ]+")


@lru_cache(maxsize=256)
def catalog_gpu(product: str | None) -> str | None:
    """Our catalog name for a reported GPU product, or None when the catalog has no such card."""
    if not product or not product.strip():
        return None
    if _MIG.search(product):
        return None
    name = _SUFFIXES.sub("", product.strip())
    candidates = [name]
    stripped = name
    while (m := _VENDOR_WORDS.match(stripped)):
        stripped = stripped[m.end():]
        candidates.append(stripped)
    for candidate in candidates:
        try:
            return resolve_gpu(candidate).name
        except CatalogError:
            continue
    return None
