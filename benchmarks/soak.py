"""Soak: `vllm-drift serve` against a churning fleet of 1,000 targets in compressed time; does its
memory grow once warm, does any evaluation stall, are findings lost?

Fleet (real HTTP on loopback):
* healthy targets from one `vllm-drift simulate --fleet POOL` process (its scenarios produce
  findings); the daemon finds them through a Prometheus file_sd file that this script rewrites
  every compressed minute, swapping `--churn-share` of them for others from the pool;
* restarting targets (`--restarts`, share per compressed hour): servers of a real vLLM capture
  whose counters grow with time and go back to zero, with a new `_created`, when they restart;
* bad targets (`--bad`): half hang until the scrape timeout, half answer garbage (HTML, JSON,
  binary, a truncated exposition), rotating.

Compression: scrape every `--interval` s instead of 15 s (default 5 s: x3), evaluation and window
scaled alike, so `--seconds 1200` holds an hour of production cycles. The state is saved
(`state_dir`) as in production.

Every `--every` s it reports RSS, CPU, targets, `/metrics` latency, and from `/api/v1/findings`:
* stalled evaluations: targets up and watched for longer than 3 evaluation intervals whose
  report is older than 3 evaluation intervals (or missing), plus a fleet evaluation older than that;
* lost findings: targets up and watched throughout two reports whose report disappeared, or
  whose active warning/critical finding vanished while the target neither restarted nor left,
  and the daemon did not decide so: its log (JSON) has no `finding cleared` (or a `finding
  de-escalated` below warning) for that target and finding since the previous report. A finding
  the simulator's time-varying scenarios let go, cleared by the daemon's own hysteresis, is not
  lost; one that vanishes from a report without that decision is.
At the end: RSS growth after the warm-up (the first compressed 10 minutes), both counts summed,
and `/metrics` latency percentiles. Goal (issue 20): growth <= 5 %, 0 stalled, 0 lost.
Asserts nothing.

usage: .venv/bin/python benchmarks/soak.py [--seconds 1200] [--active 1000] [--pool 1050] [--interval 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO.parent / "shared" / "fixtures" / "prom" / "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"


class ClearedFindings:
    """The findings the daemon itself cleared, from its JSON log: (host:port, finding) pairs
    with a `finding cleared` or `finding de-escalated` below warning since the last `read`."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return out
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if b'"finding ' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("event")
            if kind == "finding cleared" or (kind == "finding de-escalated"
                                             and ev.get("severity") not in ("warning", "critical")):
                out.add((str(ev.get("target", "")).split("://", 1)[-1], str(ev.get("finding"))))
        return out


