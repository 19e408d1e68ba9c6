"""Start a real vLLM server on loopback, drive a load, and save its endpoints at chosen moments.

Why: the fixtures in ``tests/fixtures/vllm-cpu`` are the project's ground truth for what a real
vLLM 0.32 exposes. This script makes each capture reproducible from one command line and writes
down exactly when every file was taken (UTC wall time and seconds since the load started), so
rates between a pair of captures can be checked against a known interval.

Usage (run with the vLLM venv's python):
  python capture.py --model-dir DIR --port 8011 --out-dir OUT --log server.log \
      [--idle idle.prom] [--info] [--at 30:a.prom --at 60:b.prom] [--after-load end.prom] \
      [--at-kv 60:0.9:high.prom] [--timeline t.csv --timeline-every 2 --timeline-for 60] [--manifest runs.json] \
      [--load "--concurrency 8 --prompt-tokens 256 --output-tokens 128 --count 400 --duration 75"] \
      -- [extra `vllm serve` flags]
The server is started in its own process group, waited for (bounded), and always stopped by its
PID at the end (SIGINT, then SIGTERM, then SIGKILL, each bounded).
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import load as loadgen  # noqa: E402

TIMELINE_FIELDS = [
    ("kv_cache_usage_perc", "vllm:kv_cache_usage_perc"),
    ("num_requests_running", "vllm:num_requests_running"),
    ("num_requests_waiting", "vllm:num_requests_waiting"),
    ("num_preemptions_total", "vllm:num_preemptions_total"),
    ("generation_tokens_total", "vllm:generation_tokens_total"),
    ("prompt_tokens_total", "vllm:prompt_tokens_total"),
]
NOT_VLLM_ENV = {"VLLM_PY"}
LOG_PATTERNS = re.compile(r"KV cache|Maximum concurrency|SpecDecoding metrics")


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def sample_sums(text: str) -> dict[str, float]:
    """Sum of every sample per sample name (all label sets), for the timeline columns."""
    sums: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


async def get(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """GET with a few retries: an idle keep-alive connection may be closed by the server just as
    it is reused ("Server disconnected without sending a response")."""
    for attempt in range(3):
        try:
            r = await client.get(url, timeout=30)
            r.raise_for_status()
            return r
        except httpx.TransportError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


def portable_argv(argv: list[str]) -> list[str]:
    """The command line with absolute paths cut to ``.../name``: the record is committed and must
    not carry one machine's directory layout."""
    return [f".../{Path(x).name}" if os.path.isabs(x) else x for x in argv]


