"""What a one-shot command loads as it starts: only its own command module (not the daemon's
pipeline and scraper), no huggingface_hub for a catalog model with nothing in the HF cache, and
the catalogs through libyaml's C parser. Speed itself is measured in benchmarks/cli_start.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from exporter import yamlfile
from exporter.cli import COMMANDS, build_parser

PROBE = """
import json, sys
from exporter.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in
      ("aiohttp", "huggingface_hub", "exporter") and m.count(".") <= 1)}), file=sys.stderr)
"""


def loaded_by(cli_env, tmp_path, *argv: str) -> tuple[int, set[str], str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                       env=cli_env, timeout=120, cwd=tmp_path)
    report = json.loads(r.stderr.strip().splitlines()[-1])
    return report["code"], set(report["loaded"]), r.stdout


def test_calc_of_a_catalog_model_loads_neither_the_daemon_nor_the_hub_client(cli_env, tmp_path):
    code, loaded, out = loaded_by(cli_env, tmp_path, "calc", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                                  "--gpu", "H100", "--json")
    assert code == 0 and json.loads(out)["kv_cache"]["tokens"] > 0
    assert "exporter.commands" in loaded and "exporter.model" in loaded
    for absent in ("aiohttp", "huggingface_hub", "exporter.pipeline", "exporter.scrape", "exporter.sim"):
        assert absent not in loaded, absent


def test_a_model_outside_the_catalog_still_reaches_the_hf_cache_and_names_it(cli_env, tmp_path):
    """The shortcut skips huggingface_hub only when the cache has no folder for the repository;
    the error still says where it looked."""
    code, loaded, _ = loaded_by(cli_env, tmp_path, "calc", "--model", "acme/not-a-model-7b", "--gpu", "H100")
    assert code == 2 and "huggingface_hub" in loaded   # the Hub was tried (offline or unreachable)
    r = subprocess.run(["vllm-drift", "calc", "--model", "acme/not-a-model-7b", "--gpu", "H100"],
                       capture_output=True, text=True, env={**cli_env, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert r.returncode == 2 and f"not in HF cache at {cli_env['HF_HUB_CACHE']}" in r.stderr


def test_every_command_is_still_listed_and_a_typo_is_named(cli_env):
    help_text = build_parser().format_help()
    assert all(name in help_text for name in COMMANDS)
    assert [a.dest for a in build_parser("calc")._subparsers._group_actions[0]._get_subactions()] == ["calc"]
    r = subprocess.run(["vllm-drift", "cal"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'cal'" in r.stderr and "'calc'" in r.stderr


def test_catalog_yaml_reads_the_same_with_either_parser_and_errors_keep_their_line():
    from importlib import resources
    text = resources.files("exporter.model").joinpath("data/models.yaml").read_text(encoding="utf-8")
    assert yamlfile.safe_load(text) == yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506
    if yaml.__with_libyaml__:
        assert yamlfile._LOADER is yaml.CSafeLoader
    with pytest.raises(yaml.YAMLError) as exc:
        yamlfile.safe_load("targets:\n  - url: http://a\n   bad: [1\n")
    assert exc.value.problem_mark.line + 1 == 3
