"""Convert NVIDIA aiconfigurator's measured serving table (`silicon_sample.csv`, public) into the
columns of ../shared/fixtures/throughput-observations.csv, so the accuracy benchmarks and the
outside checks run on GPUs and models the shipped factors were not fitted to.

  git clone https://github.com/ai-dynamo/aiconfigurator
  python benchmarks/aic_rows.py aiconfigurator/aic-core/src/aiconfigurator_core/systems/silicon_sample.csv \
      --gpu B200 --gpu H200 > /tmp/heldout.csv
  python benchmarks/accuracy_latency.py --csv /tmp/heldout.csv
  python benchmarks/accuracy_calibrated.py --csv /tmp/heldout.csv

Only vLLM rows of aggregated serving with plain tensor parallelism are kept (no attention data
parallelism, expert parallelism or pipeline stages: what `calc --tp N` describes). The table is
not copied into this repository; this script reads a clone of it.

The extra column `kv_cache_dtype` says what the harness ran: aiconfigurator deploys every
checkpoint it classes fp8 / fp8_block / nvfp4 with an FP8 KV cache (an FP8 attention quant mode
brings `kvcache_quant_mode = fp8`, aiconfigurator_core/sdk/models/helpers.py, rendered as vLLM's
`--kv-cache-dtype`), and the rows agree: their concurrency at a full pool is what an FP8 cache
holds, not a BF16 one. The outside checks do not read the column (they pass what the shared
table names); the benchmarks do, like `calc --kv-cache-dtype`.
"""
from __future__ import annotations

import argparse
import csv
import sys

from exporter.loadgen import calibration

SYSTEMS = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-180GB",
           "b300_sxm": "B300-288GB", "gb200": "GB200-186GB"}
FP8_KV_MODES = {"fp8", "fp8_block", "fp8_static", "nvfp4"}   # quant modes aiconfigurator runs with FP8 KV


def convert(path: str, gpus: list[str]) -> list[dict]:
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            gpu = SYSTEMS.get(r.get("system", ""))
            if (r.get("backend") != "vllm" or r.get("mode") != "agg" or gpu is None
                    or (gpus and not any(g.upper() in gpu.upper() for g in gpus))):
                continue
            if (r.get("attention_dp_size") not in ("", "1") or r.get("moe_ep_size") not in ("", "0", "1")
                    or r.get("pp_size") != "1" or not r.get("silicon_tpot_ms") or not r.get("silicon_ttft_ms")):
                continue
            # MoE rows whose experts are split over more GPUs than attention (tp 1 with moe_tp 2:
            # two GPUs) are not plain TP: their GPU count says so, and num_gpus != tp is what
            # the benchmarks and the outside checks skip (dense rows carry moe_tp 1 for any tp)
            moe_gpus = int(r.get("moe_tp_size") or 1) * int(r.get("moe_ep_size") or 1)
            gpus_used = moe_gpus if moe_gpus > 1 and moe_gpus != int(r["tp_size"]) else int(r["tp_size"])
            out.append({"model": r["model_path"], "gpu": gpu, "tp": r["tp_size"],
                        "dtype": r["precision"] or "bf16", "input_len": r["isl"], "output_len": r["osl"],
                        "concurrency": r["batch_size"], "output_tok_s": "",
                        "tpot_ms": r["silicon_tpot_ms"], "ttft_ms": r["silicon_ttft_ms"],
                        "source": "aiconfigurator silicon_sample.csv", "num_gpus": str(gpus_used),
                        "engine": "vllm", "engine_version": r.get("backend_version") or "unrecorded",
                        "output_tok_s_derived": "", "notes": r.get("id", ""),
                        "kv_cache_dtype": "fp8" if {r.get("gemm_quant_mode"), r.get("moe_quant_mode")} & FP8_KV_MODES
                        else "auto"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("silicon_csv")
    ap.add_argument("--gpu", action="append", default=[], help="keep these GPUs (substring, repeatable)")
    a = ap.parse_args()
    try:
        rows = convert(a.silicon_csv, a.gpu)
    except OSError as e:
        print(f"aic_rows: cannot read {a.silicon_csv}: {e.strerror}", file=sys.stderr)
        return 2
    calibration.write_to(sys.stdout, rows, extra=("kv_cache_dtype",))
    print(f"aic_rows: {len(rows)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
