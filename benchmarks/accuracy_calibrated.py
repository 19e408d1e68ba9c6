"""Accuracy of the calibrated latency model: fit on some concurrency levels, score on the others.

For each group of measured runs sharing model, GPU, TP, weight format and request lengths in
../shared/fixtures/throughput-observations.csv, the step-time model is calibrated
on the lowest and highest concurrency only — as a sweep would measure — and the levels between
are predicted, each as `calc --calibrate` answers it (what `checks/calibrated_latency.py` runs):
with the row's own vLLM release (`--vllm-version`), the KV dtype chosen by the rows when the CSV
gives none (`calibrate.choose_kv_cache`), then `calibrate.fit_setup` on the given rows (those of
the row's release when they span the same loads). Printed: TPOT
and TTFT mean absolute percentage error on those unseen levels, calibrated and a-priori, per
group and overall, and which rows the fit set aside as outliers.

  python benchmarks/accuracy_calibrated.py            # every group with >= 4 levels
  python benchmarks/accuracy_calibrated.py --groups 16  # the outside check's spread of 16 groups
  python benchmarks/accuracy_calibrated.py --fit-levels 3  # lowest, middle and highest seen

Never fitted and scored on the same rows.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from exporter.model.calibrate import Row, choose_kv_cache, fit_setup
from exporter.model.perf import predict
from exporter.model.setup import Setup
from exporter.model.traffic import Traffic

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CSV = SHARED / "fixtures" / "throughput-observations.csv"


def groups(path: Path) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["num_gpus"] == r["tp"] and r["tpot_ms"] and r["ttft_ms"]:
                out[(r["model"], r["gpu"], r["tp"], r["dtype"], r["input_len"], r["output_len"])].append(r)
    return {k: v for k, v in out.items() if len({r["concurrency"] for r in v}) >= 4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV)
    ap.add_argument("--groups", type=int, default=0, help="at most this many groups, spread evenly")
    ap.add_argument("--fit-levels", type=int, default=2, choices=(2, 3), help="levels given to the fit")
    a = ap.parse_args()
    if not a.csv.exists():
        print(f"accuracy_calibrated: {a.csv} not found (clone the project next to shared/)", file=sys.stderr)
        return 2
    data = groups(a.csv)
    keys = sorted(data)
    if a.groups and len(keys) > a.groups:
        keys = [keys[i * len(keys) // a.groups] for i in range(a.groups)]
    rows_all: list[tuple[float, float, float, float]] = []
    print(f"{'group':58s} {'n':>3s}  {'TPOT cal':>8s} {'prior':>6s}  {'TTFT cal':>8s} {'prior':>6s}  set aside")
    for key in keys:
        rows = sorted(data[key], key=lambda r: int(r["concurrency"]))
        levels = sorted({int(r["concurrency"]) for r in rows})
        seen = {levels[0], levels[-1]} | ({levels[len(levels) // 2]} if a.fit_levels == 3 else set())
        quant = {"fp8": "fp8", "fp4": "fp4"}.get(key[3])
        given = [Row(r["model"], r["gpu"], int(r["tp"]), r["dtype"], float(r["input_len"]),
                     float(r["output_len"]), float(r["concurrency"]), float(r["tpot_ms"]) / 1e3,
                     float(r["ttft_ms"]) / 1e3, i + 2, r["engine_version"] or None)
                 for i, r in enumerate(rows) if int(r["concurrency"]) in seen]
        traffic = Traffic(prompt_tokens_mean=float(key[4]), output_tokens_mean=float(key[5]))
        fits: dict[str | None, tuple] = {}

        def fitted(ver: str | None) -> tuple:
            """As calc --calibrate answers a row of release `ver`: the KV dtype chosen when not
            given, then the factors fitted on the given rows (of that release, when some are)."""
            if ver not in fits:
                setup0 = Setup.build(key[0], key[1], tp=int(key[2]), quantization=quant, vllm_version=ver,
                                     kv_cache_dtype=rows[0].get("kv_cache_dtype") or None)
                setup = setup0
                if not rows[0].get("kv_cache_dtype"):    # not given: as calc --calibrate, the rows choose
                    setup, _ = choose_kv_cache(setup0, given, quantization=quant, vllm_version=ver)
                fit, _ = fit_setup(setup, given, quantization=quant, vllm_version=ver)
                fits[ver] = (setup0, setup, fit)
            return fits[ver]

        errs = []
        for r in rows:
            c = int(r["concurrency"])
            if c in seen:
                continue
            ver = r["engine_version"] if r["engine_version"] not in ("", "unrecorded") else None
            setup0, setup, fit = fitted(ver)
            p1 = predict(setup, traffic, concurrency=c, calibration=fit.calibration)
            p0 = predict(setup0, traffic, concurrency=c)
            tpot, ttft = float(r["tpot_ms"]) / 1e3, float(r["ttft_ms"]) / 1e3
            errs.append((abs(p1.tpot_s - tpot) / tpot, abs(p0.tpot_s - tpot) / tpot,
                         abs(p1.ttft_s - ttft) / ttft, abs(p0.ttft_s - ttft) / ttft))
        setup0, setup, fit = fitted(next(iter(fits)) if fits else None)
        rows_all += errs
        m = [100 * sum(e[i] for e in errs) / len(errs) for i in range(4)] if errs else [0.0] * 4
        name = f"{key[0].split('/')[-1]} {key[1]} tp{key[2]} {key[3]} {key[4]}/{key[5]}"
        aside = ("KV " + setup.kv_cache_dtype + "; " if setup is not setup0 else "") + ", ".join(list(fit.outliers) + [f"{t} (TTFT)" for t in fit.ttft_aside]) + (f" REJECTED ({fit.rejected})" if fit.rejected else "")
        print(f"{name:58s} {len(errs):3d}  {m[0]:7.1f}% {m[1]:5.1f}%  {m[2]:7.1f}% {m[3]:5.1f}%  {aside}")
    n = len(rows_all)
    tot = [100 * sum(e[i] for e in rows_all) / max(n, 1) for i in range(4)]
    print(f"\n{len(keys)} groups, {n} unseen levels: TPOT MAPE {tot[0]:.1f}% calibrated vs {tot[1]:.1f}% a priori; "
          f"TTFT MAPE {tot[2]:.1f}% calibrated vs {tot[3]:.1f}% a priori")
    return 0


if __name__ == "__main__":
    sys.exit(main())
