"""Calibration rows: one per measured level, in the columns of the shared
`fixtures/throughput-observations.csv` (what `calc --calibrate` and the daemon's
`calibration_files:` read).

model, gpu, tp, dtype: what the server said or the user told (`--model`, `--gpu`, `--tp`,
`--dtype`); input_len / output_len: mean `usage` token counts of the level, rounded; concurrency:
the level's concurrency (rate levels: the measured mean requests in flight, by Little's law,
rounded, at least 1); output_tok_s: measured output tokens/s; tpot_ms / ttft_ms: the level's MEAN
TPOT and TTFT in ms; output_tok_s_derived: concurrency x output_len / (TTFT + (output_len - 1) x
TPOT), the shared file's cross-check; source: `vllm-drift sweep URL`; notes: the level's p50/p99s,
its request counts and, for rate levels, the offered rate.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import IO, Any, Sequence

COLUMNS = ("model", "gpu", "tp", "dtype", "input_len", "output_len", "concurrency", "output_tok_s",
           "tpot_ms", "ttft_ms", "source", "num_gpus", "engine", "engine_version",
           "output_tok_s_derived", "notes")


def _r(v: float | None, nd: int = 3) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def rows(levels: Sequence[dict[str, Any]], *, model: str, gpu: str, tp: int, dtype: str,
         source: str, engine_version: str = "", key: str = "concurrency") -> list[dict[str, str]]:
    out = []
    for lv in levels:
        if not lv.get("completed") or lv.get("tpot_mean_s") is None or lv.get("ttft_mean_s") is None:
            continue
        out_len = lv.get("output_tokens_mean") or 0
        in_len = lv.get("prompt_tokens_mean")
        if key == "concurrency":
            conc = int(lv["concurrency"])
        else:
            conc = max(1, int(round(lv.get("in_flight_mean") or 1)))
        ttft, tpot = lv["ttft_mean_s"], lv["tpot_mean_s"]
        derived = conc * out_len / (ttft + max(out_len - 1, 0) * tpot) if out_len else None
        notes = [f"ttft_p50_ms={lv['ttft_p50_s'] * 1e3:.2f}", f"ttft_p99_ms={lv['ttft_p99_s'] * 1e3:.2f}",
                 f"tpot_p50_ms={lv['tpot_p50_s'] * 1e3:.3f}", f"tpot_p99_ms={lv['tpot_p99_s'] * 1e3:.3f}",
                 f"requests={lv['completed']}/{lv['requests']}"]
        if key == "rate":
            notes.append(f"rate={lv['rate']:g}/s")
        if lv.get("partial"):
            notes.append("partial level (interrupted)")
        out.append({
            "model": model, "gpu": gpu, "tp": str(tp), "dtype": dtype,
            "input_len": "" if in_len is None else str(int(round(in_len))),
            "output_len": str(int(round(out_len))), "concurrency": str(conc),
            "output_tok_s": _r(lv.get("output_tokens_per_s"), 2), "tpot_ms": _r(tpot * 1e3),
            "ttft_ms": _r(ttft * 1e3, 2), "source": source, "num_gpus": str(tp), "engine": "vllm",
            "engine_version": engine_version, "output_tok_s_derived": _r(derived, 1),
            "notes": " | ".join(notes),
        })
    return out


def write(path: str | Path, data: Sequence[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        write_to(fh, data)


def write_to(fh: IO[str], data: Sequence[dict[str, str]], extra: Sequence[str] = ()) -> None:
    """`data` as CSV on an open text stream, in COLUMNS then the `extra` ones (the public-table
    converters in benchmarks/ add `kv_cache_dtype`)."""
    w = csv.DictWriter(fh, fieldnames=[*COLUMNS, *extra])
    w.writeheader()
    w.writerows(data)
