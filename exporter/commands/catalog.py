"""`vllm-drift catalog`: list what the calculator knows — models, GPUs, workload profiles.

Why: `calc --model`/`--gpu`/`--profile` take catalog names; this is where to look them up, with
the numbers each entry carries (architecture, memory, bandwidth, price, profile assumptions).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter.errors import InputError

EXAMPLES = """examples:
  vllm-drift catalog gpus
  vllm-drift catalog models --json
  vllm-drift catalog profiles
"""
KINDS = ("models", "gpus", "profiles")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("catalog", help="list the catalog: models, GPUs or workload profiles",
                              description=__doc__.strip(), epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS, metavar="models|gpus|profiles", help="what to list")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(func=run)


def gpu_rows() -> list[dict[str, Any]]:
    from exporter.model.gpus import GPUS
    return [{"name": g.name, "vendor": g.vendor, "memory_gib": g.memory_gib,
             "hbm_bandwidth_tbps": g.hbm_bandwidth_tbps, "bf16_tflops": g.bf16_tflops,
             "fp8_tflops": g.fp8_tflops, "fp4_tflops": g.fp4_tflops, "interconnect": g.interconnect,
             "interconnect_gbps": g.interconnect_gbps, "dollars_per_hour": g.dollars_per_hour,
             "sources": dict(g.sources)} for g in GPUS.values()]


def model_rows() -> list[dict[str, Any]]:
    from exporter.model.architectures import catalog_ids, resolve_model
    rows = []
    for mid in catalog_ids():
        try:
            m = resolve_model(mid)
        except InputError as exc:   # a bad catalog entry is listed, not fatal
            rows.append({"id": mid, "error": str(exc)})
            continue
        rows.append({"id": mid, "params_b": round(m.total_params / 1e9, 2),
                     "active_params_b": round(m.active_params / 1e9, 2), "layers": m.num_layers,
                     "kv_heads": m.num_kv_heads, "max_position_embeddings": m.max_position_embeddings,
                     "dtype": m.native_dtype, "quantization": m.quantization, "moe": m.is_moe})
    return rows


def profile_rows() -> list[dict[str, Any]]:
    from exporter.model.profiles import profiles
    return [p.as_dict() for p in profiles().values()]


def run(args: argparse.Namespace) -> int:
    from exporter.reports import terminal
    rows = {"models": model_rows, "gpus": gpu_rows, "profiles": profile_rows}[args.kind]()
    if args.json:
        json.dump(rows, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    if args.kind == "profiles":
        terminal.print_profiles()
    elif args.kind == "gpus":
        terminal.console().print(terminal.grid(
            f"GPUs ({len(rows)})", ["name", "vendor", "GiB", "TB/s", "BF16 TFLOPS", "FP8 TFLOPS", "interconnect",
                                    "GB/s", "$/hour"],
            [(g["name"], g["vendor"], g["memory_gib"], g["hbm_bandwidth_tbps"], g["bf16_tflops"], g["fp8_tflops"],
              g["interconnect"], g["interconnect_gbps"], g["dollars_per_hour"]) for g in rows],
            caption="sources per number: vllm-drift catalog gpus --json"))
    else:
        terminal.console().print(terminal.grid(
            f"Models ({len(rows)})", ["id", "params (B)", "active (B)", "layers", "KV heads", "context", "dtype",
                                      "quantization"],
            [(m["id"], m.get("params_b"), m.get("active_params_b"), m.get("layers"), m.get("kv_heads"),
              m.get("max_position_embeddings"), m.get("dtype"), m.get("quantization") or m.get("error"))
             for m in rows]))
    return 0
