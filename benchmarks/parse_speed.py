"""Parse speed: our exposition reader and `parse_vllm` against prometheus_client's stock parser,
measured in the same run on the real captures (issue 7 goal: >= 10x on the reader).

Variants per capture (best of interleaved rounds: the least disturbed run of each, as timeit
advises on a shared machine):
  stock      prometheus_client.parser.text_string_to_metric_families(text), all families
  cold       our Reader (vllm: families) with its caches emptied before every call: `scan`, a
             target's first scrape
  same       a warm Reader re-reading the identical payload (an idle server: values repeat)
  warm       a warm Reader reading the same series with values it has never seen (a busy
             server's next scrape): the daemon's steady state, and the headline figure
  warm+canon parse_vllm(bytes) on such payloads: warm reader + canonicalisation into Snapshots
             (what the daemon does per target scrape)

Run: .venv/bin/python benchmarks/parse_speed.py [CAPTURE.prom ...]
(default: ../shared/fixtures/prom/*.prom and tests/fixtures/vllm-cpu/*.prom when present)
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.parse import parse_vllm
from exporter.parse.exposition import Reader

ROOT = Path(__file__).resolve().parents[1]


def default_captures() -> list[Path]:
    paths = sorted((ROOT.parent / "shared" / "fixtures" / "prom").glob("*.prom"))
    paths += sorted((ROOT / "tests" / "fixtures" / "vllm-cpu").glob("*.prom"))
    return paths


def with_new_values(text: str, k: int) -> str:
    """The payload with every finite sample value changed (as the next scrape of a busy server
    would be): same series, values never seen before."""
    out = []
    for line in text.split("\n"):
        head, sep, value = line.rpartition(" ")
        if line.startswith("#") or not sep:
            out.append(line)
            continue
        try:
            v = float(value)
        except ValueError:
            out.append(line)
            continue
        out.append(f"{head} {v + k * 0.5 + 0.25!r}" if v == v and abs(v) != float("inf") else line)
    return "\n".join(out)


def measure(raw: bytes, rounds: int) -> dict[str, float]:
    text = raw.decode("utf-8")
    fresh = [with_new_values(text, k).encode() for k in range(rounds + 1)]
    cold_reader = Reader(("vllm:",))
    same_reader = Reader(("vllm:",))
    warm_reader = Reader(("vllm:",))
    canon_reader = Reader(("vllm:", "ray_vllm"))
    same_reader.parse(raw)
    warm_reader.parse(fresh[-1])
    parse_vllm(fresh[-1], target="bench", timestamp=0.0, reader=canon_reader)
    k = [0]

    def stock() -> None:
        for _ in text_string_to_metric_families(text):
            pass

    def cold() -> None:
        cold_reader.clear_cache()
        cold_reader.parse(raw)

    def same() -> None:
        same_reader.parse(raw)

    def warm() -> None:
        warm_reader.parse(fresh[k[0]])

    def canon() -> None:
        parse_vllm(fresh[k[0]], target="bench", timestamp=0.0, reader=canon_reader)

    variants = {"stock": stock, "cold": cold, "same": same, "warm": warm, "warm+canon": canon}
    times: dict[str, list[float]] = {name: [] for name in variants}
    clock = time.perf_counter
    for i in range(rounds):
        k[0] = i
        for name, fn in variants.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return {name: min(v) for name, v in times.items()}


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or default_captures()
    if not paths:
        print("no captures found (../shared/fixtures/prom next to the repo)", file=sys.stderr)
        return 2
    rounds = 200
    print(f"{'capture':<58} {'lines':>5} {'stock ms':>9} {'cold ms':>8} {'same ms':>8} "
          f"{'warm ms':>8} {'+canon ms':>9}  {'cold x':>6} {'warm x':>6} {'canon x':>7}")
    ratios_warm, ratios_canon, ratios_cold = [], [], []
    totals = {"stock": 0.0, "cold": 0.0, "warm": 0.0, "warm+canon": 0.0}
    for path in paths:
        raw = path.read_bytes()
        m = measure(raw, rounds)
        rc, rw, rn = m["stock"] / m["cold"], m["stock"] / m["warm"], m["stock"] / m["warm+canon"]
        for k in totals:
            totals[k] += m[k]
        ratios_cold.append(rc)
        ratios_warm.append(rw)
        ratios_canon.append(rn)
        lines = raw.count(b"\n") + (not raw.endswith(b"\n"))
        print(f"{path.name[:58]:<58} {lines:>5} {m['stock'] * 1e3:>9.3f} "
              f"{m['cold'] * 1e3:>8.3f} {m['same'] * 1e3:>8.3f} {m['warm'] * 1e3:>8.3f} "
              f"{m['warm+canon'] * 1e3:>9.3f}  {rc:>6.1f} {rw:>6.1f} {rn:>7.1f}")
    warm = totals["stock"] / totals["warm"]
    print(f"reader vs stock parser, warm (daemon steady state): {warm:.1f}x over all captures "
          f"(per capture {min(ratios_warm):.1f}x .. {max(ratios_warm):.1f}x); goal >= 10x: "
          f"{'met' if warm >= 10 else 'NOT met'}")
    print(f"reader vs stock, cold (first scrape, scan): {totals['stock'] / totals['cold']:.1f}x; "
          f"parse_vllm (warm reader + canonicalise) vs stock: {totals['stock'] / totals['warm+canon']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
