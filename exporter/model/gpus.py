"""The GPU catalog: memory, bandwidth, throughput, interconnect and price of each tier.

Why a table: every capacity and speed prediction starts from these figures, and the daemon
compares tiers by them, so they live in one place with the source of each figure next to it.
Memory is what the driver reports to vLLM (`cudaMemGetInfo` total, GiB), not the nominal GB on
the box: that is the quantity `gpu_memory_utilization` multiplies. Throughput is dense (no
2:4 sparsity); 0 means the format has no tensor-core path on that GPU. Prices are default
on-demand $/GPU-hour and are meant to be overridden by configuration (`prices:`).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Mapping

from exporter.errors import CatalogError

GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator model, as seen by vLLM."""

    name: str
    vendor: str
    memory_gib: float            # total device memory as the driver/torch reports it
    hbm_bandwidth_tbps: float    # DRAM bandwidth, TB/s (1e12 B/s)
    bf16_tflops: float           # dense tensor throughput, TFLOPS
    fp16_tflops: float
    fp8_tflops: float
    fp4_tflops: float
    interconnect: str            # GPU-to-GPU link used for tensor parallelism
    interconnect_gbps: float     # GB/s per GPU, bidirectional, as vendors quote it
    dollars_per_hour: float      # default on-demand price per GPU
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tbps * 1e12

    @property
    def large_batch_defaults(self) -> bool:
        """vLLM's `get_batch_defaults` gives >=70 GiB GPUs whose name lacks "a100" the big
        defaults (max_num_seqs 1024, max_num_batched_tokens 8192 for the server)."""
        return self.memory_gib >= 70 and "a100" not in self.name.lower()

    def tflops(self, dtype: str) -> float:
        """Dense peak for a compute dtype, falling back to the next wider format it supports."""
        order = {"fp4": ("fp4", "fp8", "bf16", "fp16"), "fp8": ("fp8", "bf16", "fp16"),
                 "bf16": ("bf16", "fp16"), "fp16": ("fp16", "bf16")}
        key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp16",
               "mxfp4": "fp4", "nvfp4": "fp4", "int8": "fp8", "w8a8": "fp8"}.get(dtype, dtype)
        for candidate in order.get(key, ("bf16", "fp16")):
            value = getattr(self, f"{candidate}_tflops")
            if value > 0:
                return value
        return 0.0


_S_OOM = "torch OOM message 'GPU 0 has a total capacity of X GiB' quoted widely [unverified here]"
_S_FIX = "vLLM startup log, ../shared/fixtures/kv-capacity-observations.csv (gpu_mem_gib)"
_S_REF = "../shared/reference/perf-model.md section 6"

