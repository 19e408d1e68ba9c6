"""The GPU catalog (exporter/model/data/gpus.yaml): every row physically sensible and sourced, every
name a tool prints resolving to the right row, ambiguous names refused, operator rows layered on."""
from __future__ import annotations

import re

import pytest
import yaml

from exporter.config import config_from_dict
from exporter.errors import CatalogError, ConfigError, InputError
from exporter.model.gpus import (BUILTIN, DATA_FILE, GPUS, find_gpu, generic_gpu, install_gpus, load_gpu_file,
                                 name_key, resolve_gpu, tier_names)
from exporter.telemetry.gpu_product import catalog_gpu

# Per architecture: (dense FP16/BF16 TFLOPS ceiling, bandwidth ceiling GB/s per device, has BF16,
# has FP8, has FP4). Ceilings are the generation's largest datasheet figure (V100S 130/1,134;
# Quadro RTX 8000 / TITAN RTX 130.5/672 (T4 65/320); A100 312/2,039; L40S/RTX 6000 Ada ~365, 4090 1,008 GB/s; H100/H200 989/4,800;
# GB200 2,500/8,000; MI250X GCD 191.5/1,638; MI300X/MI325X 1,307/6,000; MI355X 2,500/8,000;
# Radeon RX 7900 XTX / PRO W7900 (RDNA3, gfx1100) 123/960).
CEILINGS = {
    "volta": (130, 1134, False, False, False), "turing": (130.5, 672, False, False, False),
    "ampere": (312, 2039, True, False, False), "ada": (365, 1008, True, True, False),
    "hopper": (989, 4900, True, True, False), "blackwell": (2500, 8000, True, True, True),
    "cdna2": (191.5, 1640, True, False, False), "cdna3": (1308, 6000, True, True, False),
    "cdna4": (2500, 8000, True, True, True), "rdna3": (123, 960, True, False, False),
}
MIN_BANDWIDTH_GBS = 150          # the slowest device vLLM is run on here is an A16 quarter (200)


@pytest.mark.parametrize("gpu", list(BUILTIN.gpus.values()), ids=lambda g: g.name)
def test_every_row_is_physically_sensible(gpu):
    ceiling_tf, ceiling_bw, bf16, fp8, fp4 = CEILINGS[gpu.arch]
    assert MIN_BANDWIDTH_GBS <= gpu.bandwidth_gbs <= ceiling_bw
    assert 0 < gpu.fp16_tflops <= ceiling_tf and gpu.bf16_tflops <= ceiling_tf
    assert (gpu.bf16_tflops > 0) == bf16, "BF16 only from Ampere / CDNA2 on"
    assert (gpu.fp8_tflops > 0) == fp8, "FP8 only on Ada, Hopper, Blackwell, CDNA3+"
    assert (gpu.fp4_tflops > 0) == fp4, "FP4 only on Blackwell and CDNA4"
    if gpu.fp8_tflops:
        assert 1.9 <= gpu.fp8_tflops / gpu.tflops("bf16") <= 2.1     # FP8 doubles the 16-bit rate
    if gpu.fp4_tflops:
        assert 2 <= gpu.fp4_tflops / gpu.fp8_tflops <= 4
    # memory as the driver reports it: a little under the datasheet figure, never above
    assert 0.9 <= gpu.memory_gib / gpu.memory_nominal_gb <= 1.0
    # a memory size in the row's name is its datasheet figure
    if m := re.search(r"(\d+)GB$", gpu.name):
        assert int(m.group(1)) == gpu.memory_nominal_gb
    # roofline balance: FLOPs per byte between the export-capped H20 (37) and the RTX 5000 Ada
    # (453: a 6000 Ada's SMs per clock on a 256-bit bus); an L4 is ~400
    assert 30 <= gpu.tflops("bf16") * 1e12 / (gpu.bandwidth_gbs * 1e9) <= 480
    assert gpu.interconnect and gpu.interconnect_gbps > 0
    assert gpu.dollars_per_hour >= 0 and (gpu.dollars_per_hour > 0 or "price" in gpu.sources)


