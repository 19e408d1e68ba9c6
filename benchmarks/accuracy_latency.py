"""Accuracy of the latency model (TPOT, TTFT) on measured vLLM rows, and its calibration fit.

Reads ../shared/fixtures/throughput-observations.csv (rows with num_gpus == tp, as the outside
check does), predicts each row at its fixed concurrency and prints TPOT/TTFT mean absolute
percentage error per model x GPU, per GPU and overall, and the worst rows.

  python benchmarks/accuracy_latency.py                 # evaluate the shipped calibration
  python benchmarks/accuracy_latency.py --fit           # refit the Hopper factors on all rows
  python benchmarks/accuracy_latency.py --holdout H200  # fit without rows matching H200, report them
  python benchmarks/accuracy_latency.py --holdout gpt-oss
  python benchmarks/accuracy_latency.py --cv            # leave-one-GPU / -family-out figures
  python benchmarks/accuracy_latency.py --csv heldout.csv --class-cv blackwell
      # would a class of its own beat the carried-over factors? Fit the class on all but one
      # model family of its rows, score that family, against the shipped (carried-over) factors

The fit is a plain Nelder-Mead (no numpy) minimising the mean |pred/measured - 1| of TPOT plus half
that of TTFT (capped per row), plus a weak prior on each factor's log (PRIOR, PRIOR_WEIGHT), over
rows with concurrency <= 256 (the c=512 rows are internally inconsistent: TPOT lower than at
c=64). A GEMM format with fewer than MIN_FORMAT_ROWS training rows takes the other format's
efficiency. Fitted factors are per GPU class, never per model.

Last, the rows whose TPOT is under what the GPU's datasheet allows at their own load (perf.tpot_floor_s)
are listed and the figures repeated without them: a row no physics explains measures the row.
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
# fitted factors and their scale (the optimiser works on factor / scale); flops_eff_fp4 only from
# rows that run FP4 GEMMs (`identifiable`): none here (gpt-oss MXFP4 runs dequantised on Hopper)
PARAMS = {"bw_eff": 1.0, "flops_eff_bf16": 1.0, "flops_eff_fp8": 1.0, "step_overhead_s": 1e-3,
          "layer_sync_s": 1e-6, "per_token_s": 1e-6, "per_seq_s": 1e-6, "moe_bw_eff": 1.0,
          "ttft_steps": 1.0, "moe_flops_eff": 1.0, "queue_factor": 0.01, "ttft_prefill_factor": 1.0,
          "attn_bw_eff": 1.0, "sample_sort_s": 1e-5, "layer_s": 1e-5,
          "flops_eff_fp4": 1.0}


def load_rows(path: Path = CSV) -> list[dict]:
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f)
                if r["num_gpus"] == r["tp"] and r["tpot_ms"] and r["ttft_ms"]]


_CACHE: dict = {}


def _prepared(r: dict):
    kv = r.get("kv_cache_dtype") or None    # when the table says what the run had (aic_rows.py); else as calc
    key = (r["model"], r["gpu"], r["tp"], r["dtype"], r["engine_version"], kv)
    if key not in _CACHE:
        q = {"fp8": "fp8", "fp4": "fp4"}.get(r["dtype"])
        v = r["engine_version"] if r["engine_version"] not in ("", "unrecorded") else None
        s = Setup.build(r["model"], r["gpu"], tp=int(r["tp"]), quantization=q, vllm_version=v,
                        kv_cache_dtype=kv)
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
        # a row of another GPU class (held-out Blackwell rows) is predicted with that class's
        # factors, as `calc` predicts it; `cal` is the Hopper fit being evaluated or refitted
        gpu = _prepared(r)[1].gpu_name
        o = predict_row(r, cal if perf.gpu_class(gpu) == cal.gpu_class else perf.calibration_for(gpu))
        tp, tt = float(r["tpot_ms"]) / 1e3, float(r["ttft_ms"]) / 1e3
        # a setup calc refuses (the weights do not fit) counts 100 %, as in the outside check
        e_tp = abs(o.tpot_s - tp) / tp * 100 if math.isfinite(o.tpot_s) else 100.0
        e_tt = abs(o.ttft_s - tt) / tt * 100 if math.isfinite(o.ttft_s) else 100.0
        out.append((e_tp, e_tt, r, o))
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
    for label, i in (("TPOT", 0), ("TTFT", 1)) if worst else ():
        print(f"  worst {label}:")
        for e in sorted(errs, key=lambda x: -x[i])[:worst]:
            r, o = e[2], e[3]
            print(f"    {e[i]:7.1f}%  {r['model']} {r['gpu']} tp{r['tp']} c{r['concurrency']} "
                  f"{r['input_len']}/{r['output_len']}: measured tpot {r['tpot_ms']} ms ttft {r['ttft_ms']} ms;"
                  f" predicted {o.tpot_s * 1e3:.2f} / {o.ttft_s * 1e3:.1f} ms (capacity {o.capacity:.0f})")
    return _mape(errs, 0), _mape(errs, 1)


def _tied(cal: perf.Calibration, names: list[str]) -> perf.Calibration:
    """A GEMM format without enough rows takes the other format's fitted efficiency (both are
    shares of their own dtype's dense peak), rather than a prior or a fit to a handful of rows."""
    if "flops_eff_fp8" not in names and "flops_eff_bf16" in names:
        fp4 = cal.flops_eff_fp4 if "flops_eff_fp4" in names else cal.flops_eff_bf16
        return replace(cal, flops_eff_fp8=cal.flops_eff_bf16, flops_eff_fp4=fp4)
    if "flops_eff_bf16" not in names and "flops_eff_fp8" in names:
        return replace(cal, flops_eff_bf16=cal.flops_eff_fp8)
    return cal


