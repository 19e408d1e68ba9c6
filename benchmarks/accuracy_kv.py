"""Accuracy of the KV-capacity model against measured vLLM startups (a benchmark, not a test).

Reads ../shared/fixtures/kv-capacity-observations.csv (startup lines: "GPU KV cache size",
"# GPU blocks") and kv-memory-breakdown.csv (the same runs with vLLM's memory split), runs the
predictor in-process with the same arguments the outside check passes to `vllm-drift calc`,
and prints the mean absolute percentage error of KV tokens and of max concurrency per dataset,
overall, for the held-out split, and the worst rows. The CSVs carry the "GPU KV cache size"
line, not the concurrency line, so the true concurrency is derived from the logged tokens with
vLLM's block arithmetic: its error differs from the token error only where the block rounding
of hybrid groups does.

Held-out split: the calibration constants in exporter/model/kv_cache.py were fitted on the runs
that have a memory breakdown (kv-memory-breakdown.csv); observation rows for setups absent from
that file (other TP degrees, other models, other versions) were not looked at while fitting.

Usage: python benchmarks/accuracy_kv.py [--shared DIR] [--worst N]
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from exporter.errors import InputError
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _version(v: str) -> str | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v or "")
    return f"{m.group(1)}.{m.group(2)}.{m.group(3) or 0}" if m else None


def observation_setup(r: dict) -> Setup:
    """The Setup the outside check asks `calc` for (it passes no --pp nor --quantization)."""
    return Setup.build(r["model"], r["gpu"], tp=int(r["tp"]), dtype=r["dtype"],
                       kv_cache_dtype=r["kv_cache_dtype"] or "auto",
                       gpu_memory_utilization=float(r["gpu_memory_utilization"]),
                       gpu_memory_gib=float(r["gpu_mem_gib"]), max_model_len=int(r["max_model_len"]),
                       block_size=int(r["block_size"] or 16), vllm_version=_version(r["vllm_version"]))


def truth_tokens(r: dict) -> int:
    if r["reported_kv_tokens"]:
        return int(r["reported_kv_tokens"])
    return int(r["reported_gpu_blocks"]) * int(r["block_size"] or 16)


def _key(r: dict) -> tuple:
    return (r["model"].lower(), r["tp"], r["max_model_len"], r.get("kv_cache_dtype") or "auto",
            r["gpu_memory_utilization"])


def evaluate(shared: Path) -> list[dict]:
    obs = list(csv.DictReader(open(shared / "fixtures" / "kv-capacity-observations.csv")))
    fitted = {_key(r) for r in csv.DictReader(open(shared / "fixtures" / "kv-memory-breakdown.csv"))}
    results = []
    for r in obs:
        truth = truth_tokens(r)
        row = {"model": r["model"], "gpu": r["gpu"], "tp": r["tp"], "truth": truth,
               "held_out": _key(r) not in fitted, "dataset": "v" + (_version(r["vllm_version"]) or "?"),
               "notes": r.get("notes", "")}
        try:
            s = observation_setup(r)
            cap = kv_capacity(s, check_fits=False)
            row["pred"] = cap.tokens
            row["err"] = abs(cap.tokens - truth) / truth * 100
            # truth concurrency: the logged tokens over one request's blocks (same block math)
            bpr = cap.blocks_per_request
            true_blocks = truth / cap.block_size * max(cap.num_groups, 1) if cap.num_groups > 1 else truth / cap.block_size
            row["conc_err"] = abs(cap.max_concurrency - true_blocks / bpr) / (true_blocks / bpr) * 100
        except InputError as exc:
            row["pred"], row["err"], row["conc_err"], row["why"] = None, 100.0, 100.0, str(exc)
        results.append(row)
    return results


def _mape(rows: list[dict], key: str = "err") -> str:
    vals = [r[key] for r in rows]
    return f"{sum(vals) / len(vals):6.2f}% over {len(vals):2d} rows" if vals else "   n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--worst", type=int, default=8)
    a = ap.parse_args()
    if not (a.shared / "fixtures" / "kv-capacity-observations.csv").exists():
        print(f"no fixtures under {a.shared}", file=sys.stderr)
        return 2
    rows = evaluate(a.shared)
    print("KV tokens MAPE / max-concurrency MAPE")
    for ds in sorted({r["dataset"] for r in rows}):
        sub = [r for r in rows if r["dataset"] == ds]
        print(f"  {ds:10s} tokens {_mape(sub)}   concurrency {_mape(sub, 'conc_err')}")
    fit = [r for r in rows if not r["held_out"]]
    held = [r for r in rows if r["held_out"]]
    print(f"  {'fitted':10s} tokens {_mape(fit)}   concurrency {_mape(fit, 'conc_err')}")
    print(f"  {'held-out':10s} tokens {_mape(held)}   concurrency {_mape(held, 'conc_err')}")
    print(f"  {'overall':10s} tokens {_mape(rows)}   concurrency {_mape(rows, 'conc_err')}")
    unknowable = [r for r in rows if re.search(r"PIPELINE PARALLEL|runtime --quantization", r["notes"])]
    rest = [r for r in rows if r not in unknowable]
    print(f"  {'w/o PP/runtime-quant rows (the CSV has no pp/quantization column)':10s}: "
          f"tokens {_mape(rest)}")
    print("worst rows:")
    for r in sorted(rows, key=lambda r: -r["err"])[: a.worst]:
        pred = "failed: " + r.get("why", "")[:90] if r["pred"] is None else f"predicted {r['pred']}"
        tag = " [held-out]" if r["held_out"] else ""
        print(f"  {r['err']:7.2f}%  {r['model']} {r['gpu']} tp{r['tp']}{tag}: truth {r['truth']} {pred}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
