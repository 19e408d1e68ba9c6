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

Cross-validation (--cv): the fitted constants that matter on these rows (the sampler's bytes
per logit, which sets the profiled activation peak at 0.19, and the non-torch memory with and
without TP) are refitted from kv-memory-breakdown.csv WITHOUT one model family, and that
family's observation rows are predicted with them; the pooled held-out predictions are then
reported per family and per quantization. Every row is an H100, so no GPU class can be held
out here (the held-out data of issue 14 does that).

Usage: python benchmarks/accuracy_kv.py [--shared DIR] [--worst N] [--cv]
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from exporter.errors import InputError
from exporter.model import kv_cache
from exporter.model.kv_cache import GIB, kv_capacity
from exporter.model.setup import SMALL_SAMPLER, Setup, parse_version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_latency import family  # noqa: E402  (one family rule for both benchmarks)

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


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def fit_constants(breakdown: list[dict]) -> dict[str, float]:
    """The constants of kv_cache.CALIBRATION that these rows determine, from breakdown rows of a
    known version >= 0.17 at TP/PP given: the sampler's bytes per logit (the activation peak of a
    sampler-bound profile, minus the logits themselves) and the non-torch growth by topology."""
    per_logit, single, multi, pp = [], [], [], []
    for r in breakdown:
        v = _version(r["vllm_version"])
        if not v or parse_version(v) < SMALL_SAMPLER:
            continue
        tp, stages = int(r["tp"]), int(r["pp"] or 1)
        nt = float(r["non_torch_increase_gib"])
        (multi if tp > 1 else pp if stages > 1 else single).append(nt)
        try:
            s = Setup.build(r["model"], r["gpu"], tp=tp, pp=stages, dtype=r["dtype"] or "auto",
                            max_model_len=int(r["max_model_len"]), vllm_version=v,
                            max_num_batched_tokens=int(r["max_num_batched_tokens"]))
        except (InputError, ValueError):
            continue
        if s.model.is_moe or stages > 1 or s.model.extra_params:
            continue  # peak set by the forward / MoE workspace / encoder, not the sampler
        rows = min(s.max_num_seqs, s.max_num_batched_tokens)
        per_logit.append(float(r["peak_activation_gib"]) * GIB / (rows * s.model.vocab_size) - s.dtype_bytes)
    out = {}
    if per_logit:
        out["sampler_bytes_per_logit"] = _median(per_logit)
    if single:
        out["non_torch_single_gib"] = _median(single)
    if multi:
        out["non_torch_tp_nvswitch_gib"] = _median(multi)
    if pp:
        out["non_torch_pp_gib"] = _median(pp)
    return out


def cross_validate(shared: Path) -> list[dict]:
    """Leave one model family out: refit on the other families' breakdown rows, predict the
    family's observation rows. Returns the observation rows with their held-out error."""
    breakdown = list(csv.DictReader(open(shared / "fixtures" / "kv-memory-breakdown.csv")))
    obs = list(csv.DictReader(open(shared / "fixtures" / "kv-capacity-observations.csv")))
    shipped = dict(kv_cache.CALIBRATION)
    out = []
    try:
        for fam in sorted({family(r["model"]) for r in obs}):
            kv_cache.CALIBRATION.update(shipped)
            kv_cache.CALIBRATION.update(fit_constants([r for r in breakdown if family(r["model"]) != fam]))
            for r in obs:
                if family(r["model"]) != fam:
                    continue
                truth = truth_tokens(r)
                row = {"model": r["model"], "family": fam, "quant": _quant(r), "truth": truth}
                try:
                    pred = kv_capacity(observation_setup(r), check_fits=False).tokens
                    row["err"] = abs(pred - truth) / truth * 100
                except InputError:
                    row["err"] = 100.0
                row["unknowable"] = bool(re.search(r"PIPELINE PARALLEL|runtime --quantization", r.get("notes", "")))
                out.append(row)
    finally:
        kv_cache.CALIBRATION.clear()
        kv_cache.CALIBRATION.update(shipped)
    return out


def _quant(r: dict) -> str:
    name = r["model"].lower()
    for key, label in (("fp8", "fp8"), ("w8a8", "w8a8"), ("w4a16", "w4a16"), ("gpt-oss", "mxfp4")):
        if key in name:
            return label
    return "fp8-kv" if (r.get("kv_cache_dtype") or "auto") == "fp8" else "16-bit"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=SHARED)
    ap.add_argument("--worst", type=int, default=8)
    ap.add_argument("--cv", action="store_true", help="leave-one-model-family-out figures")
    a = ap.parse_args()
    if not (a.shared / "fixtures" / "kv-capacity-observations.csv").exists():
        print(f"no fixtures under {a.shared}", file=sys.stderr)
        return 2
    if a.cv:
        rows = cross_validate(a.shared)
        print("KV tokens MAPE, leave one model family out (constants refitted without it):")
        for label, key in (("family", "family"), ("quantization", "quant")):
            for k in sorted({r[key] for r in rows}):
                print(f"  {label} {k:<16} {_mape([r for r in rows if r[key] == k])}")
        print(f"  {'all held-out':<23} {_mape(rows)}")
        print(f"  {'w/o PP/runtime-quant':<23} {_mape([r for r in rows if not r['unknowable']])}"
              "  (the CSV has no pp/quantization column for those rows)")
        return 0
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