class Run:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.base = f"http://127.0.0.1:{a.port}"
        self.out = Path(a.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.record: dict = {"captures": [], "argv": portable_argv(sys.argv[1:])}
        self.t_load0: float | None = None

    async def save(self, client: httpx.AsyncClient, path: str, name: str) -> None:
        t_before = utcnow()
        m0 = time.monotonic()
        r = await get(client, f"{self.base}{path}")
        m1 = time.monotonic()
        (self.out / name).write_bytes(r.content)
        mid = (m0 + m1) / 2
        self.record["captures"].append({
            "file": name, "endpoint": path, "utc_request_start": t_before,
            "utc_response_end": utcnow(), "fetch_s": round(m1 - m0, 4),
            "t_since_load_start_s": None if self.t_load0 is None else round(mid - self.t_load0, 3),
            "monotonic_mid": mid,
        })
        print(f"[capture] saved {path} -> {name}", file=sys.stderr)

    async def timeline(self, client: httpx.AsyncClient) -> None:
        a = self.a
        rows = []
        n = int(a.timeline_for // a.timeline_every) + 1
        for i in range(n):
            target = self.t_load0 + i * a.timeline_every
            await asyncio.sleep(max(target - time.monotonic(), 0))
            r = await get(client, f"{self.base}/metrics")
            sums = sample_sums(r.text)
            row = {"t_s": round(time.monotonic() - self.t_load0, 2), "utc": utcnow()}
            for col, sname in TIMELINE_FIELDS:
                row[col] = sums.get(sname)
            rows.append(row)
        with open(self.out / a.timeline, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["t_s", "utc"] + [c for c, _ in TIMELINE_FIELDS])
            w.writeheader()
            w.writerows(rows)
        print(f"[capture] timeline -> {a.timeline} ({len(rows)} rows)", file=sys.stderr)

    async def at(self, client: httpx.AsyncClient, seconds: float, name: str) -> None:
        await asyncio.sleep(max(self.t_load0 + seconds - time.monotonic(), 0))
        await self.save(client, "/metrics", name)

    async def at_kv(self, client: httpx.AsyncClient, seconds: float, threshold: float,
                    name: str) -> None:
        """From ``seconds`` after the load started, poll /metrics (every 0.25 s, at most 20 s) and
        save the first exposition whose kv_cache_usage_perc >= threshold (else the last one)."""
        await asyncio.sleep(max(self.t_load0 + seconds - time.monotonic(), 0))
        give_up = time.monotonic() + 20
        polls = 0
        while True:
            m0 = time.monotonic()
            t_before = utcnow()
            r = await get(client, f"{self.base}/metrics")
            m1 = time.monotonic()
            polls += 1
            usage = sample_sums(r.text).get("vllm:kv_cache_usage_perc", 0.0)
            if usage >= threshold or m1 > give_up:
                break
            await asyncio.sleep(0.25)
        (self.out / name).write_bytes(r.content)
        self.record["captures"].append({
            "file": name, "endpoint": "/metrics", "utc_request_start": t_before,
            "utc_response_end": utcnow(), "fetch_s": round(m1 - m0, 4),
            "t_since_load_start_s": round((m0 + m1) / 2 - self.t_load0, 3),
            "rule": f"first poll from t={seconds}s with kv_cache_usage_perc >= {threshold}",
            "polls": polls, "kv_cache_usage_perc": usage,
        })
        print(f"[capture] saved /metrics -> {name} (usage {usage:.3f})", file=sys.stderr)

    async def drive(self) -> None:
        a = self.a
        limits = httpx.Limits(keepalive_expiry=1.0)
        async with httpx.AsyncClient(limits=limits) as client:
            if a.idle:
                await asyncio.sleep(a.idle_settle)
                await self.save(client, "/metrics", a.idle)
            if a.info:
                await self.save(client, "/v1/models", a.info_prefix + "models.json")
                await self.save(client, "/version", a.info_prefix + "version.json")
            if a.load is None:
                return
            largs = shlex.split(a.load) + ["--base-url", self.base, "--model", a.served_model_name]
            spec = loadgen.spec_from_args(loadgen.parser().parse_args(largs))
            self.record["load"] = {"args": a.load}
            self.t_load0 = time.monotonic()
            self.record["load_start_utc"] = utcnow()
            side = [asyncio.create_task(self.at(client, float(t), n)) for t, n in a.at]
            side += [asyncio.create_task(self.at_kv(client, t, th, n)) for t, th, n in a.at_kv]
            if a.timeline:
                side.append(asyncio.create_task(self.timeline(client)))
            res = await loadgen.run_load(spec)
            self.record["load_end_utc"] = utcnow()
            self.record["load_summary"] = loadgen.summary(spec, res)
            # captures scheduled past the load's end still run (bounded by their own times)
            await asyncio.wait_for(asyncio.gather(*side), timeout=a.side_timeout)
            if a.after_load:
                await asyncio.sleep(a.after_load_settle)
                await self.save(client, "/metrics", a.after_load)


def wait_health(base: str, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with code {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"server not healthy after {timeout}s")


def stop(proc: subprocess.Popen) -> str:
    """Stop the server's process group (started by us) by its PID; bounded."""
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    # reap anything left in the group (engine core child)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return f"exit {proc.returncode}"


def parse_at(v: str) -> tuple[float, str]:
    t, _, name = v.partition(":")
    if not name:
        raise argparse.ArgumentTypeError("--at takes SECONDS:FILE")
    return float(t), name


def parse_at_kv(v: str) -> tuple[float, float, str]:
    parts = v.split(":", 2)
    if len(parts) != 3:
        raise argparse.ArgumentTypeError("--at-kv takes SECONDS:THRESHOLD:FILE")
    return float(parts[0]), float(parts[1]), parts[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--served-model-name", default="tiny-llama")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--log", required=True, help="server stdout/stderr goes here")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--startup-timeout", type=float, default=400)
    p.add_argument("--idle")
    p.add_argument("--idle-settle", type=float, default=5.0)
    p.add_argument("--info", action="store_true")
    p.add_argument("--info-prefix", default="")
    p.add_argument("--load")
    p.add_argument("--at", type=parse_at, action="append", default=[])
    p.add_argument("--at-kv", type=parse_at_kv, action="append", default=[],
                   help="SECONDS:THRESHOLD:FILE - save /metrics once KV usage >= THRESHOLD")
    p.add_argument("--after-load")
    p.add_argument("--after-load-settle", type=float, default=2.0)
    p.add_argument("--timeline")
    p.add_argument("--timeline-every", type=float, default=2.0)
    p.add_argument("--timeline-for", type=float, default=60.0)
    p.add_argument("--side-timeout", type=float, default=600)
    p.add_argument("--manifest", help="JSON file; this run's record is appended to its list")
    p.add_argument("serve_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    extra = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    cmd = [a.python, str(HERE / "launch.py"), "serve", a.model_dir, "--host", "127.0.0.1",
           "--port", str(a.port), "--served-model-name", a.served_model_name, *extra]
    run = Run(a)
    run.record["server_cmd"] = ["launch.py" if c.endswith("launch.py") else c for c in cmd[1:]]
    # vLLM's own settings only (VLLM_PY is capture_all.sh's interpreter path, not a vLLM knob)
    run.record["env"] = {k: v for k, v in os.environ.items()
                         if k.startswith("VLLM_") and k not in NOT_VLLM_ENV}
    log = open(a.log, "wb")
    print(f"[capture] starting: {shlex.join(cmd)}", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run.record["server_start_utc"] = utcnow()
    try:
        run.record["startup_s"] = round(wait_health(run.base, proc, a.startup_timeout), 1)
        run.record["healthy_utc"] = utcnow()
        asyncio.run(run.drive())
    finally:
        run.record["stop"] = stop(proc)
        log.close()
        text = Path(a.log).read_text(errors="replace")
        run.record["log_lines"] = [ln.strip() for ln in text.splitlines()
                                   if LOG_PATTERNS.search(ln)][:40]
        for c in run.record["captures"]:
            c.pop("monotonic_mid", None)
        if a.manifest:
            mp = Path(a.manifest)
            runs = json.loads(mp.read_text()) if mp.exists() else []
            runs.append(run.record)
            mp.write_text(json.dumps(runs, indent=2) + "\n")
        print(json.dumps(run.record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