# name, vendor, memory GiB, TB/s, bf16, fp16, fp8, fp4 TFLOPS, link, link GB/s, $/h, aliases, sources
_TABLE: tuple[tuple, ...] = (
    ("T4", "nvidia", 14.75, 0.32, 0.0, 65.0, 0.0, 0.0, "PCIe Gen3 x16", 32.0, 0.59,
     ("T4-16GB", "Tesla-T4", "NVIDIA-T4"),
     {"memory": _S_OOM, "bandwidth": "NVIDIA T4 datasheet via " + _S_REF,
      "tflops": "NVIDIA T4 datasheet: 65 FP16 TFLOPS, no BF16/FP8 (vLLM runs it in fp16)",
      "price": "Modal $0.59 (techbytes May 2026 matrix) via " + _S_REF}),
    ("L4", "nvidia", 22.03, 0.30, 121.0, 121.0, 242.5, 0.0, "PCIe Gen4 x16", 64.0, 0.80,
     ("L4-24GB", "NVIDIA-L4"),
     {"memory": _S_OOM, "bandwidth": "NVIDIA L4 datasheet via " + _S_REF,
      "tflops": "L4 datasheet 242 FP16 / 485 FP8 with sparsity, halved for dense; " + _S_REF,
      "price": "Modal $0.80 (techbytes) via " + _S_REF}),
    ("A10G", "nvidia", 21.98, 0.60, 70.0, 70.0, 0.0, 0.0, "PCIe Gen4 x16", 64.0, 1.006,
     ("A10G-24GB", "A10", "A10-24GB"),
     {"memory": "g5.12xlarge OOM message (21.98 GiB) via " + _S_REF,
      "bandwidth": "Baseten A10 vs A10G comparison via " + _S_REF,
      "tflops": "commonly quoted A10G tensor figure [unverified]; " + _S_REF,
      "price": "AWS g5.xlarge $1.006/h us-east-1 (factualminds, Jun 2026) via " + _S_REF}),
    ("L40S", "nvidia", 44.39, 0.864, 362.05, 362.05, 733.0, 0.0, "PCIe Gen4 x16", 64.0, 1.95,
     ("L40S-48GB", "L40", "L40-48GB"),
     {"memory": _S_OOM + "; the reference's 44.99 is nominal",
      "bandwidth": "L40S datasheet (mullet.se copy) via " + _S_REF,
      "tflops": "L40S datasheet: BF16 362.05 dense, FP8 733 dense; " + _S_REF,
      "price": "Modal $1.95 (techbytes) via " + _S_REF}),
    ("A100-40GB", "nvidia", 39.39, 1.555, 312.0, 312.0, 0.0, 0.0, "NVLink 3", 600.0, 1.48,
     ("A100-40G", "A100-SXM4-40GB", "A100-PCIE-40GB"),
     {"memory": _S_OOM, "bandwidth": "NVIDIA A100 datasheet [unverified here]; " + _S_REF,
      "tflops": "A100 datasheet 312 BF16 dense; no FP8", "price": "Lambda $1.48 via " + _S_REF}),
    ("A100-80GB", "nvidia", 79.15, 2.039, 312.0, 312.0, 0.0, 0.0, "NVLink 3", 600.0, 2.50,
     ("A100", "A100-80G", "A100-SXM4-80GB", "A100-SXM-80GB", "A100-PCIE-80GB"),
     {"memory": _S_OOM, "bandwidth": "A100 80GB SXM datasheet 2.039 TB/s; " + _S_REF,
      "tflops": "A100 datasheet 312 BF16 dense", "price": "Modal $2.50 via " + _S_REF}),
    ("H100-SXM-80GB", "nvidia", 79.19, 3.35, 989.0, 989.0, 1979.0, 0.0, "NVLink 4", 900.0, 3.95,
     ("H100", "H100-80GB", "H100-SXM", "H100-SXM5-80GB", "H100-80GB-HBM3", "H100-SXM5"),
     {"memory": _S_FIX + " (79.19 GiB on an 'H100-80GB')",
      "bandwidth": "NVIDIA H100 SXM datasheet 3.35 TB/s; " + _S_REF,
      "tflops": "989 BF16 / 1,979 FP8 dense (3,958 with sparsity); lzwjava table via " + _S_REF,
      "price": "Modal $3.95 (techbytes) via " + _S_REF}),
    ("H100-PCIe-80GB", "nvidia", 79.19, 2.0, 756.0, 756.0, 1513.0, 0.0, "PCIe Gen5 x16", 128.0,
     2.86, ("H100-PCIe", "H100-PCIE-80GB"),
     {"memory": "assumed equal to H100 SXM (same 80 GB part) [unverified]",
      "bandwidth": "deploybase spec table 2.0 TB/s via " + _S_REF,
      "tflops": "NVIDIA H100 PCIe datasheet [unverified here]; " + _S_REF,
      "price": "Lambda $2.86 via " + _S_REF}),
    ("H200-SXM-141GB", "nvidia", 139.81, 4.8, 989.0, 989.0, 1979.0, 0.0, "NVLink 4", 900.0, 6.35,
     ("H200", "H200-141GB", "H200-SXM"),
     {"memory": "143,771 MiB (nvidia-smi, vllm-project/recipes#381) less the ~0.6 GiB the "
                "driver keeps, as on H100 (81,559 MiB -> 79.19 GiB) [derived]",
      "bandwidth": "NVIDIA H200 4.8 TB/s; " + _S_REF, "tflops": "same compute as H100 SXM",
      "price": "RunPod $6.35 via " + _S_REF}),
    ("B200-180GB", "nvidia", 178.35, 8.0, 2250.0, 2250.0, 4500.0, 9000.0, "NVLink 5", 1800.0,
     10.57, ("B200", "B200-192GB", "HGX-B200"),
     {"memory": _S_OOM, "bandwidth": "NVIDIA DGX/HGX B200 spec ~7.7-8 TB/s [unverified]",
      "tflops": "NVIDIA HGX B200 spec, dense [unverified here]; " + _S_REF,
      "price": "RunPod $10.57 on-demand via " + _S_REF}),
    ("MI300X", "amd", 191.98, 5.3, 1307.0, 1307.0, 2615.0, 0.0, "Infinity Fabric", 896.0, 1.99,
     ("MI300X-192GB", "AMD-MI300X"),
     {"memory": "192 GB HBM3 as ROCm reports it [unverified]",
      "bandwidth": "deploybase/clarifai comparisons via " + _S_REF,
      "tflops": "'Peak FP8 2,610 TFLOPS (dense)'; BF16 1,307 via " + _S_REF,
      "price": "median $1.99 (cliffcenter research note) via " + _S_REF}),
    ("MI325X", "amd", 255.98, 6.0, 1307.0, 1307.0, 2615.0, 0.0, "Infinity Fabric", 896.0, 1.95,
     ("MI325X-256GB", "AMD-MI325X"),
     {"memory": "256 GB HBM3E as ROCm reports it [unverified]",
      "bandwidth": "AMD spec [unverified here]; " + _S_REF, "tflops": "AMD spec; " + _S_REF,
      "price": "TensorWave $1.95 (cliffcenter) via " + _S_REF}),
    ("RTX-4090-24GB", "nvidia", 23.52, 1.008, 165.2, 165.2, 330.3, 0.0, "PCIe Gen4 x16", 64.0,
     0.69, ("RTX-4090", "RTX4090", "4090", "GeForce-RTX-4090"),
     {"memory": _S_FIX + " (LLMServingSim RTX 4090 meta.json)",
      "bandwidth": "NVIDIA Ada whitepaper 1,008 GB/s [unverified here]",
      "tflops": "Ada whitepaper: 165.2 FP16/BF16 with FP32 accumulate, FP8 330.3 dense "
                "[unverified here]",
      "price": "community-cloud on-demand ~$0.69 [unverified]"}),
    ("RTX-3090-24GB", "nvidia", 23.58, 0.936, 71.0, 71.0, 0.0, 0.0, "PCIe Gen4 x16", 64.0, 0.43,
     ("RTX-3090", "RTX3090", "3090", "GeForce-RTX-3090"),
     {"memory": _S_FIX + " (vllm#10517 log)",
      "bandwidth": "NVIDIA Ampere GA102 whitepaper 936 GB/s [unverified here]",
      "tflops": "GA102 whitepaper: 71 FP16 with FP32 accumulate, dense [unverified here]",
      "price": "community-cloud on-demand ~$0.43 [unverified]"}),
    ("RTX-PRO-6000-Blackwell-Server-96GB", "nvidia", 94.97, 1.792, 500.0, 500.0, 1000.0, 2000.0,
     "PCIe Gen5 x16", 128.0, 1.79,
     ("RTX-PRO-6000", "RTX-PRO-6000-96GB", "RTX-PRO-6000-Blackwell", "RTXPRO6000",
      "RTX-PRO-6000-Blackwell-Server", "RTX-6000-PRO"),
     {"memory": _S_FIX + " (LLMServingSim RTXPRO6000 meta.json)",
      "bandwidth": "NVIDIA RTX PRO 6000 Blackwell 1.792 TB/s GDDR7 [unverified]",
      "tflops": "4 PFLOPS FP4 with sparsity halved for dense, FP8/BF16 by halving [unverified]",
      "price": "RunPod ~$1.79 [unverified]"}),
)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _build() -> tuple[dict[str, GPU], dict[str, str]]:
    gpus: dict[str, GPU] = {}
    index: dict[str, str] = {}
    for row in _TABLE:
        (name, vendor, mem, bw, bf16, fp16, fp8, fp4, link, link_bw, price, aliases, src) = row
        gpus[name] = GPU(name, vendor, mem, bw, bf16, fp16, fp8, fp4, link, link_bw, price, src)
        for alias in (name, *aliases):
            index[_key(alias)] = name
    return gpus, index


