"""Soak: `vllm-drift serve` against a churning simulated fleet for a compressed hour; does its
memory or CPU grow once it is warm?

Fleet: one `vllm-drift simulate --fleet POOL` process (real HTTP on loopback). The daemon finds
its targets through a Prometheus file_sd file that this script rewrites every `--churn` seconds,
swapping a share of the active targets for others from the pool (targets come and go, windows
are created and dropped). 10% of the active targets fail: half refuse connections (no listener),
half answer HTTP 500, a few hang until the scrape timeout.

Compression: scrape every 1 s instead of 15 s, evaluate every 2 s instead of 30 s, so a
240 s run holds the scrape and evaluation cycles of an hour at the defaults. The state is saved
(state_dir) as in production.

Reports, every `--every` seconds: daemon RSS (MiB), CPU (% of one core over the interval),
scrape cycles, targets; then the drift after warm-up (first `--warmup` share of the run; the 60 s window fills in the first quarter):
RSS slope by least squares (MiB per compressed hour) and CPU in the first vs last quarter
after warm-up. Goal: no growth after warm-up. Asserts nothing.

usage: .venv/bin/python benchmarks/soak.py [--seconds 240] [--active 100] [--pool 150]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


COMPRESSION = 15.0   # scrape every 1 s instead of the default 15 s (evaluation 2 s instead of 30 s)


def _cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    return [int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0] / 1024


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class BadServers:
    """Loopback servers that answer 500, or accept and never answer."""

    def __init__(self, n500: int, nhang: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.urls500: list[str] = []
        self.urls_hang: list[str] = []
        ready = threading.Event()

        async def err(reader, writer):
            try:
                while await reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                body = b"<html>Internal Server Error</html>"
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                await writer.drain()
            except ConnectionError:
                pass
            writer.close()

        async def hang(reader, writer):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

        async def main():
            for handler, n, out in ((err, n500, self.urls500), (hang, nhang, self.urls_hang)):
                for _ in range(n):
                    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
                    out.append(f"127.0.0.1:{srv.sockets[0].getsockname()[1]}")
            ready.set()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.create_task(main())
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)


def write_sd(path: Path, targets: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": targets, "labels": {"gpu": "L4"}}]))
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=240.0, help="run length (240 s = an hour at 15 s scrapes)")
    ap.add_argument("--active", type=int, default=100, help="targets watched at any time")
    ap.add_argument("--pool", type=int, default=150, help="simulated targets to churn through")
    ap.add_argument("--churn", type=float, default=10.0, help="seconds between file_sd rewrites")
    ap.add_argument("--churn-share", type=float, default=0.1, help="share of active targets swapped per rewrite")
    ap.add_argument("--every", type=float, default=10.0, help="report interval (s)")
    ap.add_argument("--warmup", type=float, default=0.4, help="share of the run treated as warm-up")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="vllm-drift-soak-"))
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")

    n_fail = max(1, round(0.1 * args.active))
    n_hang = max(1, n_fail // 5)
    n500 = max(1, (n_fail - n_hang) // 2)
    n_refused = n_fail - n_hang - n500
    bad = BadServers(n500, n_hang)
    refused = [f"127.0.0.1:{_free_port()}" for _ in range(n_refused)]
    failing = bad.urls500 + bad.urls_hang + refused

    sim = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--fleet", str(args.pool), "--port", "0",
                            "--speed", "5", "--duration", str(args.seconds + 120)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                           start_new_session=True)
    daemon = None
    try:
        pool = [sim.stdout.readline().strip().split("://", 1)[1] for _ in range(args.pool)]
        n_good = args.active - n_fail
        active = rng.sample(pool, n_good)
        sd = work / "targets.json"
        write_sd(sd, active + failing)
        cfg = work / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 0.5s, jitter: 0.1s}\n"
                       "evaluation: {interval: 2s, window: 60s}\n"
                       f"file_sd: ['{sd}']\nfile_sd_refresh: 1s\nstate_dir: {work / 'state'}\n")
        port = _free_port()
        log = open(work / "daemon.log", "wb")
        daemon = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(cfg),
                                   "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=log, env=env)
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/-/healthy", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        print(f"soak: {args.active} active targets ({n_fail} failing: {n500} HTTP 500, {n_refused} refused, "
              f"{n_hang} hanging) from a pool of {args.pool}; churn {args.churn_share:.0%} every {args.churn:g} s; "
              f"{args.seconds:g} s run (scrape 1 s, eval 2 s)")
        print(f"{'t_s':>6} {'rss_mib':>8} {'cpu_pct':>8} {'cycles':>7} {'targets':>8} {'up':>5} {'cycle_s':>7} {'metrics_ms':>10}")
        t0 = time.monotonic()
        next_churn, next_report = t0 + args.churn, t0 + args.every
        last_cpu, last_t = _cpu_s(daemon.pid), t0
        rows = []
        added = removed = 0
        while time.monotonic() - t0 < args.seconds:
            now = time.monotonic()
            if now >= next_churn:
                k = max(1, round(args.churn_share * n_good))
                out = rng.sample(active, k)
                spare = [u for u in pool if u not in active]
                inn = rng.sample(spare, min(k, len(spare)))
                active = [u for u in active if u not in out] + inn
                write_sd(sd, active + failing)
                added += len(inn)
                removed += len(out)
                next_churn += args.churn
            if now >= next_report:
                cpu = _cpu_s(daemon.pid)
                rss = _rss_mib(daemon.pid)
                t = time.perf_counter()
                body = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
                ms = (time.perf_counter() - t) * 1e3
                cycles = next((float(l.split()[-1]) for l in body.splitlines()
                               if l.startswith("vllm_drift_scrape_cycles_total ")), 0.0)
                cyc_s = next((float(l.split()[-1]) for l in body.splitlines()
                              if l.startswith("vllm_drift_scrape_cycle_duration_seconds ")), float("nan"))
                ups = [l for l in body.splitlines() if l.startswith("vllm_drift_target_up{")]
                up = sum(l.endswith(" 1.0") for l in ups)
                pct = 100 * (cpu - last_cpu) / (now - last_t)
                last_cpu, last_t = cpu, now
                rows.append((now - t0, rss, pct))
                print(f"{now - t0:6.0f} {rss:8.1f} {pct:8.1f} {cycles:7.0f} {len(ups):8d} {up:5d} {cyc_s:7.2f} {ms:10.1f}", flush=True)
                next_report += args.every
            time.sleep(0.1)
        warm = [r for r in rows if r[0] >= args.warmup * args.seconds]
        if len(warm) >= 4:
            xs = [r[0] for r in warm]
            ys = [r[1] for r in warm]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            q = max(1, len(warm) // 4)
            cpu_first = sum(r[2] for r in warm[:q]) / q
            cpu_last = sum(r[2] for r in warm[-q:]) / q
            hour = 3600.0 / COMPRESSION   # wall seconds holding an hour of default-interval cycles
            rss_first = sum(ys[:q]) / q
            rss_last = sum(ys[-q:]) / q
            print(f"soak: after warm-up ({args.warmup:.0%}): RSS {min(ys):.1f}..{max(ys):.1f} MiB, "
                  f"first quarter {rss_first:.1f} -> last quarter {rss_last:.1f} MiB, "
                  f"slope {slope * hour:+.1f} MiB per compressed hour ({slope * 60:+.2f} MiB/min wall); "
                  f"CPU first quarter {cpu_first:.1f}% -> last quarter {cpu_last:.1f}% of one core")
        state = work / "state" / "drift-state.json"
        print(f"soak: churn added {added} and removed {removed} targets; peak RSS {max(r[1] for r in rows):.1f} MiB; "
              f"state file {state.stat().st_size / 1024:.0f} KiB" if state.exists() else "soak: no state file")
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
