"""Where the daemon's CPU goes per target, in one process, without sockets: the method behind
docs/scaling.md's per-step figures (issue 20).

N targets each receive a real vLLM capture whose counters move from scrape to scrape (every
counter, histogram bucket, sum and count grows by a per-line step, so no two consecutive bodies are
equal, as on a busy server). The script drives the daemon's own steps as `serve` does: parse +
observe for every target each scrape, evaluation + /metrics block rendering for every target each
second scrape (evaluation 30 s, scrape 15 s), one publish per scrape cycle and the daemon's
collector regime (young generations collected and frozen every simulated second); and prints the
time per target per step. `--profile FILE` writes a cProfile of the measured cycles (read it with
`python -m pstats FILE`). In the daemon every step costs more than here (the event loop, aiohttp,
sockets, the loopback fleet sharing the cores): use `benchmarks/scale.py --profile DIR` (py-spy)
for the whole picture.

usage: .venv/bin/python benchmarks/profile_daemon.py [--targets 500] [--cycles 12] [--warm 8]
       [--capture ../shared/fixtures/prom/vllm-0.10.1-v1-ngc2509-qwen3-4b.prom] [--profile FILE]
       [--evaluate-every 2] [--gpu L4] [--window 600] [--static]
`--evaluate-every 1 --gpu "" --window 60 --static` is the outside scale check's load (an
evaluation per scrape, a 60 s window, a capture that names no GPU: no online calibration, served
unchanged on every scrape: a steady server whose evaluations keep their samples). Machines this size
vary by +-20 % between runs: compare two code trees by alternating runs in one session, not
across sessions.
"""
from __future__ import annotations

import argparse
import cProfile
import re
import sys
import time
from pathlib import Path

from exporter.config import Config, EvaluationConfig, ScrapeConfig, TargetSpec
from exporter.daemon import Daemon, TargetState
from exporter.parse import parse_vllm

DEFAULT_CAPTURE = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "prom" / \
    "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"
MOVING = re.compile(r"^(vllm:\S*(?:_total|_count|_sum|_bucket)(?:\{[^}]*\})?) (\S+)$")


def bodies(text: str, n: int) -> list[bytes]:
    """n consecutive scrapes of `text`: every counter-like sample grows by its own step."""
    lines = text.splitlines()
    moving = [(i, m.group(1), float(m.group(2))) for i, line in enumerate(lines) if (m := MOVING.match(line))]
    out = []
    for k in range(n):
        cur = list(lines)
        for j, (i, head, value) in enumerate(moving):
            cur[i] = f"{head} {value + k * (1 + j % 7)}"
        out.append(("\n".join(cur) + "\n").encode())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--cycles", type=int, default=12, help="measured scrape cycles")
    ap.add_argument("--warm", type=int, default=8, help="scrape cycles before measuring")
    ap.add_argument("--capture", default=str(DEFAULT_CAPTURE))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--evaluate-every", type=int, default=2, metavar="K",
                    help="evaluate every K-th scrape cycle (2: evaluation 30 s, scrape 15 s; 1: the "
                         "outside check's evaluation 10 s)")
    ap.add_argument("--window", type=float, default=600.0,
                    help="evaluation window in seconds (the outside scale check uses 60)")
    ap.add_argument("--gpu", default="L4", help="GPU hint of every target ('' for none: no online "
                                                 "calibration, as with a capture that names no GPU)")
    ap.add_argument("--static", action="store_true",
                    help="serve the capture unchanged on every scrape (the outside check's targets)")
    args = ap.parse_args()
    if not Path(args.capture).is_file():
        print(f"capture not found: {args.capture}", file=sys.stderr)
        return 2
    text = Path(args.capture).read_text()
    scrapes = [text.encode()] * (args.warm + args.cycles) if args.static else bodies(text, args.warm + args.cycles)
    urls = [f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000" for i in range(args.targets)]
    d = Daemon(Config(listen="127.0.0.1:0", scrape=ScrapeConfig(interval=15.0, timeout=5.0),
                      evaluation=EvaluationConfig(interval=30.0, window=args.window),
                      targets=[TargetSpec(url=u, gpu=args.gpu or None) for u in urls]))
    for u in urls:
        d.targets[u] = TargetState(d.discovery.targets()[u])
    spent = {"parse": 0.0, "observe": 0.0, "evaluate": 0.0, "render": 0.0, "publish": 0.0, "gc": 0.0}
    # the daemon's collector regime: young generations collected and frozen every second
    # (`Daemon._gc_maintenance`, run by `_gc_tick`); here every 1/15 of a scrape cycle's targets
    per_second = max(1, args.targets // 15)
    done = 0

    def tick(measuring: bool) -> None:
        """One target's step done: every `per_second` of them, the collector's turn."""
        nonlocal done
        done += 1
        if done % per_second:
            return
        a = time.perf_counter()
        d._gc_maintenance()
        if measuring:
            spent["gc"] += time.perf_counter() - a
    prof = cProfile.Profile() if args.profile else None
    t0 = time.time() - 15.0 * (args.warm + args.cycles)
    for k, body in enumerate(scrapes):
        measuring = k >= args.warm
        if measuring and prof is not None and k == args.warm:
            prof.enable()
        now = t0 + 15.0 * k
        for url, st in d.targets.items():
            a = time.perf_counter()
            snaps = parse_vllm(body, target=url, timestamp=now)
            b = time.perf_counter()
            d._restarted(st, snaps)
            d._observe(st, snaps, now)
            c = time.perf_counter()
            if measuring:
                spent["parse"] += b - a
                spent["observe"] += c - b
            tick(measuring)
        if k % args.evaluate_every == args.evaluate_every - 1:
            for st, model, pipe in d._due(now):
                a = time.perf_counter()
                d._evaluate_one(st, model, pipe, now)
                b = time.perf_counter()
                d.exposition.prerender(d._view(st.spec.url, st))
                c = time.perf_counter()
                if measuring:
                    spent["evaluate"] += b - a
                    spent["render"] += c - b
                tick(measuring)
        a = time.perf_counter()
        d.publish()
        d.exposition.render_parts()
        if measuring:
            spent["publish"] += time.perf_counter() - a
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    per = {k: v / (args.targets * args.cycles) * 1e3 for k, v in spent.items()}
    total = sum(per.values())
    print(f"{args.targets} targets, {args.cycles} scrape cycles measured (evaluation every "
          f"{args.evaluate_every} cycle(s), GPU hint {args.gpu or 'none'})")
    for k, v in per.items():
        print(f"  {k:9s} {v:.3f} ms per target per scrape cycle")
    print(f"  {'total':9s} {total:.3f} ms  -> {total * args.targets / 15.0 / 10:.1f} % of a core at "
          f"{args.targets} targets every 15 s; {total * 10000 / 15.0 / 10:.1f} % at 10,000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
