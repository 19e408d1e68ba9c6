"""Convert SemiAnalysis InferenceMAX's sweep aggregates (`agg_bmk.json`, public GitHub Actions
artifacts) into the columns of ../shared/fixtures/throughput-observations.csv, so the accuracy
benchmarks and the outside checks run on a second public harness beside aiconfigurator's
(benchmarks/aic_rows.py).

  git clone https://github.com/gminneci/mantile     # a verbatim copy of the artifacts
  python benchmarks/imx_rows.py mantile/reconcile/sources/inferencemax/raw > /tmp/imx.csv
  python benchmarks/accuracy_latency.py --csv /tmp/imx.csv

Only single-instance vLLM rows are kept: no disaggregation, no attention data parallelism, no
expert parallelism, no speculative decoding (what `calc --tp N` describes). Each run's row is a
row of its own (repeated runs of one configuration stay separate).

The client (InferenceMAX's fork of vLLM's benchmark_serving.py, utils/bench_serving) draws each
request's input and output lengths uniformly from [ratio x nominal, nominal] with
`--random-range-ratio` 0.8 (the workflow default, benchmark-tmpl.yml), so the columns carry the
mean, 0.9 x nominal rounded to a token; `notes` keeps the nominal lengths and the run. B200 servers run an FP8 KV
cache (`kv-cache-dtype: fp8` in their config.yaml), Hopper ones vLLM's default.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from exporter.loadgen import calibration

GPUS = {"b200": "B200-180GB", "h200": "H200-SXM-141GB", "h100": "H100-SXM-80GB"}


def convert(paths: list[Path], ratio: float) -> list[dict]:
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("agg_bmk.json")))
    out = []
    for f in files:
        data = json.loads(f.read_text())
        for r in data if isinstance(data, list) else [data]:
            gpu = GPUS.get(str(r.get("hw", "")).lower())
            if (r.get("framework") != "vllm" or r.get("disagg") or gpu is None
                    or str(r.get("dp_attention")).lower() != "false"
                    or r.get("spec_decoding") != "none" or int(r.get("ep", 1)) != 1):
                continue
            mean = (1.0 + ratio) / 2.0
            run = f.parent.name
            out.append({"model": r["model"], "gpu": gpu, "tp": str(r["tp"]), "dtype": r["precision"],
                        "input_len": str(round(r["isl"] * mean)), "output_len": str(round(r["osl"] * mean)),
                        "concurrency": str(r["conc"]),
                        "output_tok_s": f"{r['output_tput_per_gpu'] * r['tp']:.1f}",
                        "tpot_ms": f"{r['mean_tpot'] * 1e3:.4f}", "ttft_ms": f"{r['mean_ttft'] * 1e3:.2f}",
                        "source": "SemiAnalysis InferenceMAX agg_bmk.json", "num_gpus": str(r["tp"]),
                        "engine": "vllm", "engine_version": str(r["image"]).rsplit(":v", 1)[-1],
                        "output_tok_s_derived": "",
                        "notes": f"{run}; nominal {r['isl']}/{r['osl']}, range ratio {ratio:g}",
                        "kv_cache_dtype": "fp8" if gpu.startswith("B200") else "auto"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="agg_bmk.json files or folders holding them")
    ap.add_argument("--range-ratio", type=float, default=0.8,
                    help="the client's --random-range-ratio (lengths uniform in [ratio, 1] x nominal)")
    a = ap.parse_args()
    missing = [str(p) for p in a.paths if not p.exists()]
    if missing:
        print(f"imx_rows: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = convert(a.paths, a.range_ratio)
    calibration.write_to(sys.stdout, rows, extra=("kv_cache_dtype",))
    print(f"imx_rows: {len(rows)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
