"""The GPU catalog: memory, bandwidth, throughput, interconnect, attention backends and price of
every accelerator vLLM serves on, and the one lookup from any name a tool prints to a row.

Why a table: every capacity and speed prediction starts from these figures and the daemon compares
tiers by them, so they live in one data file (`data/gpus.yaml`) with the source of each figure next
to it. Memory is what the driver reports to vLLM (`cudaMemGetInfo` total, GiB), not the nominal GB
on the box: that is the quantity `gpu_memory_utilization` multiplies. Throughput is dense (no 2:4
sparsity); 0 means the format has no tensor-core path on that GPU. Prices are on-demand $/GPU-hour
(0 = no public listing) and are meant to be overridden by configuration (`prices:`).

Names: `resolve_gpu` accepts the catalog name, any alias, and the strings nvidia-smi / DCGM
`modelName` / the `nvidia.com/gpu.product` node label / GKE's accelerator label / amd-smi print,
ignoring case, punctuation, vendor words (NVIDIA, Tesla, GeForce, AMD, Instinct) and memory-type
words (HBM3, GDDR6...). It never guesses between variants with different memory: a short name
several rows answer to (`V100`, `A100`, `GH200`) is refused with the variants listed. Contract
aliases kept from the first catalog: `H100` and `H100-80GB` are the SXM part.

Operators extend the table without a release: rows in a `gpus:` config section or a
`calc --gpu-file` (same schema as the data file) add devices or override built-in rows
(`install_gpus` for the process, `Catalog.with_rows` for a local view). A device with no row is
described by `generic_gpu(memory_gib, bandwidth_gbs, tflops)`, marked `unprofiled`.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from exporter import yamlfile
from exporter.errors import CatalogError, InputError

GIB = 1024**3
DATA_FILE = Path(__file__).parent / "data" / "gpus.yaml"


# The host link one GPU reads CPU memory over, GB/s per direction, by architecture: the PCIe
# generation its x16 slot runs (PCI-SIG: 3.0 ~16, 4.0 ~32, 5.0 ~64 GB/s per direction; V100 and T4
# are 3.0, A100 / A10 / L4 / L40S / RTX 3090-4090 / MI250 4.0, H100 / H200 / B200 / RTX 5090 /
# MI300X 5.0), and NVLink-C2C on the Grace superchips (450 GB/s per direction, NVIDIA's GH200 and
# GB200 datasheets: 900 GB/s bidirectional). Read by `--cpu-offload-gb` (kernels reading offloaded
# weights through UVA every step).
HOST_LINK_GBS = {"volta": 16.0, "turing": 16.0, "ampere": 32.0, "ada": 32.0, "hopper": 64.0,
                 "blackwell": 64.0, "cdna2": 32.0, "cdna3": 64.0, "cdna4": 64.0}
HOST_LINK_BY_NAME = (("GH200", 450.0), ("GB200", 450.0), ("GB300", 450.0))
# share of the nominal rate offloaded weights stream at while a decode step reads them: two public
# single-stream runs agree, on different links: Qwen2-7B wholly offloaded on an RTX 4090 (PCIe 4.0)
# 1.65 tokens/s for 13.05 GB of layers, 21.5 GB/s = 0.67 x 32 (a r/Vllm post, "35x performance
# tax"); Meta-Llama-3-70B with 70 GiB offloaded on a GH200 (NVLink-C2C) ~4.1 tokens/s, 309 GB/s =
# 0.69 x 450 (vllm PR #6496, the flag's own PR). Chosen on those two (CUDA's bandwidthTest reaches
# ~0.8 of a PCIe slot with large copies; a step's reads are layer by layer)
HOST_LINK_EFFICIENCY = 0.68


@dataclass(frozen=True)
class GPU:
    """One accelerator model, as seen by vLLM (one device: one MI250X GCD, one GH200 GPU)."""

    name: str
    vendor: str
    memory_gib: float            # total device memory as the driver/torch reports it
    hbm_bandwidth_tbps: float    # DRAM bandwidth, TB/s (1e12 B/s)
    bf16_tflops: float           # dense tensor throughput, TFLOPS (0: no such path)
    fp16_tflops: float
    fp8_tflops: float
    fp4_tflops: float
    interconnect: str            # GPU-to-GPU link used for tensor parallelism
    interconnect_gbps: float     # GB/s per GPU, bidirectional, as vendors quote it
    dollars_per_hour: float      # default on-demand price per GPU (0: no public listing)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    # added with the data-file catalog (defaults keep older constructors working)
    arch: str = "unknown"        # volta, turing, ampere, ada, hopper, blackwell, cdna2, cdna3, cdna4
    compute_capability: str = ""  # "9.0" (NVIDIA) or the gfx target (AMD)
    segment: str = "datacenter"  # datacenter | workstation | consumer
    memory_nominal_gb: float = 0.0   # the datasheet's figure
    attention: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)
    aliases: tuple[str, ...] = field(default=(), compare=False)
    tier: bool = False           # offered by default in tier recommendations
    unprofiled: bool = False     # described, not catalogued: predictions are a generic prior
    origin: str = "builtin"      # builtin | a file path | "config" | "described"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tbps * 1e12

    @property
    def bandwidth_gbs(self) -> float:
        return round(self.hbm_bandwidth_tbps * 1000.0, 6)

    @property
    def host_read_bytes_per_s(self) -> float:
        """Bytes/s a kernel reads from pinned host memory (UVA, `--cpu-offload-gb`): the host link
        per direction (HOST_LINK_GBS by the part's name or architecture) at HOST_LINK_EFFICIENCY."""
        name = self.name.upper()
        for prefix, gbs in HOST_LINK_BY_NAME:
            if name.startswith(prefix):
                return gbs * 1e9 * HOST_LINK_EFFICIENCY
        return HOST_LINK_GBS.get(self.arch, 16.0) * 1e9 * HOST_LINK_EFFICIENCY

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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (for `catalog gpus --json` and status pages)."""
        return {"name": self.name, "vendor": self.vendor, "arch": self.arch,
                "compute_capability": self.compute_capability, "segment": self.segment,
                "memory_gib": self.memory_gib, "memory_nominal_gb": self.memory_nominal_gb,
                "bandwidth_gbs": self.bandwidth_gbs,
                "tflops": {k: v for k, v in (("fp16", self.fp16_tflops), ("bf16", self.bf16_tflops),
                                             ("fp8", self.fp8_tflops), ("fp4", self.fp4_tflops)) if v},
                "interconnect": self.interconnect, "interconnect_gbs": self.interconnect_gbps,
                "dollars_per_hour": self.dollars_per_hour or None, "tier": self.tier,
                "attention": {k: list(v) for k, v in self.attention.items()}, "aliases": list(self.aliases),
                "unprofiled": self.unprofiled, "origin": self.origin, "sources": dict(self.sources)}

    def attention_backends(self, era: str = "v1") -> tuple[str, ...]:
        """The attention backends vLLM picks on this device, in its priority order."""
        return tuple(self.attention.get(era, ()))


# ---- the row schema (data file, `gpus:` config section, `calc --gpu-file`) ------------------------

class TFlops(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fp16: float | None = Field(default=None, ge=0, le=100_000)
    bf16: float | None = Field(default=None, ge=0, le=100_000)
    fp8: float | None = Field(default=None, ge=0, le=100_000)
    fp4: float | None = Field(default=None, ge=0, le=100_000)


_REQUIRED_NEW = ("memory_gib", "bandwidth_gbs", "tflops")
_BUILTIN_KEYS: set[str] | None = None     # set once the built-in table is loaded
_SOURCE_KEY = {"memory_gib": "memory", "memory_nominal_gb": "memory", "bandwidth_gbs": "bandwidth",
               "interconnect_gbs": "interconnect", "price": "price", "tflops": "tflops"}


class GpuRow(BaseModel):
    """One row. A row whose name is a catalog row overrides the keys it gives; a new row needs
    memory_gib, bandwidth_gbs and tflops (fp16 or bf16)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    vendor: Literal["nvidia", "amd", "intel", "other"] | None = None
    arch: str | None = None
    compute_capability: str | None = None
    segment: Literal["datacenter", "workstation", "consumer"] | None = None
    memory_gib: float | None = Field(default=None, gt=0, le=4096)
    memory_nominal_gb: float | None = Field(default=None, gt=0, le=4096)
    bandwidth_gbs: float | None = Field(default=None, gt=0, le=100_000)
    tflops: TFlops | None = None
    interconnect: str | None = None
    interconnect_gbs: float | None = Field(default=None, ge=0, le=100_000)
    price: float | None = Field(default=None, ge=0)
    tier: bool | None = None
    attention: dict[str, list[str]] | None = None
    aliases: list[str] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _compute_path(self) -> "GpuRow":
        if self.tflops is not None and not (self.tflops.fp16 or self.tflops.bf16):
            raise ValueError(f"{self.name}: tflops needs fp16 or bf16 above 0")
        if _BUILTIN_KEYS is not None and name_key(self.name) not in _BUILTIN_KEYS:
            missing = [k for k in _REQUIRED_NEW if getattr(self, k) is None]
            if missing:
                raise ValueError(f"{self.name!r} is no catalog GPU, so this new row needs "
                                 f"{', '.join(missing)} (or name a catalog GPU to override it)")
        return self


_ROWS = TypeAdapter(list[GpuRow])


def _loc(loc: tuple[Any, ...], prefix: str) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def rows_from_data(data: Any, source: str) -> list[GpuRow]:
    """Validate rows as loaded from YAML (`{gpus: [...]}` or a bare list). Errors name the source
    and the key (`file.yaml: gpus[2].memory_gib: ...`)."""
    if isinstance(data, dict) and set(data) >= {"gpus"}:
        data = data["gpus"]
    if not isinstance(data, list):
        raise CatalogError(f"{source}: expected a list of GPU rows (or a `gpus:` list), got {type(data).__name__}")
    try:
        return _ROWS.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise CatalogError(f"{source}: {_loc(err['loc'], 'gpus')}: {msg}") from None


def load_gpu_file(path: str | Path) -> list[GpuRow]:
    """Rows from an operator's YAML file (same schema as the built-in data file)."""
    path = Path(path)
    try:
        data = yamlfile.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise CatalogError(f"{path}:{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return rows_from_data(data, str(path))


# ---- name normalisation -------------------------------------------------------------------------

_VENDOR_WORDS = {"nvidia", "amd", "tesla", "geforce", "instinct", "quadro"}
_NOISE_WORDS = {"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7", "edition", "generation",
                "oam", "vf", "shared", "gpu"}
_MEM_TOKEN = re.compile(r"^(\d+)g(?:b)?$")
# a MIG slice has a fraction of the card's memory: it is no catalog row (GPU feature discovery
# labels it `<product>-MIG-1g.10gb`, DCGM `... MIG 1g.10gb`)
_MIG = re.compile(r"(?i)(?:^|[-_ ])MIG[-_ ]")
# what vLLM runs on that is not a GPU: these names are observation-only backends
NON_GPU_WORDS = {"cpu": "cpu", "tpu": "tpu", "trillium": "tpu", "v5e": "tpu", "v5p": "tpu", "v6e": "tpu",
                 "gaudi": "hpu", "gaudi2": "hpu", "gaudi3": "hpu", "hpu": "hpu", "habana": "hpu",
                 "neuron": "neuron", "trainium": "neuron", "trainium2": "neuron", "inferentia": "neuron",
                 "inferentia2": "neuron", "trn1": "neuron", "trn2": "neuron", "inf2": "neuron",
                 "xpu": "xpu", "arc": "xpu"}


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", (name or "").lower()) if t]


def name_key(name: str) -> str:
    """The comparison key of a device name: lower-case alphanumerics without vendor and
    memory-type words (`NVIDIA-H100-80GB-HBM3` and `NVIDIA H100 80GB HBM3` -> `h10080gb`)."""
    return "".join(t for t in _tokens(name) if t not in _VENDOR_WORDS and t not in _NOISE_WORDS)


def non_gpu_kind(name: str | None) -> str | None:
    """`cpu`, `tpu`, `hpu`, `neuron` or `xpu` when a device name is one of vLLM's non-GPU
    backends (`TPU v5e`, `Intel Gaudi 3`, `AWS Trainium2`, `cpu`), else None."""
    toks = _tokens(name or "")
    if "max" in toks and "intel" in toks or "flex" in toks and "intel" in toks:
        return "xpu"   # Intel Data Center GPU Max / Flex: vLLM's XPU backend
    for t in toks:
        if t in NON_GPU_WORDS:
            return NON_GPU_WORDS[t]
    return None


# ---- the catalog ----------------------------------------------------------------------------------

def _attention_class(arch: str, cc: str) -> str:
    if arch == "blackwell":
        return "blackwell-rtx" if cc.startswith("12") else "blackwell-dc"
    if arch in ("ampere", "ada", "hopper"):
        return "ampere-hopper"
    return arch


def _gpu_from(row: Mapping[str, Any], defaults: Mapping[str, Any], origin: str) -> GPU:
    tf = row.get("tflops") or {}
    bf16 = float(tf.get("bf16") or 0.0)
    fp16 = float(tf.get("fp16") or bf16)
    arch = row.get("arch") or "unknown"
    cc = str(row.get("compute_capability") or "")
    attention = row.get("attention") or defaults.get(_attention_class(arch, cc), {})
    return GPU(
        name=row["name"], vendor=row.get("vendor") or "other", memory_gib=float(row["memory_gib"]),
        hbm_bandwidth_tbps=float(row["bandwidth_gbs"]) / 1000.0, bf16_tflops=bf16, fp16_tflops=fp16,
        fp8_tflops=float(tf.get("fp8") or 0.0), fp4_tflops=float(tf.get("fp4") or 0.0),
        interconnect=row.get("interconnect") or "PCIe", interconnect_gbps=float(row.get("interconnect_gbs") or 0.0),
        dollars_per_hour=float(row.get("price") or 0.0), sources=dict(row.get("sources") or {}),
        arch=arch, compute_capability=cc, segment=row.get("segment") or "datacenter",
        memory_nominal_gb=float(row.get("memory_nominal_gb") or 0.0),
        attention={era: tuple(v) for era, v in dict(attention).items()},
        aliases=tuple(row.get("aliases") or ()), tier=bool(row.get("tier")) and float(row.get("price") or 0) > 0,
        origin=origin)


class Catalog:
    """An immutable set of rows with its name index. `BUILTIN` is the data file; `with_rows`
    layers operator rows over it (same name: override the keys given; new name: a new row)."""

    def __init__(self, raw: dict[str, dict[str, Any]], origins: dict[str, str],
                 families: Mapping[str, list[str]], attention_defaults: Mapping[str, Any],
                 exact: Mapping[str, str] | None = None):
        self._raw = raw
        self._families_raw = dict(families)
        self._attention_defaults = dict(attention_defaults)
        self._exact = {k.strip().lower(): v for k, v in (exact or {}).items() if v in raw}
        self.gpus: dict[str, GPU] = {n: _gpu_from(r, attention_defaults, origins[n]) for n, r in raw.items()}
        self._index: dict[str, str] = {}
        for name, gpu in self.gpus.items():        # built-in first: operator rows' aliases win below
            for alias in (name, *gpu.aliases):
                key = name_key(alias)
                if key and (key not in self._index or origins[name] != "builtin"):
                    self._index[key] = name
        self._families = {name_key(k): [m for m in v if m in self.gpus] for k, v in families.items()}

    @classmethod
    def from_file(cls, path: Path = DATA_FILE) -> "Catalog":
        data = yamlfile.safe_load(path.read_text(encoding="utf-8"))
        rows = rows_from_data(data.get("gpus"), str(path))
        raw = {r.name: r.model_dump(exclude_none=True) for r in rows}
        for name, r in raw.items():
            missing = [k for k in _REQUIRED_NEW if k not in r]
            if missing:
                raise CatalogError(f"{path}: gpus row {name}: {', '.join(missing)} missing")
        cat = cls(raw, {n: "builtin" for n in raw}, data.get("families") or {},
                  data.get("attention_defaults") or {}, data.get("exact") or {})
        seen: dict[str, str] = {}
        for name, gpu in cat.gpus.items():
            for alias in (name, *gpu.aliases):
                key = name_key(alias)
                if seen.get(key, name) != name or name not in cat._families.get(key, [name]):
                    raise CatalogError(f"{path}: alias {alias!r} of {name} collides with "
                                       f"{seen.get(key) or 'a family name'}")
                seen[key] = name
        return cat

    def with_rows(self, rows: Iterable[GpuRow], origin: str = "config") -> "Catalog":
        """This catalog plus operator rows. Errors name the row."""
        raw = {n: dict(r) for n, r in self._raw.items()}
        origins = {n: self.gpus[n].origin for n in raw}
        by_key = {name_key(n): n for n in raw}
        for i, row in enumerate(rows):
            given = row.model_dump(exclude_none=True, exclude_defaults=True)
            given["name"] = row.name
            target = by_key.get(name_key(row.name)) or self._index.get(name_key(row.name))
            if target is not None:
                merged = {**raw[target], **{k: v for k, v in given.items() if k != "name"}}
                if "tflops" in given:
                    merged["tflops"] = {**raw[target].get("tflops", {}), **given["tflops"]}
                if "aliases" in given:      # added to the row's names, not replacing them
                    merged["aliases"] = list(dict.fromkeys([*raw[target].get("aliases", []), *given["aliases"]]))
                if "sources" not in given:
                    changed = {_SOURCE_KEY.get(k, k) for k in given if k not in ("name", "aliases")}
                    merged["sources"] = {**raw[target].get("sources", {}),
                                         **{k: f"overridden by {origin}" for k in sorted(changed)}}
                raw[target], origins[target] = merged, origin
            else:
                missing = [k for k in _REQUIRED_NEW if k not in given]
                if missing:
                    raise CatalogError(f"{origin}: gpus[{i}] ({row.name}): a new GPU needs "
                                       f"{', '.join(missing)} (or name a catalog GPU to override it)")
                given.setdefault("sources", {k: f"given in {origin}" for k in ("memory", "bandwidth", "tflops")})
                if "interconnect_gbs" not in given:
                    given.update(interconnect="PCIe Gen4 x16", interconnect_gbs=64.0)
                    given["sources"] = {**given["sources"], "interconnect": "assumed PCIe Gen4 x16 (none given)"}
                raw[row.name], origins[row.name] = given, origin
                by_key[name_key(row.name)] = row.name
        return Catalog(raw, origins, self._families_raw, self._attention_defaults, self._exact)

    # -- lookups --------------------------------------------------------------------------------
    def _family(self, key: str) -> list[GPU] | None:
        members = self._families.get(key)
        return [self.gpus[m] for m in members] if members else None

    def _pick(self, variants: list[GPU], asked: str) -> GPU:
        mems = {round(g.memory_gib) for g in variants}
        if len(mems) == 1:
            return variants[0]
        listing = "; ".join(f"{g.name} ({g.memory_gib:g} GiB)" for g in variants)
        raise CatalogError(f"ambiguous GPU {asked!r}: variants differ in memory, name one of: {listing}")

    def find(self, name: str) -> GPU | None:
        """The row a name answers to, or None (unknown, ambiguous, a MIG slice, not a GPU)."""
        try:
            return self.resolve(name)
        except CatalogError:
            return None

    def resolve(self, name: str) -> GPU:
        """The row a name answers to. Raises CatalogError: unknown (closest names listed),
        ambiguous (variants listed), a MIG slice, or a non-GPU backend."""
        asked = (name or "").strip()
        if _MIG.search(asked):
            raise CatalogError(f"{asked!r} is a MIG slice, not a whole GPU: it has a fraction of the card's "
                               "memory; describe it with --gpu-memory-gib (or a `gpus:` row)")
        if asked.lower() in self._exact:
            return self.gpus[self._exact[asked.lower()]]
        key = name_key(asked)
        if key in self._index:
            return self.gpus[self._index[key]]
        if (fam := self._family(key)) is not None:
            return self._pick(fam, asked)
        # a memory figure the row names leave out ("NVIDIA H20 96GB", "A100 80GB"): the rest of
        # the name must be a row or family, and the figure must be that row's memory
        toks = [t for t in _tokens(asked) if t not in _VENDOR_WORDS and t not in _NOISE_WORDS]
        mem = [t for t in toks if _MEM_TOKEN.match(t)]
        if len(mem) == 1:
            rest = "".join(t for t in toks if t != mem[0])
            gb = int(_MEM_TOKEN.match(mem[0]).group(1))
            cands = ([self.gpus[self._index[rest]]] if rest in self._index else self._family(rest)) or []
            fits = [g for g in cands if g.memory_nominal_gb and abs(g.memory_nominal_gb - gb) <= 0.03 * gb]
            if fits:
                return self._pick(fits, asked)
        kind = non_gpu_kind(asked)
        if kind is not None:
            raise CatalogError(f"{asked!r} is a {kind.upper()} device, not a GPU: vLLM on it gets observation "
                               "findings only (describe its memory with --gpu-memory-gib for a KV estimate)")
        candidates = list(self.gpus) + [a for g in self.gpus.values() for a in g.aliases]
        close = difflib.get_close_matches(asked, candidates, n=5, cutoff=0.3)
        close = list(dict.fromkeys(self.gpus[self._index[name_key(c)]].name for c in close))
        hint = ", ".join(close) if close else ", ".join(list(self.gpus)[:12]) + ", ..."
        raise CatalogError(f"unknown GPU {asked!r}; closest catalog names: {hint} "
                           "(or describe it: --gpu-memory-gib, --gpu-bandwidth-gbs, --gpu-tflops)")

    def with_device(self, gpu: GPU) -> "Catalog":
        """This catalog with one device object added or replacing the row of its name (a
        described or command-line-adjusted device, so every later lookup sees the same one)."""
        cat = copy.copy(self)
        cat.gpus = {**self.gpus, gpu.name: gpu}
        cat._index = {**self._index, name_key(gpu.name): gpu.name}
        return cat

    def tier_names(self) -> list[str]:
        """Rows offered by default in tier recommendations (priced, marked `tier`)."""
        return [n for n, g in self.gpus.items() if g.tier and g.dollars_per_hour > 0]

    @cached_property
    def generic_profile(self) -> tuple[float, float]:
        """(bandwidth GB/s, dense FLOPs per byte) of a device nobody profiled: the medians of the
        catalog's data-centre rows."""
        rows = [g for g in self.gpus.values() if g.origin == "builtin" and g.segment == "datacenter"]
        bw = statistics.median(g.bandwidth_gbs for g in rows)
        ratio = statistics.median(g.tflops("bf16") * 1e12 / (g.bandwidth_gbs * 1e9) for g in rows)
        return bw, ratio


BUILTIN = Catalog.from_file()
_BUILTIN_KEYS = {name_key(a) for g in BUILTIN.gpus.values() for a in (g.name, *g.aliases)}
_active = BUILTIN
GPUS: dict[str, GPU] = dict(BUILTIN.gpus)   # the active rows; updated in place by install_gpus


def _activate(cat: Catalog) -> Catalog:
    global _active
    _active = cat
    GPUS.clear()
    GPUS.update(cat.gpus)
    return cat


def install_gpus(rows: Iterable[GpuRow], origin: str = "config") -> Catalog:
    """Make operator rows (a `gpus:` config section) part of this process's catalog, replacing
    rows installed before (call again on reload; an empty list restores the built-in table)."""
    rows = list(rows)
    return _activate(BUILTIN.with_rows(rows, origin) if rows else BUILTIN)


def active_catalog() -> Catalog:
    return _active


def resolve_gpu(name: str) -> GPU:
    """Look a GPU up by catalog name, alias or tool-printed name (see the module docstring).

    Raises CatalogError: unknown (closest names listed), ambiguous (variants listed)."""
    return _active.resolve(name)


def find_gpu(name: str | None) -> GPU | None:
    """`resolve_gpu` that answers None instead of raising (telemetry and discovery labels)."""
    return _active.find(name) if name and name.strip() else None


def gpu_names() -> list[str]:
    return list(_active.gpus)


def tier_names() -> list[str]:
    return _active.tier_names()


def generic_gpu(memory_gib: float, bandwidth_gbs: float | None = None, tflops: float | None = None,
                *, name: str = "generic", catalog: Catalog | None = None) -> GPU:
    """A device with no row, from what the operator knows about it. Missing figures come from the
    catalog's data-centre medians (bandwidth, FLOPs per byte); the result is `unprofiled`: a prior
    for step-time predictions until the daemon has calibrated against the server."""
    if not (isinstance(memory_gib, (int, float)) and 0 < memory_gib <= 4096):
        raise InputError(f"GPU memory must be in (0, 4096] GiB, got {memory_gib!r}")
    for label, v in (("bandwidth", bandwidth_gbs), ("tflops", tflops)):
        if v is not None and not (isinstance(v, (int, float)) and v > 0):
            raise InputError(f"GPU {label} must be positive, got {v!r}")
    med_bw, flops_per_byte = (catalog or _active).generic_profile
    bw = float(bandwidth_gbs) if bandwidth_gbs else med_bw
    tf = float(tflops) if tflops else bw * 1e9 * flops_per_byte / 1e12
    how = "given" if bandwidth_gbs else f"catalog median of data-centre rows ({med_bw:g} GB/s)"
    how_tf = "given" if tflops else f"bandwidth x catalog median FLOPs/byte ({flops_per_byte:.0f})"
    return GPU(name=name, vendor="other", memory_gib=float(memory_gib), hbm_bandwidth_tbps=bw / 1000.0,
               bf16_tflops=tf, fp16_tflops=tf, fp8_tflops=0.0, fp4_tflops=0.0, interconnect="PCIe",
               interconnect_gbps=64.0, dollars_per_hour=0.0,
               sources={"memory": "given", "bandwidth": how, "tflops": how_tf, "price": "none"},
               unprofiled=True, origin="described")


def device_for_cli(name: str | None, *, gpu_file: str | None = None, memory_gib: float | None = None,
                   bandwidth_gbs: float | None = None, tflops: float | None = None) -> GPU:
    """`calc`'s device: a catalog row (with `--gpu-file` rows layered over the table), its
    bandwidth/TFLOPS replaced when given, or an unknown device described by the figures given
    (no name and memory; or an unknown name with memory and bandwidth or TFLOPS).

    `calc` is one short process: the device (and the file's rows) become this process's catalog,
    so every later lookup by name (the tier ranking's current GPU) answers the same device."""
    cat = BUILTIN.with_rows(load_gpu_file(gpu_file), origin=str(gpu_file)) if gpu_file else _active
    gpu = _cli_device(cat, name, memory_gib, bandwidth_gbs, tflops)
    _activate(cat if cat.gpus.get(gpu.name) is gpu else cat.with_device(gpu))
    return gpu


def _cli_device(cat: Catalog, name: str | None, memory_gib: float | None, bandwidth_gbs: float | None,
                tflops: float | None) -> GPU:
    if not name:
        if memory_gib is None:
            raise InputError("--gpu NAME or --gpu-memory-gib F (to describe a device) is required")
        return generic_gpu(memory_gib, bandwidth_gbs, tflops, catalog=cat)
    try:
        gpu = cat.resolve(name)
    except CatalogError as exc:
        # describing takes memory plus bandwidth or TFLOPS: with memory alone a typo in a known
        # name would silently become a generic device
        describing = memory_gib is not None and (bandwidth_gbs is not None or tflops is not None)
        if not describing or str(exc).startswith(("ambiguous", f"{name.strip()!r} is a MIG")):
            raise
        return generic_gpu(memory_gib, bandwidth_gbs, tflops, name=name.strip(), catalog=cat)
    changes: dict[str, Any] = {}
    if bandwidth_gbs is not None:
        if bandwidth_gbs <= 0:
            raise InputError(f"--gpu-bandwidth-gbs must be positive, got {bandwidth_gbs:g}")
        changes["hbm_bandwidth_tbps"] = bandwidth_gbs / 1000.0
    if tflops is not None:
        if tflops <= 0:
            raise InputError(f"--gpu-tflops must be positive, got {tflops:g}")
        changes.update(bf16_tflops=tflops if gpu.bf16_tflops else 0.0, fp16_tflops=tflops)
    if changes:
        gpu = dataclasses.replace(gpu, **changes, sources={**gpu.sources, **{
            k: "given on the command line" for k, v in (("bandwidth", bandwidth_gbs), ("tflops", tflops)) if v}})
    return gpu
