"""Per-level statistics with `vllm bench serve`'s definitions, and the knee rule.

Per level (measured requests only, warm-up excluded): duration is the first measured request's
start to the last one's end; output/total tokens per second are the `usage` token sums over that
duration; TTFT, TPOT = (E2E - TTFT) / (output tokens - 1) per request, ITL (every gap between
text chunks, pooled over requests) and E2E as mean and p50/p90/p99 (numpy's linear percentiles,
as vLLM's benchmark uses).

The knee: going from one level to the next, the throughput gain per doubling of concurrency (or
rate) is (T2/T1) ** (1 / log2(c2/c1)) - 1; the first level whose next level gains less than
`KNEE_GAIN` (10 %) is the knee ("saturated"). With an SLO (`ttft_slo`/`tpot_slo`, checked
against p99), a level that breaks it makes the level before it the knee ("slo"). Whichever comes
first in level order wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from exporter.loadgen.client import RequestResult

KNEE_GAIN = 0.10
PCTS = (50, 90, 99)


def _dist(prefix: str, values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    out[f"{prefix}_mean_s"] = float(arr.mean()) if arr.size else None
    for p in PCTS:
        out[f"{prefix}_p{p}_s"] = float(np.percentile(arr, p)) if arr.size else None
    return out


def summarize(results: Sequence[RequestResult]) -> dict[str, Any]:
    """Throughput and latency figures of one level's measured requests."""
    ok = [r for r in results if r.ok]
    doc: dict[str, Any] = {"requests": len(results), "completed": len(ok),
                           "failed": len(results) - len(ok)}
    if ok:
        t0 = min(r.start for r in ok)
        t1 = max(r.end for r in ok)
        dur = max(t1 - t0, 1e-9)
        out_tok = sum(r.output_tokens or 0 for r in ok)
        in_tok = sum(r.prompt_tokens or 0 for r in ok)
        doc.update({
            "duration_s": dur,
            "request_throughput": len(ok) / dur,
            "output_tokens_per_s": out_tok / dur,
            "total_tokens_per_s": (out_tok + in_tok) / dur,
            "prompt_tokens_mean": in_tok / len(ok) if all(r.prompt_tokens is not None for r in ok) else None,
            "output_tokens_mean": out_tok / len(ok),
            # Little's law: requests in flight on average over the window
            "in_flight_mean": sum(r.e2e for r in ok) / dur,
            "usage_reported": all(r.usage_reported for r in ok),
        })
    else:
        doc.update({"duration_s": None, "request_throughput": None, "output_tokens_per_s": None,
                    "total_tokens_per_s": None, "prompt_tokens_mean": None,
                    "output_tokens_mean": None, "in_flight_mean": None, "usage_reported": False})
    doc.update(_dist("ttft", [r.ttft for r in ok]))
    doc.update(_dist("tpot", [r.tpot for r in ok]))
    doc.update(_dist("itl", [g for r in ok for g in r.itl]))
    doc.update(_dist("e2e", [r.e2e for r in ok]))
    errors = sorted({r.error for r in results if not r.ok and r.error})
    doc["errors"] = errors[:5]
    return doc


@dataclass(frozen=True)
class Knee:
    index: int            # position in the levels list
    level: float          # its concurrency (or rate)
    reason: str           # "saturated" | "slo"
    detail: str

    def as_dict(self, key: str) -> dict[str, Any]:
        return {key: self.level, "index": self.index, "reason": self.reason, "detail": self.detail}


def gain_per_doubling(x1: float, t1: float, x2: float, t2: float) -> float | None:
    if not (x1 > 0 and x2 > x1 and t1 and t1 > 0 and t2 is not None):
        return None
    return (t2 / t1) ** (1.0 / math.log2(x2 / x1)) - 1.0


def find_knee(levels: Sequence[dict[str, Any]], key: str = "concurrency", *,
              ttft_slo: float | None = None, tpot_slo: float | None = None,
              gain: float = KNEE_GAIN) -> Knee | None:
    """The knee by the rule in the module docstring, or None when throughput still grows (and
    every SLO holds) at the last level."""
    unit = "concurrent requests" if key == "concurrency" else "requests/s"
    for i, lv in enumerate(levels):
        broken = []
        if ttft_slo is not None and lv.get("ttft_p99_s") is not None and lv["ttft_p99_s"] > ttft_slo:
            broken.append(f"TTFT p99 {lv['ttft_p99_s'] * 1e3:.0f} ms > {ttft_slo * 1e3:.0f} ms")
        if tpot_slo is not None and lv.get("tpot_p99_s") is not None and lv["tpot_p99_s"] > tpot_slo:
            broken.append(f"TPOT p99 {lv['tpot_p99_s'] * 1e3:.1f} ms > {tpot_slo * 1e3:.1f} ms")
        if broken:
            if i == 0:
                return Knee(0, lv[key], "slo", f"the SLO breaks already at {lv[key]:g} {unit}: "
                            + "; ".join(broken))
            prev = levels[i - 1]
            return Knee(i - 1, prev[key], "slo", f"{lv[key]:g} {unit} breaks the SLO ("
                        + "; ".join(broken) + f"); {prev[key]:g} is the last level that meets it")
        if i == 0:
            continue
        prev = levels[i - 1]
        g = gain_per_doubling(prev[key], prev.get("output_tokens_per_s") or 0.0, lv[key],
                              lv.get("output_tokens_per_s"))
        if g is not None and g < gain:
            return Knee(i - 1, prev[key], "saturated",
                        f"{prev[key]:g} -> {lv[key]:g} {unit} adds {g * 100:+.1f} % output throughput "
                        f"per doubling (< {gain * 100:.0f} %)")
    return None