GPUS, _INDEX = _build()


def resolve_gpu(name: str) -> GPU:
    """Look a GPU up by catalog name or alias, ignoring case and punctuation.

    Raises CatalogError listing the closest names when unknown."""
    key = _key(name or "")
    if key in _INDEX:
        return GPUS[_INDEX[key]]
    # device names as drivers print them ("NVIDIA H100 80GB HBM3", "NVIDIA RTX PRO 6000 Blackwell
    # Server Edition"): the longest catalog alias contained in the name decides
    bare = re.sub(r"^(nvidia|amd|instinct|tesla|geforce)+", "", key)
    if len(bare) >= 2:
        hits = [alias for alias in _INDEX if len(alias) >= 2 and alias in bare
                and not re.match(r"(nvidia|amd|tesla|geforce)", alias)]
        if hits:
            return GPUS[_INDEX[max(hits, key=len)]]
    candidates = list(GPUS) + [a for row in _TABLE for a in row[11]]
    close = difflib.get_close_matches(name or "", candidates, n=5, cutoff=0.3)
    close = list(dict.fromkeys(GPUS[_INDEX[_key(c)]].name for c in close))
    hint = ", ".join(close) if close else ", ".join(GPUS)
    raise CatalogError(f"unknown GPU {name!r}; closest catalog names: {hint}")


def gpu_names() -> list[str]:
    return list(GPUS)
