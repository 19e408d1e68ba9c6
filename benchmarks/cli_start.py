"""Start-up cost of the one-shot commands (`calc`, `catalog`, `scan`), which scripts and the outside
checks call hundreds of times: wall time of each as a fresh process, against a floor run in the
same session, the interpreter importing the libraries those commands cannot do without
(numpy, pydantic, structlog, PyYAML). Also, in this process, the built-in catalogs read by
PyYAML's C parser against its pure-Python one (what `exporter.yamlfile` chooses).

Best of --rounds interleaved runs for each (the least disturbed one on a shared machine).

Run: .venv/bin/python benchmarks/cli_start.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "fixtures" / "vllm-cpu"

FLOOR = [sys.executable, "-c", "import numpy, pydantic, structlog, yaml"]


def commands() -> dict[str, list[str]]:
    exe = [sys.executable, "-m", "exporter"]
    out = {
        "calc (catalog model)": exe + ["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                                       "--json"],
        "calc --tp 4 (MoE, workload)": exe + ["calc", "--model", "openai/gpt-oss-120b", "--gpu", "H100", "--tp", "4",
                                              "--prompt-tokens", "1024", "--output-tokens", "1024",
                                              "--concurrency", "32", "--json"],
        "catalog models": exe + ["catalog", "models", "--json"],
        "--help": exe + ["--help"],
    }
    captures = sorted(CAPTURE.glob("*.prom"))
    if captures:
        out["scan (one capture)"] = exe + ["scan", str(captures[0]), "--json"]
    return out


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    took = time.perf_counter() - t
    if done.returncode not in (0, 1):   # scan exits 1 when it has findings
        raise SystemExit(f"{' '.join(cmd[2:])}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return took


def yaml_ratio(rounds: int) -> tuple[float, float]:
    texts = [resources.files("exporter.model").joinpath(f"data/{n}").read_text(encoding="utf-8")
             for n in ("models.yaml", "gpus.yaml", "profiles.yaml")]
    best = {}
    for loader in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)) * rounds:
        t = time.perf_counter()
        for text in texts:
            yaml.load(text, Loader=loader)  # noqa: S506 - safe loaders
        best[loader] = min(best.get(loader, 1e9), time.perf_counter() - t)
    py, c = best[yaml.SafeLoader], best[getattr(yaml, "CSafeLoader", yaml.SafeLoader)]
    return py, c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    cmds = commands()
    best = {name: float("inf") for name in ["floor", *cmds]}
    for _ in range(a.rounds):
        best["floor"] = min(best["floor"], wall(FLOOR))
        for name, cmd in cmds.items():
            best[name] = min(best[name], wall(cmd))
    floor = best.pop("floor")
    print(f"floor (python importing numpy, pydantic, structlog, yaml): {floor * 1000:.0f} ms")
    for name, t in best.items():
        print(f"  {name:30s} {t * 1000:6.0f} ms  {t / floor:4.1f}x the floor")
    py, c = yaml_ratio(a.rounds)
    print(f"built-in catalogs (models, gpus, profiles .yaml): pure-Python parser {py * 1000:.0f} ms, "
          f"C parser {c * 1000:.0f} ms ({py / c:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
