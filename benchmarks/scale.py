"""Fleet-size benchmark: the daemon's CPU, memory and /metrics latency at 10 -> 3,000 targets.

For each size N it starts the simulator's fleet mode (`vllm-drift simulate --fleet N`, one
process, N loopback ports), runs `vllm-drift serve` scraping every 15 s and evaluating every
30 s over a 10 min window, lets it warm up (first scrape, first evaluation), then measures over a
steady period from /proc: the daemon's CPU (% of one core, and per target per scrape cycle), its
RSS (and per target), and the latency of GET /metrics. The baseline, measured in the same run on
a payload the daemon scraped, is the stock `prometheus_client` parser's time per payload: the
cost a naive exporter pays before doing anything else.

Goals (issue 20) at 10,000 targets every 15 s: <= 60 % of one core, <= 1 GiB RSS, /metrics p99
<= 100 ms and worst <= 250 ms while evaluations run; CPU per target per cycle <= 0.2 x the stock
parser's time for the same body. `--source capture` serves a real vLLM capture from
../shared/checks/loopback_targets.py instead of the simulator (whose fleet mode cannot answer
10,000 targets every 15 s on a small machine); /metrics is probed every 0.5 s as a Prometheus would
(Accept-Encoding: gzip; `--no-probe-gzip` reads it uncompressed).

With `--mode query` a real Prometheus (the `prometheus` binary) scrapes the fleet every
`--interval` and the daemon reads it through the query API instead (`prometheus:` config); the
daemon's figures are then its own, and Prometheus' CPU is printed beside them.

usage: .venv/bin/python benchmarks/scale.py [--sizes 10,100,1000,3000] [--steady 90] [--warmup 40]
       [--interval 15] [--evaluate 30] [--mode scrape|query] [--source sim|capture] [--profile DIR]
       (py-spy, if installed)
Prints one line per size and the goal figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK        # utime + stime of the daemon itself


def rss_mib(pid: int) -> float:
    return int(open(f"/proc/{pid}/statm").read().split()[1]) * PAGE / 2**20


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return None


def get(url: str, timeout: float = 30.0, gzipped: bool = False) -> tuple[float, bytes]:
    """GET url; with `gzipped` ask for gzip as a Prometheus does (the time includes reading the
    compressed body; the body returned is decompressed)."""
    t = time.perf_counter()
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        encoding = r.headers.get("Content-Encoding", "")
    dt = time.perf_counter() - t
    if encoding == "gzip":
        body = gzip.decompress(body)
    return dt, body


def stock_parse_seconds(payload: str, repeat: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _fam in text_string_to_metric_families(payload):
            pass
        best = min(best, time.perf_counter() - t)
    return best


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_prometheus(urls: list[str], interval: float) -> tuple[subprocess.Popen, str, str]:
    """A real Prometheus on loopback scraping the fleet (job `vllm`); waits until it has data."""
    exe = shutil.which("prometheus")
    if exe is None:
        raise RuntimeError("--mode query needs the prometheus binary")
    folder = tempfile.mkdtemp(prefix="scale-prom-")
    port = free_port()
    with open(f"{folder}/prometheus.yml", "w") as fh:
        fh.write(f"global: {{scrape_interval: {interval:g}s, scrape_timeout: 10s}}\nscrape_configs:\n"
                 "  - job_name: vllm\n    static_configs:\n      - targets:\n")
        fh.writelines(f"        - '{u.split('://')[1]}'\n" for u in urls)
    proc = subprocess.Popen([exe, f"--config.file={folder}/prometheus.yml", f"--storage.tsdb.path={folder}/tsdb",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            body = get(url + "/api/v1/query?query=count(up%3D%3D1)")[1]
            if b'"value"' in body and int(float(body.split(b'"value":[')[1].split(b",")[1].strip(b'"]}'))) >= len(urls):
                return proc, url, folder
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(1)
    stop(proc)
    raise RuntimeError("Prometheus never had every target up")


SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
CAPTURE = SHARED / "fixtures" / "prom" / "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"


TARGETS_PER_PROCESS = 4000


def run_size(n: int, args: argparse.Namespace, exe: list[str]) -> dict:
    if args.source == "capture":
        tool = SHARED / "checks" / "loopback_targets.py"
        if not tool.exists() or not CAPTURE.exists():
            raise RuntimeError(f"--source capture needs {tool} and {CAPTURE}")
        # one loopback process holds a listening socket and a kept-alive connection per target:
        # 2 descriptors each, so split the fleet to stay under a 20,000 open-file limit
        sims = []
        for start in range(0, n, TARGETS_PER_PROCESS):
            count = min(TARGETS_PER_PROCESS, n - start)
            sims.append(subprocess.Popen([sys.executable, str(tool), "--base-port",
                                          str(args.base_port + start if args.base_port else 0), "--count", str(count),
                                          "--file", str(CAPTURE), "--seconds", str(int(args.warmup + args.steady + 600))],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                         start_new_session=True))
    else:
        sims = [subprocess.Popen(exe + ["simulate", "--fleet", str(n), "--port", "0", "--seed", "7"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)]
    daemon = prom = None
    cfg_path = prom_dir = None
    try:
        urls = []
        deadline = time.time() + 120 + n / 50
        for i, sim in enumerate(sims):     # each process prints its own share, then serves
            share = min(TARGETS_PER_PROCESS, n - i * TARGETS_PER_PROCESS) if len(sims) > 1 else n
            for _ in range(share):
                line = sim.stdout.readline() if time.time() < deadline else ""
                if not line:
                    break
                urls.append(line.strip())
        if len(urls) != n:
            raise RuntimeError(f"simulator fleet of {n} did not start ({len(urls)} URLs)")
        payload = get(urls[0] + "/metrics")[1].decode()
        fd, cfg_path = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as fh:
            fh.write(f"scrape: {{interval: {args.interval}s, timeout: 10s, concurrency: 64}}\n"
                     f"evaluation: {{interval: {args.evaluate}s, window: 10m}}\n")
            if args.mode == "query":
                prom, prom_url, prom_dir = start_prometheus(urls, args.interval)
                fh.write(f"prometheus: {{url: '{prom_url}', selector: '{{job=\"vllm\"}}', timeout: 20s, "
                         f"concurrency: 8, backfill: false, federate: {str(args.federate).lower()}}}\n")
            else:
                fh.write("targets:\n")
                fh.writelines(f"  - url: {u}\n" for u in urls)
        port = free_port()
        daemon = subprocess.Popen(exe + ["serve", "--config", cfg_path, "--listen", f"127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120 + n / 20
        while time.time() < deadline:                 # ready = first evaluation finished
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"daemon with {n} targets never became ready")
        time.sleep(args.warmup)
        profiler = None
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if args.profile and spy:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            profiler = subprocess.Popen([spy, "record", "-p", str(daemon.pid), "-d", str(int(args.steady)),
                                         "-f", "speedscope", "-o", f"{args.profile}/daemon-{n}.json", "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        text0 = get(base + "/metrics")[1].decode()
        c0, t0 = cpu_seconds(daemon.pid), time.time()
        p0 = cpu_seconds(prom.pid) if prom is not None else 0.0
        cycles0 = metric(text0, "vllm_drift_scrape_cycles_total") or 0.0
        latencies, peak_rss = [], rss_mib(daemon.pid)
        end = t0 + args.steady
        while time.time() < end:
            dt, body = get(base + "/metrics", gzipped=args.probe_gzip)
            latencies.append(dt)
            peak_rss = max(peak_rss, rss_mib(daemon.pid))
            time.sleep(min(0.5, max(0.0, end - time.time())))
        c1, t1 = cpu_seconds(daemon.pid), time.time()
        p1 = cpu_seconds(prom.pid) if prom is not None else 0.0
        text1 = body.decode()
        cycles1 = metric(text1, "vllm_drift_scrape_cycles_total") or 0.0
        if profiler is not None:
            profiler.wait(60)
        cycles = cycles1 - cycles0
        up = sum(1 for line in text1.splitlines() if line.startswith("vllm_drift_target_up{") and line.endswith(" 1.0"))
        cpu = c1 - c0
        return {
            "n": n, "up": up, "seconds": t1 - t0, "cycles": cycles, "cpu_pct": 100 * cpu / (t1 - t0),
            "cpu_ms_per_target_cycle": 1000 * cpu / (cycles * n) if cycles else float("nan"),
            "rss": peak_rss, "rss_per_target_kib": peak_rss * 1024 / n,
            "metrics_ms_median": 1000 * statistics.median(latencies), "metrics_ms_max": 1000 * max(latencies),
            "metrics_ms_p99": 1000 * sorted(latencies)[int(0.99 * (len(latencies) - 1))],
            "metrics_bytes": len(body),
            "cycle_s": metric(text1, "vllm_drift_scrape_cycle_duration_seconds"),
            "eval_s": metric(text1, "vllm_drift_evaluation_duration_seconds"),
            "stock_parse_ms": 1000 * stock_parse_seconds(payload), "payload_bytes": len(payload),
            "prometheus_cpu_pct": 100 * (p1 - p0) / (t1 - t0) if prom is not None else None,
        }
    finally:
        stop(daemon)
        stop(prom)
        for sim in sims:
            stop(sim)
        if prom_dir:
            shutil.rmtree(prom_dir, ignore_errors=True)
        if cfg_path:
            os.unlink(cfg_path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,1000,3000")
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--evaluate", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=35.0, help="seconds after ready before measuring")
    ap.add_argument("--steady", type=float, default=90.0, help="seconds measured")
    ap.add_argument("--profile", default=None, help="directory for py-spy profiles of the daemon")
    ap.add_argument("--mode", choices=("scrape", "query"), default="scrape")
    ap.add_argument("--federate", action="store_true", help="query mode through /federate")
    ap.add_argument("--base-port", type=int, default=0,
                    help="--source capture: first port of the targets (0: the OS picks ephemeral ports, which "
                         "run out near 10,000 targets when another fleet shares the machine; e.g. 20000)")
    ap.add_argument("--probe-gzip", action=argparse.BooleanOptionalAction, default=True,
                    help="probe /metrics with Accept-Encoding: gzip, as a Prometheus does (default)")
    ap.add_argument("--source", choices=("sim", "capture"), default="sim",
                    help="targets: the simulator's fleet mode, or a real capture on loopback ports")
    args = ap.parse_args()
    exe = [sys.executable, "-m", "exporter"]
    print(f"mode {args.mode}{' (federate)' if args.federate else ''}: scrape every {args.interval:g}s, evaluate every {args.evaluate:g}s, window 10m; "
          f"{args.warmup:g}s warm-up after ready, {args.steady:g}s measured; {os.cpu_count()} CPUs", flush=True)
    print(f"{'targets':>7} {'up':>5} {'CPU %core':>9} {'ms/target/cycle':>15} {'stock parse ms':>14} "
          f"{'ratio':>6} {'RSS MiB':>8} {'KiB/target':>10} {'/metrics ms p50/p99/max':>24} {'cycle s':>8} {'eval s':>7}",
          flush=True)
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        try:
            r = run_size(n, args, exe)
        except RuntimeError as exc:
            print(f"{n:>7} failed: {exc}", flush=True)
            continue
        results.append(r)
        ratio = r["cpu_ms_per_target_cycle"] / r["stock_parse_ms"]
        print(f"{r['n']:>7} {r['up']:>5} {r['cpu_pct']:>9.1f} {r['cpu_ms_per_target_cycle']:>15.3f} "
              f"{r['stock_parse_ms']:>14.3f} {ratio:>6.2f} {r['rss']:>8.0f} {r['rss_per_target_kib']:>10.0f} "
              f"{r['metrics_ms_median']:>9.1f}/{r['metrics_ms_p99']:.1f}/{r['metrics_ms_max']:<8.1f} {r['cycle_s'] or 0:>8.2f} "
              f"{r['eval_s'] or 0:>7.2f}" +
              (f"  (Prometheus itself: {r['prometheus_cpu_pct']:.1f}% of a core)" if r["prometheus_cpu_pct"] is not None else ""),
              flush=True)
    for i, r in enumerate(results):
        ratio = r["cpu_ms_per_target_cycle"] / r["stock_parse_ms"]
        print(f"{r['n']} targets: CPU {r['cpu_pct']:.1f}% of one core, {ratio:.2f} x the stock parser per target "
              f"per cycle (goal <= 0.2); RSS {r['rss']:.0f} MiB; /metrics p99 {r['metrics_ms_p99']:.0f} ms, worst "
              f"{r['metrics_ms_max']:.0f} ms (goals at 10,000: 100 / 250)")
    if len(results) >= 2:   # linear in the fleet size: the slope between the two largest sizes
        a, b = sorted(results, key=lambda r: r["n"])[-2:]
        rss_slope = (b["rss"] - a["rss"]) / (b["n"] - a["n"])
        cpu_slope = (b["cpu_pct"] - a["cpu_pct"]) / (b["n"] - a["n"])
        print(f"extrapolated to 10,000 targets from {a['n']} and {b['n']}: CPU {b['cpu_pct'] + cpu_slope * (10000 - b['n']):.0f}% "
              f"of one core (goal <= 60), RSS {b['rss'] + rss_slope * (10000 - b['n']):.0f} MiB (goal <= 1024), "
              f"{rss_slope * 1024:.0f} KiB per target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