@pytest.mark.parametrize("gpu", list(BUILTIN.gpus.values()), ids=lambda g: g.name)
def test_every_figure_names_its_source_and_attention_follows_the_era(gpu):
    assert {"memory", "bandwidth", "tflops", "interconnect", "price"} <= set(gpu.sources)
    assert all(len(v) > 10 for v in gpu.sources.values())
    v1 = gpu.attention_backends("v1")
    assert v1, "every row says which attention backends vLLM picks"
    if gpu.vendor == "nvidia" and float(gpu.compute_capability) < 8.0:
        # no FlashAttention before Ampere; the V0 engine used xformers there
        assert "FLASH_ATTN" not in v1 + gpu.attention_backends("v0")
        assert gpu.attention_backends("v0") == ("XFORMERS",)
    elif gpu.vendor == "nvidia":
        first = "FLASHINFER" if gpu.compute_capability.startswith("10") else "FLASH_ATTN"
        assert v1[0] == first
    else:
        assert v1[0] == "TRITON_ATTN" and "FLASH_ATTN" not in v1


def test_the_data_file_and_the_table_agree():
    rows = yaml.safe_load(DATA_FILE.read_text())["gpus"]
    assert len(rows) == len(BUILTIN.gpus) >= 45
    assert {r["name"] for r in rows} == set(GPUS)
    for row in rows:        # the JSON record gives back the file's figures
        rec = GPUS[row["name"]].as_dict()
        assert (rec["memory_gib"], rec["bandwidth_gbs"], rec["dollars_per_hour"]) == (
            row["memory_gib"], row["bandwidth_gbs"], row.get("price"))
        assert {k: v for k, v in rec["tflops"].items() if k != "fp16" or "fp16" in row["tflops"]} == row["tflops"]


# nvidia-smi / DCGM modelName / node label / amd-smi / GKE strings -> (row, memory GiB)
TOOL_NAMES = [
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB", 31.75), ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB", 15.78),
    ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB", 15.77), ("Tesla V100S-PCIE-32GB", "V100S-PCIe-32GB", 31.75),
    ("Tesla T4", "T4", 14.75), ("Tesla-T4", "T4", 14.75), ("nvidia-tesla-t4", "T4", 14.75),
    ("NVIDIA A10G", "A10G", 21.98), ("NVIDIA A10", "A10", 21.98), ("NVIDIA A30", "A30", 23.5),
    ("NVIDIA A40", "A40", 44.35), ("NVIDIA A100-SXM4-80GB", "A100-80GB", 79.15),
    ("NVIDIA-A100-SXM4-80GB", "A100-80GB", 79.15), ("NVIDIA A100-SXM4-40GB", "A100-40GB", 39.39),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB", 79.15), ("NVIDIA A100-PCIE-40GB", "A100-40GB", 39.39),
    ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB", 79.15), ("NVIDIA RTX A6000", "RTX-A6000-48GB", 47.54),
    ("NVIDIA RTX A4000", "RTX-A4000-16GB", 15.6), ("NVIDIA L4", "L4", 22.03), ("NVIDIA L20", "L20-48GB", 44.39),
    ("NVIDIA L40", "L40-48GB", 44.39), ("NVIDIA L40S", "L40S", 44.39),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada-48GB", 47.5),
    ("NVIDIA GeForce RTX 3090", "RTX-3090-24GB", 23.58), ("NVIDIA GeForce RTX 4090", "RTX-4090-24GB", 23.52),
    ("NVIDIA GeForce RTX 5090", "RTX-5090-32GB", 31.36),
    ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB", 79.19), ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB", 79.19),
    ("NVIDIA H100 PCIe", "H100-PCIe-80GB", 79.19), ("NVIDIA H100 NVL", "H100-NVL-94GB", 93.1),
    ("NVIDIA-H100-NVL", "H100-NVL-94GB", 93.1), ("NVIDIA H800", "H800-SXM-80GB", 79.19),
    ("NVIDIA H20", "H20-96GB", 95.1), ("NVIDIA H200", "H200-SXM-141GB", 139.81),
    ("NVIDIA H200 NVL", "H200-NVL-141GB", 139.81), ("NVIDIA GH200 480GB", "GH200-96GB", 95.1),
    ("NVIDIA-GH200-480GB", "GH200-96GB", 95.1), ("NVIDIA GH200 120GB", "GH200-96GB", 95.1), ("NVIDIA GH200 144G HBM3e", "GH200-144GB", 142.5),
    ("NVIDIA B200", "B200-180GB", 178.35), ("NVIDIA B300 SXM6 AC", "B300-288GB", 267.9),
    ("NVIDIA GB200", "GB200-186GB", 184.3),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell-Server-96GB", 94.97),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell-Server-96GB", 94.97),
    ("AMD Instinct MI210", "MI210", 63.98), ("MI250X/MI250", "MI250X", 63.98), ("AMD Instinct MI250X", "MI250X", 63.98),
    ("AMD Instinct MI300X", "MI300X", 191.98), ("AMD_Instinct_MI300X_OAM", "MI300X", 191.98),
    ("AMD Instinct MI325X", "MI325X", 255.98), ("AMD Instinct MI355X", "MI355X", 287.98),
    ("nvidia-tesla-a100", "A100-40GB", 39.39), ("nvidia-tesla-v100", "V100-SXM2-16GB", 15.78),
    ("nvidia-h100-80gb", "H100-SXM-80GB", 79.19), ("nvidia-l4", "L4", 22.03),
    ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-80GB", 79.15),      # time-sliced node label
    ("NVIDIA H20 96GB", "H20-96GB", 95.1), ("A100 80GB", "A100-80GB", 79.15),   # memory figure matches
    # the 2026-12 consumer and workstation rows, by the names their drivers print: a SUPER or Ti is
    # its own card, never the plain one
    ("NVIDIA GeForce RTX 3090 Ti", "RTX-3090-Ti-24GB", 23.55), ("NVIDIA GeForce RTX 3070", "RTX-3070-8GB", 7.78),
    ("NVIDIA GeForce RTX 4070", "RTX-4070-12GB", 11.7), ("NVIDIA GeForce RTX 4070 SUPER", "RTX-4070-SUPER-12GB", 11.7),
    ("NVIDIA GeForce RTX 4070 Ti", "RTX-4070-Ti-12GB", 11.7),
    ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX-4070-Ti-SUPER-16GB", 15.56),
    ("NVIDIA GeForce RTX 4080 SUPER", "RTX-4080-SUPER-16GB", 15.57), ("NVIDIA GeForce RTX 4080", "RTX-4080-16GB", 15.67),
    ("NVIDIA RTX 4000 Ada Generation", "RTX-4000-Ada-20GB", 19.54), ("NVIDIA RTX A4500", "RTX-A4500-20GB", 19.54),
    ("NVIDIA A2", "A2-16GB", 14.5), ("NVIDIA GeForce RTX 5070 Ti", "RTX-5070-Ti-16GB", 15.47),
    ("AMD Radeon RX 7900 XTX", "RX-7900-XTX-24GB", 23.98),
    ("NVIDIA GeForce RTX 4060 Ti 16GB", "RTX-4060-Ti-16GB", 15.56), ("RTX 4060 Ti 8GB", "RTX-4060-Ti-8GB", 7.75),
]