def _cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    return [int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS")][0] / 1024


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Template:
    """A capture whose counter, bucket, sum and count values grow linearly with uptime and whose
    `_created` values are the start time: rendered for any (uptime, start)."""

    _VALUE = re.compile(r"^(vllm:[^ ]*(?:_total|_bucket|_sum|_count|_created)(?:\{[^}]*\})?) (\S+)$")

    def __init__(self, text: str) -> None:
        self.parts: list[tuple[str, float | None, bool]] = []
        for line in text.splitlines():
            m = self._VALUE.match(line)
            if m is None:
                self.parts.append((line, None, False))
            else:
                self.parts.append((m.group(1), float(m.group(2)), m.group(1).split("{")[0].endswith("_created")))

    def render(self, uptime: float, start: float) -> bytes:
        scale = uptime / 600.0          # the capture's values as if reached after 10 min
        out = []
        for head, value, created in self.parts:
            if value is None:
                out.append(head)
            elif created:
                out.append(f"{head} {start}")
            else:
                out.append(f"{head} {round(value * scale, 3)}")
        return ("\n".join(out) + "\n").encode()


GARBAGE = [b"<html><body>502 Bad Gateway</body></html>", b'{"error": "not found"}', bytes(range(256)) * 8,
           b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\" 3\n"]


class LocalServers:
    """Restarting, hanging and garbage-answering targets on loopback, in one thread."""

    def __init__(self, n_restart: int, n_hang: int, n_garbage: int, period: float, rng: random.Random) -> None:
        self.loop = asyncio.new_event_loop()
        self.template = Template(CAPTURE.read_text()) if n_restart else None
        self.restart_urls: list[str] = []
        self.hang_urls: list[str] = []
        self.garbage_urls: list[str] = []
        self.started: dict[int, float] = {}        # port -> start time (epoch) of the current "process"
        self.restarts = 0
        self.period = period                        # seconds between a target's restarts
        self.phase = {}
        self.rng = rng
        ready = threading.Event()

        async def http(reader, writer, answer):
            try:
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    while await reader.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    status, body = answer(line)
                    if status is None:
                        await asyncio.sleep(3600)
                    writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        def restarting(port):
            def answer(line):
                now = time.time()
                start = self.started[port]
                if now - start > self.period:             # restart: a new process, counters from zero
                    self.started[port] = start = now - self.rng.uniform(0, 1)
                    self.restarts += 1
                path = line.split(b" ")[1] if b" " in line else b"/"
                if path.startswith(b"/version"):
                    return b"200 OK", b'{"version":"0.10.1"}'
                if path.startswith(b"/v1/models"):
                    return b"200 OK", b'{"data":[{"id":"Qwen/Qwen3-4B-Instruct-2507-FP8","max_model_len":8192}]}'
                return b"200 OK", self.template.render(now - start, start)
            return answer

        def garbage(i):
            counter = [i]

            def answer(line):
                counter[0] += 1
                return b"200 OK", GARBAGE[counter[0] % len(GARBAGE)]
            return answer

        async def main():
            now = time.time()
            for i in range(n_restart):
                port = _free_port()
                # each target restarts once per period, at its own phase
                self.started[port] = now - rng.uniform(0, period)
                answer = restarting(port)
                await asyncio.start_server(lambda r, w, a=answer: http(r, w, a), "127.0.0.1", port)
                self.restart_urls.append(f"127.0.0.1:{port}")
            for i in range(n_hang):
                srv = await asyncio.start_server(lambda r, w: http(r, w, lambda line: (None, b"")), "127.0.0.1", 0)
                self.hang_urls.append(f"127.0.0.1:{srv.sockets[0].getsockname()[1]}")
            for i in range(n_garbage):
                answer = garbage(i)
                srv = await asyncio.start_server(lambda r, w, a=answer: http(r, w, a), "127.0.0.1", 0)
                self.garbage_urls.append(f"127.0.0.1:{srv.sockets[0].getsockname()[1]}")
            ready.set()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.create_task(main())
            self.loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(60)


def write_sd(path: Path, targets: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": targets, "labels": {"gpu": "L4"}}]))
    os.replace(tmp, path)


def get(url: str, timeout: float = 30.0) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return time.perf_counter() - t, body


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[int(q * (len(v) - 1))] if v else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1200.0, help="run length in wall seconds")
    ap.add_argument("--active", type=int, default=1000, help="targets watched at any time")
    ap.add_argument("--pool", type=int, default=1050, help="simulated targets to churn through")
    ap.add_argument("--interval", type=float, default=5.0, help="scrape interval (15 s / compression)")
    ap.add_argument("--churn-share", type=float, default=0.02, help="share of healthy targets swapped per compressed minute")
    ap.add_argument("--restarts", type=float, default=0.05, help="share of targets restarting per compressed hour")
    ap.add_argument("--bad", type=float, default=0.02, help="share of targets hanging or answering garbage")
    ap.add_argument("--every", type=float, default=20.0, help="report interval (s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    compression = 15.0 / args.interval
    minute, hour = 60.0 / compression, 3600.0 / compression
    evaluate, window = 30.0 / compression, 600.0 / compression
    warmup = window                        # the first compressed 10 minutes
    work = Path(tempfile.mkdtemp(prefix="vllm-drift-soak-"))
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")

    n_bad = max(2, round(args.bad * args.active))
    n_restart = max(1, round(args.restarts * args.active)) if CAPTURE.exists() else 0
    local = LocalServers(n_restart, n_bad // 2, n_bad - n_bad // 2, hour, rng)
    fixed = local.restart_urls + local.hang_urls + local.garbage_urls
    n_good = args.active - len(fixed)
    sim = subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--fleet", str(args.pool), "--port", "0",
                            "--speed", str(compression), "--duration", str(args.seconds + 300)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                           start_new_session=True)
    daemon = None
    try:
        pool = [sim.stdout.readline().strip().split("://", 1)[1] for _ in range(args.pool)]
        active = rng.sample(pool, n_good)
        sd = work / "targets.json"
        write_sd(sd, active + fixed)
        cfg = work / "c.yaml"
        cfg.write_text(f"scrape: {{interval: {args.interval:g}s, timeout: {min(4.0, args.interval * 0.8):g}s}}\n"
                       f"evaluation: {{interval: {evaluate:g}s, window: {window:g}s}}\n"
                       f"file_sd: ['{sd}']\nfile_sd_refresh: {max(1.0, args.interval / 2):g}s\n"
                       f"state_dir: {work / 'state'}\n")
        port = _free_port()
        log = open(work / "daemon.log", "wb")
        daemon = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(cfg),
                                   "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=log, env=env)
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                get(base + "/-/healthy", 2)
                break
            except OSError:
                time.sleep(0.2)
        print(f"soak: {args.active} targets ({n_good} simulated, {n_restart} restarting once per compressed hour, "
              f"{len(local.hang_urls)} hanging, {len(local.garbage_urls)} answering garbage) from a pool of "
              f"{args.pool}; churn {args.churn_share:.0%} of the healthy ones every {minute:g} s; scrape "
              f"{args.interval:g} s, evaluation {evaluate:g} s, window {window:g} s (x{compression:g}); "
              f"{args.seconds:g} s run = {args.seconds / hour:.2f} compressed hours", flush=True)
        print(f"{'t_s':>6} {'rss_mib':>8} {'cpu_pct':>8} {'targets':>8} {'up':>5} {'reports':>7} {'findings':>8} "
              f"{'stalled':>7} {'lost':>5} {'restarts':>8} {'metrics_ms':>10}", flush=True)
        t0 = time.monotonic()
        next_churn, next_report = t0 + minute, t0 + args.every
        last_cpu, last_t = _cpu_s(daemon.pid), t0
        since: dict[str, float] = {u: t0 for u in active + fixed}    # watched since (monotonic)
        rows, latencies = [], []
        decided = ClearedFindings(work / "daemon.log")
        stalled_total = lost_total = 0
        prev: dict[str, tuple[set[str], float]] = {}
        restarts_seen = 0
        added = removed = 0
        probe_stop = threading.Event()

        def probe():          # the daemon's /metrics as a Prometheus sees it, every second
            while not probe_stop.wait(1.0):
                try:
                    latencies.append(get(base + "/metrics", 10)[0])
                except OSError:
                    latencies.append(10.0)
        threading.Thread(target=probe, daemon=True).start()
        while time.monotonic() - t0 < args.seconds:
            now = time.monotonic()
            if now >= next_churn:
                k = max(1, round(args.churn_share * n_good))
                out = rng.sample(active, k)
                spare = [u for u in pool if u not in active]
                inn = rng.sample(spare, min(k, len(spare)))
                active = [u for u in active if u not in out] + inn
                for u in out:
                    since.pop(u, None)
                for u in inn:
                    since[u] = now
                write_sd(sd, active + fixed)
                added += len(inn)
                removed += len(out)
                next_churn += minute
            if now >= next_report:
                cpu, rss = _cpu_s(daemon.pid), _rss_mib(daemon.pid)
                ms, body = get(base + "/metrics")
                text = body.decode()
                up = {line.split('"')[1].split("://", 1)[1] for line in text.splitlines()
                      if line.startswith("vllm_drift_target_up{") and line.endswith(" 1.0")}
                doc = json.loads(get(base + "/api/v1/findings")[1])
                wall = time.time()
                reports: dict[str, tuple[set[str], float]] = {}
                for t in doc["targets"]:
                    if t.get("evaluated_at") is not None:
                        key = t["target"].split("://", 1)[1]
                        names = {f["finding"] for f in t.get("findings", []) if f.get("severity") in ("warning", "critical")}
                        reports[key] = (names, t["evaluated_at"])
                cleared = decided.read()
                restarted = local.restarts != restarts_seen
                restarts_seen = local.restarts
                watched = {u for u, s in since.items() if now - s > 3 * evaluate + args.interval and u in up}
                stalled = sum(1 for u in watched if u not in reports or wall - reports[u][1] > 3 * evaluate)
                lost = 0
                for u in watched:
                    if u in prev and now - since[u] > args.every + 3 * evaluate:
                        if u not in reports:
                            lost += 1
                        elif not restarted and u not in local.restart_urls:
                            lost += sum(1 for f in prev[u][0] - reports[u][0] if (u, f) not in cleared)
                if now - t0 >= warmup:
                    stalled_total += stalled
                    lost_total += lost
                prev = {u: reports[u] for u in watched if u in reports}
                pct_cpu = 100 * (cpu - last_cpu) / (now - last_t)
                last_cpu, last_t = cpu, now
                rows.append((now - t0, rss, pct_cpu))
                n_findings = sum(len(r[0]) for r in reports.values())
                print(f"{now - t0:6.0f} {rss:8.1f} {pct_cpu:8.1f} {len(doc['targets']):8d} {len(up):5d} "
                      f"{len(reports):7d} {n_findings:8d} {stalled:7d} {lost:5d} {local.restarts:8d} {1000 * ms:10.1f}",
                      flush=True)
                next_report += args.every
            time.sleep(0.2)
        probe_stop.set()
        warm = [r for r in rows if r[0] >= warmup]
        if len(warm) >= 2:
            first, last = warm[0][1], warm[-1][1]
            peak = max(r[1] for r in warm)
            print(f"soak: RSS after the first compressed 10 min {first:.1f} MiB -> {last:.1f} MiB at the end "
                  f"({100 * (last - first) / first:+.1f} %; peak {peak:.1f} MiB); CPU {warm[0][2]:.1f} % -> "
                  f"{sum(r[2] for r in warm[-3:]) / min(3, len(warm)):.1f} % of one core")
        print(f"soak: stalled evaluations {stalled_total}, lost findings {lost_total} (after warm-up); "
              f"restarts {local.restarts}; churn added {added} and removed {removed} targets")
        print(f"soak: daemon /metrics over {len(latencies)} probes: p50 {1000 * pct(latencies, 0.5):.0f} ms, "
              f"p99 {1000 * pct(latencies, 0.99):.0f} ms, worst {1000 * max(latencies, default=0):.0f} ms")
        state = work / "state" / "drift-state.json"
        if state.exists():
            print(f"soak: state file {state.stat().st_size / 1024:.0f} KiB")
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
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
