"""`vllm-drift calc` on devices beyond the first catalog: tool-printed names, `--gpu-file` rows and
unknown devices described by their figures. Real subprocesses, exit status, stdout and stderr."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

QWEN = ("--model", "Qwen/Qwen3-8B", "--max-model-len", "8192", "--vllm-version", "0.19.0")


def calc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "calc", *args],
                          capture_output=True, text=True, timeout=120)


def calc_json(*args: str) -> dict:
    out = calc(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_v100_by_its_nvidia_smi_name_answers_with_its_memory():
    qwen4b = ("--model", "Qwen/Qwen3-4B", *QWEN[2:])
    big = calc_json("--gpu", "Tesla V100-SXM2-32GB", *qwen4b)
    small = calc_json("--gpu", "Tesla V100-SXM2-16GB", *qwen4b)
    assert (big["setup"]["gpu"], big["setup"]["gpu_memory_gib"]) == ("V100-SXM2-32GB", 31.75)
    assert small["setup"]["gpu_memory_gib"] == 15.78
    assert big["setup"]["dtype"] == "float16"          # no BF16 before Ampere: vLLM falls back
    # the same weights and activations, 16 GiB more pool: ~16 GiB x 0.9 more KV
    extra = (big["kv_cache"]["tokens"] - small["kv_cache"]["tokens"]) * big["kv_cache"]["bytes_per_token"] / 2**30
    assert extra == pytest.approx((31.75 - 15.78) * 0.9, rel=0.02)
    assert big["predicted"]["tpot_s"] > 0


def test_gpu_file_adds_and_overrides_rows(tmp_path):
    f = tmp_path / "fleet-gpus.yaml"
    f.write_text("gpus:\n"
                 "  - {name: Acme-X1, memory_gib: 60, bandwidth_gbs: 1500, tflops: {bf16: 300}, aliases: [ACME X1]}\n"
                 "  - {name: H100-SXM-80GB, memory_gib: 70}\n")
    acme = calc_json("--gpu", "acme x1", "--gpu-file", str(f), *QWEN)
    assert (acme["setup"]["gpu"], acme["setup"]["gpu_memory_gib"]) == ("Acme-X1", 60)
    assert calc_json("--gpu", "H100", "--gpu-file", str(f), *QWEN)["setup"]["gpu_memory_gib"] == 70
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - {name: Acme-X1, memory_gib: 60, bandwith_gbs: 1500, tflops: {bf16: 300}}\n")
    out = calc("--gpu", "Acme-X1", "--gpu-file", str(bad), *QWEN)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"vllm-drift calc: error: {bad}: gpus[0].bandwith_gbs: unknown key"


def test_unknown_device_is_described_not_refused():
    args = ("--gpu", "Mystery 9000", "--gpu-memory-gib", "40", "--gpu-tflops", "250", *QWEN)
    slow = calc_json(*args, "--gpu-bandwidth-gbs", "1000", "--concurrency", "1")
    fast = calc_json(*args, "--gpu-bandwidth-gbs", "2000", "--concurrency", "1")
    assert (slow["setup"]["gpu"], slow["setup"]["gpu_memory_gib"]) == ("Mystery 9000", 40)
    assert slow["kv_cache"]["tokens"] == fast["kv_cache"]["tokens"] > 0
    # decode at concurrency 1 reads the weights once a step: the bandwidth given is the one used
    assert fast["predicted"]["tpot_s"] < 0.7 * slow["predicted"]["tpot_s"]
    refused = calc("--gpu", "Mystery 9000", *QWEN)
    assert refused.returncode == 2 and "--gpu-memory-gib" in refused.stderr
    # memory alone does not turn a misspelt known name into a generic device
    typo = calc("--gpu", "H110", "--gpu-memory-gib", "79.19", *QWEN)
    assert typo.returncode == 2 and "H100-SXM-80GB" in typo.stderr
    # no name at all: memory describes the device, the rest from the catalog's medians
    generic = calc_json("--gpu-memory-gib", "40", *QWEN)
    assert (generic["setup"]["gpu"], generic["setup"]["gpu_memory_gib"]) == ("generic", 40)


def test_ambiguous_short_name_lists_the_variants():
    out = calc("--gpu", "V100", *QWEN)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "V100-SXM2-16GB" in out.stderr and "V100-SXM2-32GB" in out.stderr and "V100-PCIe-16GB" in out.stderr


def test_a_prediction_on_a_class_no_factor_was_fitted_on_says_so_and_what_public_runs_showed():
    """Hopper is the class the latency factors were fitted on; elsewhere calc names the prior and
    what public runs on that class measured (docs/model.md), and says how to calibrate it."""
    def caution(gpu, *extra):
        doc = calc_json("--gpu", gpu, *QWEN, "--concurrency", "8", *extra)
        return [n for n in doc["notes"] if "is a prior" in n], doc["predicted"]["basis"]

    assert caution("H100") == ([], "prior")
    (mi300,), _ = caution("MI300X")
    assert "MI300X (cdna3)" in mi300 and "40-56 %" in mi300 and "--calibrate" in mi300
    (a100,), _ = caution("A100-80GB")
    assert "8-17 %" in a100
    (t4,), _ = caution("RTX-2080-Ti-11GB", "--model", "Qwen/Qwen3-0.6B")
    assert "no public run on this class was checked" in t4