@pytest.mark.parametrize("printed, name, memory", TOOL_NAMES)
def test_names_as_tools_print_them(printed, name, memory):
    gpu = resolve_gpu(printed)
    assert (gpu.name, gpu.memory_gib) == (name, memory)
    assert catalog_gpu(printed) == name          # telemetry and discovery use the same lookup


@pytest.mark.parametrize("alias, name", [
    # contract aliases from the first catalog (INTERFACE.md examples and earlier callers)
    ("H100", "H100-SXM-80GB"), ("h100-80gb", "H100-SXM-80GB"), ("H100-80GB", "H100-SXM-80GB"),
    ("T4-16GB", "T4"), ("t4", "T4"), ("RTX-4090-24GB", "RTX-4090-24GB"), ("rtx 4090", "RTX-4090-24GB"),
    ("L40S-48GB", "L40S"), ("l40s-48gb", "L40S"), ("H100-PCIe", "H100-PCIe-80GB"), ("A100-40GB", "A100-40GB"),
    ("A100-80GB", "A100-80GB"), ("H200", "H200-SXM-141GB"), ("B200", "B200-180GB"), ("NVIDIA-L4", "L4"),
    ("mi300x", "MI300X"), ("RTX-PRO-6000", "RTX-PRO-6000-Blackwell-Server-96GB"),
    # short names people type
    ("A6000", "RTX-A6000-48GB"), ("V100-32GB", "V100-SXM2-32GB"), ("H100 NVL", "H100-NVL-94GB"),
    ("H20", "H20-96GB"), ("L20", "L20-48GB"), ("4090", "RTX-4090-24GB"), ("5090", "RTX-5090-32GB"),
])
def test_aliases_resolve_case_insensitively(alias, name):
    assert resolve_gpu(alias).name == name