def _objective(rows: list[dict], base: perf.Calibration, names: list[str]):
    def f(x: list[float]) -> float:
        if any(v <= 0 for v in x):
            return 1e9
        cal = _tied(replace(base, **{n: v * PARAMS[n] for n, v in zip(names, x)}), names)
        if any(getattr(cal, n) > 1.0 for n in ("bw_eff", "flops_eff_bf16", "flops_eff_fp8", "moe_flops_eff",
                                                  "moe_bw_eff", "attn_bw_eff")):
            return 1e9  # efficiencies are shares of a datasheet peak
        if cal.bw_eff > BW_EFF_MAX:
            return 1e9  # no kernel streams HBM at its datasheet rate (see BW_EFF_MAX)
        total = 0.0
        for r in rows:
            o = predict_row(r, cal)
            # the figures reported (and checked) are mean absolute percentage errors: fit those
            total += abs(o.tpot_s * 1e3 / float(r["tpot_ms"]) - 1.0)
            total += 0.5 * min(abs(min(o.ttft_s * 1e3, 1e12) / float(r["ttft_ms"]) - 1.0), 1.5)
        # a weak prior on the log of each factor (a factor e away from PRIOR costs one point of
        # the objective's MAPE): keeps factors the rows barely tell apart (step overhead vs.
        # bandwidth vs. per-request costs when one family is held out) from trading to
        # unphysical values, as calibrate.fit_rows' Gaussian prior does
        reg = sum(math.log(v * PARAMS[n] / PRIOR[n]) ** 2 for n, v in zip(names, x))
        return total / len(rows) + PRIOR_WEIGHT * reg
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


# Highest share of datasheet HBM bandwidth a weight-streaming GEMV reaches: STREAM-type copy
# kernels measure ~90-93 % of 3.35 TB/s on H100 SXM (HBM3) and of 4.8 TB/s on H200 (NVIDIA's
# nvbandwidth / BabelStream reports); a fit beyond it is absorbing another term's error.
BW_EFF_MAX = 0.93

PRIOR_WEIGHT = 0.01
MIN_FORMAT_ROWS = 10
# Neutral starting point of a cross-validation fit: round physical guesses, not the shipped fit
# (which saw every row), so a fold's held-out rows cannot leak in through the start.
PRIOR = {"bw_eff": 0.8, "flops_eff_bf16": 0.5, "flops_eff_fp8": 0.5, "flops_eff_fp4": 0.5, "step_overhead_s": 1e-3,
         "layer_sync_s": 20e-6, "per_token_s": 2.5e-6, "per_seq_s": 1e-6, "moe_bw_eff": 0.9,
         "ttft_steps": 3.0, "moe_flops_eff": 0.8, "queue_factor": 0.03, "ttft_prefill_factor": 1.0,
         "attn_bw_eff": 0.8, "sample_sort_s": 2e-5, "layer_s": 10e-6}


