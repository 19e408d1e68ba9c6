"""`vllm-drift catalog models|gpus|profiles [--json]`: every catalog entry, as a table or JSON."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.cli import main
from exporter.model.architectures import catalog_ids
from exporter.model.gpus import GPUS
from exporter.model.profiles import profiles


def test_gpus_json_lists_every_catalog_gpu(capsys):
    assert main(["catalog", "gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(GPUS)
    h100 = next(r for r in rows if r["name"] == "H100-SXM-80GB")
    assert h100["memory_gib"] == GPUS["H100-SXM-80GB"].memory_gib and h100["dollars_per_hour"] > 0


def test_models_json_lists_every_catalog_model(capsys):
    assert main(["catalog", "models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == catalog_ids()
    llama = next(r for r in rows if r["id"] == "meta-llama/Llama-3.1-8B-Instruct")
    assert llama["layers"] == 32 and llama["kv_heads"] == 8 and 7.5 < llama["params_b"] < 8.5


def test_profiles_json_and_tables(capsys):
    assert main(["catalog", "profiles", "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)] == list(profiles())
    for kind, needle in (("gpus", "H100-SXM-80GB"), ("models", "meta-llama/Llama-3.1-8B-Instruct"),
                         ("profiles", "long-document")):
        assert main(["catalog", kind]) == 0
        assert needle in capsys.readouterr().out


def test_unknown_kind_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "exporter", "catalog", "tpus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "models|gpus|profiles" in r.stderr or "invalid choice" in r.stderr


@pytest.mark.parametrize("command", ["calc", "catalog"])
def test_help_has_examples(command):
    r = subprocess.run([sys.executable, "-m", "exporter", command, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    examples = [line for line in r.stdout.splitlines() if line.strip().startswith("vllm-drift ")]
    assert len(examples) >= 2


@pytest.mark.parametrize("module", ["calc", "catalog"])
def test_help_examples_work(module, tmp_path, monkeypatch, capsys):
    import importlib
    import shlex
    monkeypatch.chdir(tmp_path)   # --html examples write into the test's folder
    examples = importlib.import_module(f"exporter.commands.{module}").EXAMPLES
    for line in examples.splitlines():
        line = line.strip()
        if line.startswith("vllm-drift "):
            assert main(shlex.split(line)[1:]) == 0, line
            capsys.readouterr()