@pytest.mark.parametrize("short, variants", [
    ("V100", {"V100-SXM2-16GB", "V100-SXM2-32GB", "V100-PCIe-16GB", "V100-PCIe-32GB"}),
    ("Tesla V100", {"V100-SXM2-16GB", "V100-SXM2-32GB"}),
    ("A100", {"A100-40GB", "A100-80GB"}), ("GH200", {"GH200-96GB", "GH200-144GB"}),
    ("RTX 6000", {"RTX-6000-Ada-48GB", "RTX-PRO-6000-Blackwell-Server-96GB"}),
    # the driver prints the 8 and 16 GB RTX 4060 Ti alike; a name with the memory finds its row
    ("NVIDIA GeForce RTX 4060 Ti", {"RTX-4060-Ti-8GB", "RTX-4060-Ti-16GB"}),
])
def test_ambiguous_short_names_are_refused_with_the_variants(short, variants):
    with pytest.raises(CatalogError, match="ambiguous") as exc:
        resolve_gpu(short)
    assert all(v in str(exc.value) for v in variants)
    assert find_gpu(short) is None and catalog_gpu(short) is None


def test_no_name_answers_as_a_device_with_other_memory():
    """The two wrong answers the first catalog gave: an NVL is not an 80 GB H100 and the GH200's
    480 GB (CPU + GPU) is not an H200's 141 GB. A name carrying a memory figure that no variant
    has is refused rather than mapped to the nearest."""
    assert resolve_gpu("NVIDIA H100 NVL").memory_gib > 90
    assert resolve_gpu("NVIDIA GH200 480GB").memory_gib < 100
    with pytest.raises(CatalogError):
        resolve_gpu("H100 120GB")
    for g in GPUS.values():          # every alias of every row resolves back to that row
        for alias in (g.name, *g.aliases):
            assert resolve_gpu(alias).name == g.name, alias