def identifiable(rows: list[dict]) -> list[str]:
    """The factors these rows can determine: MoE factors need MoE rows, a GEMM efficiency needs
    rows of its format. The others keep their starting value (in CV: the neutral prior)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["dtype"]] = counts.get(r["dtype"], 0) + 1
    # a GEMM efficiency needs rows of its format from more than one setup: three rows of one
    # sweep (Qwen3-32B fp8) would fit its prefill quirks, not the format (else: tied, `_tied`)
    quants = {q for q, n in counts.items() if n >= MIN_FORMAT_ROWS}
    fp4_gemms = sum(_prepared(r)[1].compute_dtype == "fp4" for r in rows) >= MIN_FORMAT_ROWS
    moe = any(family(r["model"]) == "gpt-oss" or "-A" in r["model"] for r in rows)
    names = []
    for n in PARAMS:
        if n.startswith("moe_") and not moe:
            continue
        if n == "flops_eff_bf16" and "bf16" not in quants:
            continue
        if n == "flops_eff_fp8" and "fp8" not in quants:
            continue
        if n == "flops_eff_fp4" and not fp4_gemms:
            continue
        names.append(n)
    return names


def fit(rows: list[dict], base: perf.Calibration, iters: int) -> perf.Calibration:
    train = [r for r in rows if int(r["concurrency"]) <= 256]
    names = identifiable(train)
    x0 = [max(getattr(base, n) / PARAMS[n], 0.5) if n not in ("bw_eff", "moe_bw_eff", "attn_bw_eff") else
          min(getattr(base, n), 0.9) / PARAMS[n] for n in names]
    x = nelder_mead(_objective(train, base, names), x0, iters=iters)
    return _tied(replace(base, **{n: v * PARAMS[n] for n, v in zip(names, x)}), names)


def family(model: str) -> str:
    """Model family of a Hugging Face id, for leave-one-family-out folds: the first word of the
    name without org, size or variant (Qwen/Qwen3-32B -> qwen3, meta-llama/Llama-3.1-70B and
    RedHatAI/Meta-Llama-3.1-8B-... -> llama, openai/gpt-oss-120b -> gpt-oss)."""
    stem = model.split("/")[-1].lower().removeprefix("meta-")
    first = stem.split("-")[0]
    return "gpt-oss" if first == "gpt" else first


def quant_of(r: dict) -> str:
    return {"fp8": "fp8", "fp4": "mxfp4"}.get(r["dtype"], "bf16")


def cross_validate(rows: list[dict], base: perf.Calibration, iters: int) -> dict[str, tuple[float, float, int]]:
    """Leave one GPU out and leave one model family out: fit on the rest (c <= 256), predict the
    held-out rows. Returns {fold: (TPOT MAPE, TTFT MAPE, n)} plus pooled groups per GPU and per
    quantization over every held-out prediction (each row predicted by a fit that never saw it:
    by its family fold)."""
    out: dict[str, tuple[float, float, int]] = {}
    sane = [r for r in rows if int(r["concurrency"]) <= 256]
    folds = [("gpu", g) for g in sorted({r["gpu"] for r in sane})]
    folds += [("family", f) for f in sorted({family(r["model"]) for r in sane})]
    pooled: list = []
    for kind, key in folds:
        held = [r for r in sane if (r["gpu"] if kind == "gpu" else family(r["model"])) == key]
        train = [r for r in sane if r not in held]
        cal = fit(train, replace(base, **PRIOR), iters)
        errs = errors(held, cal)
        out[f"leave out {kind} {key}"] = (_mape(errs, 0), _mape(errs, 1), len(errs))
        if kind == "family":
            pooled += errs
    for label, keyf in (("GPU", lambda r: r["gpu"]), ("quantization", quant_of)):
        groups: dict[str, list] = {}
        for e in pooled:
            groups.setdefault(keyf(e[2]), []).append(e)
        for k, g in sorted(groups.items()):
            out[f"held-out {label} {k}"] = (_mape(g, 0), _mape(g, 1), len(g))
    out["held-out all (family folds)"] = (_mape(pooled, 0), _mape(pooled, 1), len(pooled))
    return out


def class_cv(rows: list[dict], cls: str, iters: int) -> list[tuple[str, int, float, float, float, float]]:
    """Leave one model family out within the rows of GPU class `cls`: fit that class's factors
    (from its shipped calibration, so nothing of the held-out family leaks in) on the other
    families, predict the held-out one. Returns (family, n, TPOT shipped, TTFT shipped, TPOT
    fitted-without-it, TTFT fitted-without-it) per family and a pooled "all" row. A class whose
    rows run FP4 GEMMs (Blackwell) fits flops_eff_fp4 as well (`identifiable`)."""
    sane = [r for r in rows if int(r["concurrency"]) <= 256
            and perf.gpu_class(_prepared(r)[1].gpu_name) == cls]
    base = perf.calibration_for(_prepared(sane[0])[1].gpu_name)
    out, pooled_s, pooled_f = [], [], []
    for fam in sorted({family(r["model"]) for r in sane}):
        held = [r for r in sane if family(r["model"]) == fam]
        train = [r for r in sane if family(r["model"]) != fam]
        names = identifiable(train)
        x0 = [getattr(base, n) / PARAMS[n] for n in names]
        x = nelder_mead(_objective(train, base, names), x0, iters=iters)
        cal = replace(base, **{n: v * PARAMS[n] for n, v in zip(names, x)})
        es, ef = errors(held, base), errors(held, cal)
        pooled_s += es
        pooled_f += ef
        out.append((fam, len(held), _mape(es, 0), _mape(es, 1), _mape(ef, 0), _mape(ef, 1)))
    out.append(("all", len(pooled_s), _mape(pooled_s, 0), _mape(pooled_s, 1), _mape(pooled_f, 0),
                _mape(pooled_f, 1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--fit", action="store_true", help="refit the Hopper factors on all rows")
    ap.add_argument("--holdout", metavar="TEXT", help="fit on rows whose model/GPU lacks TEXT, report those with it")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--cv", action="store_true",
                    help="cross-validate: leave one GPU out, leave one model family out (c <= 256)")
    ap.add_argument("--class-cv", metavar="CLASS",
                    help="leave one model family out within GPU class CLASS: shipped factors vs a class fit")
    a = ap.parse_args()
    if not a.csv.exists():
        print(f"no data: {a.csv} missing", file=sys.stderr)
        return 2
    rows = load_rows(a.csv)
    base = perf.CALIBRATIONS["hopper"]
    if a.class_cv:
        print(f"{a.class_cv}: each model family predicted by the shipped factors and by a fit of the "
              "class on its other families (c <= 256):")
        for fam, n, ts, tts, tf, ttf in class_cv(rows, a.class_cv, a.iters):
            print(f"  {fam:<10} n={n:>3}  shipped TPOT {ts:5.1f}% TTFT {tts:5.1f}%   "
                  f"fitted without it TPOT {tf:5.1f}% TTFT {ttf:5.1f}%")
        return 0
    if a.cv:
        print("cross-validated (fitted without the held-out rows, c <= 256):")
        for k, (tp, tt, n) in cross_validate(rows, base, a.iters).items():
            print(f"  {k:<40} n={n:>3}  TPOT MAPE {tp:6.1f}%  TTFT MAPE {tt:6.1f}%")
        print("  (GPU classes: every row is Hopper, so 'leave out GPU' holds out H100 or H200, "
              "not a class)")
        return 0
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
    below = below_floor(rows)
    print(f"== rows faster than the GPU's datasheet allows at their own load (perf.tpot_floor_s: no "
          f"model factor, 100 % of bandwidth and peak FLOPS): {len(below)} of {len(rows)}")
    for r, floor in below:
        print(f"    {r['model']} {r['gpu']} tp{r['tp']} c{r['concurrency']} {r['input_len']}/{r['output_len']}: "
              f"measured TPOT {float(r['tpot_ms']):.2f} ms, floor {floor * 1e3:.2f} ms")
    if below:
        out = {id(r) for r, _ in below}
        report([r for r in rows if id(r) not in out], cal, "all rows but those", worst=0)
    return 0


def below_floor(rows: list[dict]) -> list[tuple[dict, float]]:
    """The rows whose measured TPOT is under `perf.tpot_floor_s` at their own load, with it."""
    out = []
    for r in rows:
        tpot = float(r["tpot_ms"]) / 1e3
        floor = perf.tpot_floor_s(_prepared(r)[0], prompt_tokens=float(r["input_len"]),
                                  output_tokens=float(r["output_len"]), concurrency=float(r["concurrency"]),
                                  tpot_s=tpot, ttft_s=float(r["ttft_ms"]) / 1e3)
        if tpot < floor:
            out.append((r, floor))
    return out


if __name__ == "__main__":
    sys.exit(main())
