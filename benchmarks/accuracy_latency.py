"""Accuracy of the latency model (TPOT, TTFT) on measured vLLM rows, and its calibration fit.

Reads ../shared/fixtures/throughput-observations.csv (rows with num_gpus == tp, as the outside
check does), predicts each row at its fixed concurrency and prints TPOT/TTFT mean absolute
percentage error per model x GPU, per GPU and overall, and the worst rows.

  python benchmarks/accuracy_latency.py                 # evaluate the shipped calibration
  python benchmarks/accuracy_latency.py --fit           # refit the Hopper factors on all rows
  python benchmarks/accuracy_latency.py --holdout H200  # fit without rows matching H200, report them
  python benchmarks/accuracy_latency.py --holdout gpt-oss

The fit is a plain Nelder-Mead (no numpy) minimising mean |log(pred/measured)| of TPOT plus half
that of TTFT (capped per row), over rows with concurrency <= 256 (the c=512 rows are internally
inconsistent: TPOT lower than at c=64). Fitted factors are per GPU class, never per model.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import replace
from pathlib import Path

from exporter.model import perf
from exporter.model.setup import Setup

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CSV = SHARED / "fixtures" / "throughput-observations.csv"
PARAMS = {"bw_eff": 1.0, "flops_eff_bf16": 1.0, "flops_eff_fp8": 1.0, "step_overhead_s": 1e-3,
          "layer_sync_s": 1e-6, "per_token_s": 1e-6, "ttft_steps": 1.0, "moe_flops_eff": 1.0,
          "queue_factor": 0.01, "ttft_prefill_factor": 1.0}


def load_rows(path: Path = CSV) -> list[dict]:
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f)
                if r["num_gpus"] == r["tp"] and r["tpot_ms"] and r["ttft_ms"]]


_CACHE: dict = {}


def _prepared(r: dict):
    key = (r["model"], r["gpu"], r["tp"], r["dtype"], r["engine_version"])
    if key not in _CACHE:
        q = {"fp8": "fp8", "fp4": "fp4"}.get(r["dtype"])
        v = r["engine_version"] if r["engine_version"] not in ("", "unrecorded") else None
        s = Setup.build(r["model"], r["gpu"], tp=int(r["tp"]), quantization=q, vllm_version=v)
        _CACHE[key] = (s, perf.shape_for(s), perf.kv_tokens_for(s))
    return _CACHE[key]


def predict_row(r: dict, cal: perf.Calibration) -> perf.Operating:
    s, shape, kv = _prepared(r)
    return perf.steady_state(shape, cal, prompt=float(r["input_len"]), output=float(r["output_len"]),
                             hit=0.0, max_batched_tokens=s.max_num_batched_tokens,
                             max_seqs=s.max_num_seqs, kv_tokens=kv, block_size=s.block_size,
                             clients=float(r["concurrency"]))


def errors(rows: list[dict], cal: perf.Calibration) -> list[tuple[float, float, dict, perf.Operating]]:
    out = []
    for r in rows:
        o = predict_row(r, cal)
        tp, tt = float(r["tpot_ms"]) / 1e3, float(r["ttft_ms"]) / 1e3
        out.append((abs(o.tpot_s - tp) / tp * 100, abs(o.ttft_s - tt) / tt * 100, r, o))
    return out


def _mape(errs, i: int) -> float:
    return sum(e[i] for e in errs) / max(len(errs), 1)


def report(rows: list[dict], cal: perf.Calibration, title: str, worst: int = 8) -> tuple[float, float]:
    errs = errors(rows, cal)
    print(f"== {title}: {len(errs)} rows")
    groups: dict[str, list] = {}
    for e in errs:
        groups.setdefault(f"{e[2]['model']} on {e[2]['gpu']}", []).append(e)
        groups.setdefault(f"GPU {e[2]['gpu']}", []).append(e)
    for k in sorted(groups):
        g = groups[k]
        print(f"  {k:<55} n={len(g):>3}  TPOT MAPE {_mape(g, 0):6.1f}%  TTFT MAPE {_mape(g, 1):7.1f}%")
    print(f"  {'overall':<55} n={len(errs):>3}  TPOT MAPE {_mape(errs, 0):6.1f}%  TTFT MAPE {_mape(errs, 1):7.1f}%")
    for label, i in (("TPOT", 0), ("TTFT", 1)):
        print(f"  worst {label}:")
        for e in sorted(errs, key=lambda x: -x[i])[:worst]:
            r, o = e[2], e[3]
            print(f"    {e[i]:7.1f}%  {r['model']} {r['gpu']} tp{r['tp']} c{r['concurrency']} "
                  f"{r['input_len']}/{r['output_len']}: measured tpot {r['tpot_ms']} ms ttft {r['ttft_ms']} ms;"
                  f" predicted {o.tpot_s * 1e3:.2f} / {o.ttft_s * 1e3:.1f} ms (capacity {o.capacity:.0f})")
    return _mape(errs, 0), _mape(errs, 1)


def _objective(rows: list[dict], base: perf.Calibration, names: list[str]):
    def f(x: list[float]) -> float:
        if any(v <= 0 for v in x):
            return 1e9
        cal = replace(base, **{n: v * PARAMS[n] for n, v in zip(names, x)})
        if any(getattr(cal, n) > 1.0 for n in ("bw_eff", "flops_eff_bf16", "flops_eff_fp8", "moe_flops_eff")):
            return 1e9  # efficiencies are shares of a datasheet peak
        total = 0.0
        for r in rows:
            o = predict_row(r, cal)
            total += abs(math.log(o.tpot_s * 1e3 / float(r["tpot_ms"])))
            total += 0.5 * min(abs(math.log(min(o.ttft_s * 1e3, 1e12) / float(r["ttft_ms"]))), 1.5)
        return total / len(rows)
    return f


def nelder_mead(f, x0: list[float], iters: int = 400, step: float = 0.1) -> list[float]:
    """Minimal Nelder-Mead (standard coefficients)."""
    n = len(x0)
    simplex = [list(x0)] + [[x * (1 + step) if i == j else x for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(exp)
            simplex[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q)] for q in simplex[1:]]
                vals = [vals[0]] + [f(p) for p in simplex[1:]]
    i = min(range(n + 1), key=lambda k: vals[k])
    return simplex[i]


def fit(rows: list[dict], base: perf.Calibration, iters: int) -> perf.Calibration:
    names = list(PARAMS)
    train = [r for r in rows if int(r["concurrency"]) <= 256]
    x0 = [getattr(base, n) / PARAMS[n] for n in names]
    x = nelder_mead(_objective(train, base, names), x0, iters=iters)
    return replace(base, **{n: v * PARAMS[n] for n, v in zip(names, x)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--fit", action="store_true", help="refit the Hopper factors on all rows")
    ap.add_argument("--holdout", metavar="TEXT", help="fit on rows whose model/GPU lacks TEXT, report those with it")
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    if not a.csv.exists():
        print(f"no data: {a.csv} missing", file=sys.stderr)
        return 2
    rows = load_rows(a.csv)
    base = perf.CALIBRATIONS["hopper"]
    if a.holdout:
        key = a.holdout.lower()
        held = [r for r in rows if key in (r["model"] + " " + r["gpu"]).lower()]
        train = [r for r in rows if r not in held]
        cal = fit(train, base, a.iters)
        print(f"fitted on {len(train)} rows without {a.holdout!r}: {cal}")
        report(train, cal, f"fitted rows (without {a.holdout})", worst=3)
        report(held, cal, f"held-out rows ({a.holdout})")
        sane = [r for r in held if int(r["concurrency"]) <= 256]
        if len(sane) < len(held):
            report(sane, cal, f"held-out rows ({a.holdout}), c <= 256", worst=0)
        report(held, base, f"held-out rows ({a.holdout}) with the shipped calibration", worst=0)
        return 0
    cal = fit(rows, base, a.iters) if a.fit else base
    if a.fit:
        print(f"refitted: {cal}")
    report(rows, cal, "all rows (shipped calibration)" if not a.fit else "all rows (refitted)")
    sane = [r for r in rows if int(r["concurrency"]) <= 256]
    report(sane, cal, "rows with c <= 256 (the c=512 gpt-oss rows report TPOT below their c=64 TPOT)",
           worst=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