def test_unknown_mig_and_non_gpu_names():
    with pytest.raises(CatalogError, match="closest catalog names: H100-SXM-80GB"):
        resolve_gpu("H110-80GB")
    with pytest.raises(CatalogError, match="MIG slice"):
        resolve_gpu("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    with pytest.raises(CatalogError, match="TPU device, not a GPU"):
        resolve_gpu("TPU v5e")
    with pytest.raises(CatalogError, match="HPU device"):
        resolve_gpu("Intel Gaudi 3")
    assert catalog_gpu("Some Future Card") is None and catalog_gpu(None) is None and catalog_gpu(" ") is None
    assert name_key("NVIDIA-H100-80GB-HBM3") == name_key("nvidia h100 80gb hbm3") == "h10080gb"


def test_tier_ranking_is_over_priced_tier_rows_only():
    names = tier_names()
    assert "H100-SXM-80GB" in names and "L4" in names
    assert all(GPUS[n].dollars_per_hour > 0 for n in names)
    assert "V100-SXM2-32GB" not in names and "H20-96GB" not in names   # new rows are not tiers


def test_generic_device_is_marked_unprofiled():
    g = generic_gpu(64, 1600, 180)
    assert (g.memory_gib, g.bandwidth_gbs, g.bf16_tflops, g.unprofiled) == (64, 1600, 180, True)
    d = generic_gpu(64)
    bw, ratio = BUILTIN.generic_profile
    assert d.bandwidth_gbs == bw and d.tflops("bf16") == pytest.approx(bw * 1e9 * ratio / 1e12)
    assert "median" in d.sources["bandwidth"]
    assert not any(x.unprofiled for x in GPUS.values())
    with pytest.raises(InputError):
        generic_gpu(0)
    with pytest.raises(InputError):
        generic_gpu(16, bandwidth_gbs=-1)


# ---- operator rows: `gpus:` config section and --gpu-file -------------------------------------------

def test_gpus_section_through_the_config_loader_adds_and_overrides(tmp_path):
    from exporter.config import load_config
    cfg_file = tmp_path / "vllm-drift.yaml"
    cfg_file.write_text(yaml.safe_dump({"gpus": [
        {"name": "Acme-X1", "memory_gib": 60, "bandwidth_gbs": 1500, "tflops": {"bf16": 300},
         "aliases": ["ACME X1 Accelerator"], "price": 1.1},
        {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.5, "price": 2.25,   # override by a tool name
         "aliases": ["our-h100"]},
    ]}))
    cfg = load_config(cfg_file)
    try:
        install_gpus(cfg.gpus)
        acme = resolve_gpu("acme x1 accelerator")
        assert (acme.name, acme.memory_gib, acme.bandwidth_gbs, acme.origin) == ("Acme-X1", 60, 1500, "config")
        h100 = resolve_gpu("H100")
        assert (h100.memory_gib, h100.dollars_per_hour, h100.bandwidth_gbs) == (79.5, 2.25, 3350)
        assert h100.sources["memory"] == "overridden by config" and "datasheet" not in h100.sources["memory"]
        assert "Acme-X1" in GPUS and resolve_gpu("our-h100") is h100 and resolve_gpu("H100-SXM5") is h100
    finally:
        install_gpus([])
    assert resolve_gpu("H100").memory_gib == 79.19 and "Acme-X1" not in GPUS and find_gpu("Acme-X1") is None


@pytest.mark.parametrize("row, key", [
    ({"name": "Acme-X1", "memory_gib": 60, "bandwith_gbs": 1500, "tflops": {"bf16": 300}}, "gpus[0].bandwith_gbs"),
    ({"name": "H100", "memory_gib": -4}, "gpus[0].memory_gib"),
    ({"name": "H100", "tflops": {"bf16": 100, "fp9": 3}}, "gpus[0].tflops.fp9"),
    ({"name": "Acme-X1", "memory_gib": 60}, "gpus[0]"),       # a new row needs bandwidth and tflops
])
def test_bad_gpu_rows_name_the_key(row, key, tmp_path):
    with pytest.raises(ConfigError) as exc:
        config_from_dict({"gpus": [row]}, source="cfg.yaml")
    assert str(exc.value).startswith(f"cfg.yaml: {key}:"), str(exc.value)
    f = tmp_path / "extra.yaml"
    f.write_text(yaml.safe_dump({"gpus": [row]}))
    with pytest.raises(CatalogError) as exc:
        load_gpu_file(f)
    assert str(exc.value).startswith(f"{f}: {key}:"), str(exc.value)


def test_gpu_file_is_a_local_view(tmp_path):
    f = tmp_path / "extra.yaml"
    f.write_text("- {name: Acme-X1, memory_gib: 60, bandwidth_gbs: 1500, tflops: {bf16: 300}}\n")
    cat = BUILTIN.with_rows(load_gpu_file(f), origin=str(f))
    assert cat.resolve("ACME-X1").memory_gib == 60 and find_gpu("Acme-X1") is None
    with pytest.raises(CatalogError, match="cannot read"):
        load_gpu_file(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("gpus: [\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_gpu_file(tmp_path / "broken.yaml")


def test_daemon_installs_the_config_rows_and_a_reload_replaces_them(tmp_path):
    """`serve`'s config: its `gpus:` rows are what the drift predictions resolve GPU hints with;
    a reload with other rows replaces them, a bad reload keeps them."""
    import asyncio

    from exporter.config import build_config
    from exporter.daemon import Daemon
    from exporter.drift.predict import resolve_hints

    cfg_file = tmp_path / "vd.yaml"
    row = {"name": "Acme-X1", "memory_gib": 60, "bandwidth_gbs": 1500, "tflops": {"bf16": 300}}
    cfg_file.write_text(yaml.safe_dump({"targets": [{"url": "http://127.0.0.1:9", "gpu": "Acme-X1"}], "gpus": [row]}))
    try:
        daemon = Daemon(build_config(str(cfg_file)), config_path=str(cfg_file))
        res = resolve_hints(["Qwen/Qwen3-8B"], "acme-x1")
        assert res.gpu is not None and res.gpu.memory_gib == 60 and "gpu" not in res.missing

        async def reload() -> str:
            return daemon.reload()
        cfg_file.write_text(yaml.safe_dump({"gpus": [{**row, "bandwith_gbs": 1}]}))     # bad: kept
        assert "gpus[0].bandwith_gbs" in asyncio.run(reload()) and find_gpu("Acme-X1") is not None
        cfg_file.write_text(yaml.safe_dump({"gpus": [{**row, "name": "Acme-X2"}]}))
        assert asyncio.run(reload()) == "ok"
        assert find_gpu("Acme-X1") is None and find_gpu("Acme-X2").memory_gib == 60
        assert "gpu" in resolve_hints(["Qwen/Qwen3-8B"], "Acme-X1").missing
    finally:
        install_gpus([])
