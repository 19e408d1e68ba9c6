#!/usr/bin/env python3
"""Time from KV pressure to a notification, end to end on loopback, with the shipped rules.

    vLLM servers (simulated, or real ones given with --target)
      -> `vllm-drift serve` (its default intervals: 15 s scrape, 30 s evaluation)
      -> a real Prometheus (Debian `prometheus`; 15 s scrape and rule evaluation; rule_files =
         rules/prometheus_rules.yaml + rules/prometheus_alerts.yaml, unchanged)
      -> a real Alertmanager (Debian `prometheus-alertmanager`; the routing and inhibition of
         deploy/compose/alertmanager.yml, group_wait 30 s, receivers pointed here)
      -> a webhook receiver in this script.

For every server it prints each hop's time from the start of the stack: the pressure onset (the
first poll of the server's own /metrics with KV usage >= 0.9 and requests waiting), the
daemon's first kv_pressure finding at warning and at critical (its /api/v1/findings), the first
alert for that server pending and firing in Prometheus, and the first notification that reached
the webhook; then every notification with its cause. Exit 0 when the `pressure` server got a
notification naming KV pressure within --limit seconds of onset and no `healthy` server got
any notification during the whole run.

Examples (run from the repository root):
    python benchmarks/alert_e2e.py                          # kv-pressure + healthy simulators, 6 min
    python benchmarks/alert_e2e.py --duration 1800          # 30 minutes of healthy watch
    python benchmarks/alert_e2e.py --target pressure=http://127.0.0.1:8011 \\
        --target healthy=http://127.0.0.1:8012              # real vLLM servers (tools/vllm_cpu/)

Bounded: every process it starts is stopped (SIGTERM, then SIGKILL) when the run ends or fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = [ROOT / "rules" / "prometheus_rules.yaml", ROOT / "rules" / "prometheus_alerts.yaml"]
AM_CONFIG = ROOT / "deploy" / "compose" / "alertmanager.yml"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
KV_ALERTS = ("VLLMKVCachePressure", "VLLMDriftKVPressure")
KV_GAUGE = re.compile(r'^vllm:(?:kv|gpu)_cache_usage_perc\{[^}]*\}\s+(\S+)', re.M)
WAITING = re.compile(r'^vllm:num_requests_waiting\{[^}]*\}\s+(\S+)', re.M)


def vllm_drift_cmd() -> list[str]:
    exe = shutil.which("vllm-drift", path=str(Path(sys.executable).parent)) or shutil.which("vllm-drift")
    return [exe] if exe else [sys.executable, "-m", "exporter"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return r.read()


@dataclass
class Server:
    role: str                        # pressure | healthy
    url: str                         # base URL, http://host:port
    scenario: str | None = None      # simulated scenario, None for an external server
    hops: dict[str, float] = field(default_factory=dict)   # hop -> seconds since stack start
    first: dict[str, str] = field(default_factory=dict)    # hop -> what it was (alert name ...)

    @property
    def instance(self) -> str:
        return urllib.parse.urlsplit(self.url).netloc

    def owns(self, labels: dict) -> bool:
        return labels.get("instance") == self.instance or labels.get("target", "").rstrip("/") == self.url.rstrip("/")

    def mark(self, hop: str, t: float, what: str = "") -> None:
        if hop not in self.hops:
            self.hops[hop] = t
            self.first[hop] = what


class Receiver:
    """Alertmanager webhook on loopback: keeps every alert it is sent."""

    def __init__(self, t0: float):
        self.notes: list[dict] = []
        self.t0 = t0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                for a in body.get("alerts", []):
                    outer.notes.append({"t": time.time() - outer.t0, "status": a.get("status"),
                                        "receiver": self.path.strip("/"), "labels": a.get("labels", {}),
                                        "annotations": a.get("annotations", {})})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=self.tmp)
        self.procs.append((name, p))
        return p

    def check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                tail = (self.tmp / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


def wait_http(url: str, seconds: float, stack: Stack) -> None:
    end = time.time() + seconds
    while time.time() < end:
        stack.check_alive()
        try:
            get(url, timeout=2)
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {seconds:.0f}s")


def poll_once(servers: list[Server], t: float, prom: str, drift: str) -> None:
    for s in servers:
        try:
            text = get(f"{s.url}/metrics", timeout=3).decode()
            kv = [float(v) for v in KV_GAUGE.findall(text)]
            waiting = sum(float(v) for v in WAITING.findall(text))
            if kv and max(kv) >= 0.9 and waiting > 0:
                s.mark("onset", t, f"KV {max(kv):.2f}, {waiting:.0f} waiting")
        except (OSError, urllib.error.URLError, ValueError):
            pass
    try:
        doc = json.loads(get(f"{drift}/api/v1/findings", timeout=3))
        for tgt in doc.get("targets", []):
            for s in servers:
                if tgt.get("target", "").rstrip("/") != s.url.rstrip("/"):
                    continue
                for f in tgt.get("findings", []):
                    if f.get("finding") == "kv_pressure" and f.get("severity") in ("warning", "critical"):
                        s.mark("finding_warning", t, f"score {f.get('score', 0):.2f}")
                        if f["severity"] == "critical":
                            s.mark("finding_critical", t, f"score {f.get('score', 0):.2f}")
    except (OSError, urllib.error.URLError, ValueError):
        pass
    try:
        alerts = json.loads(get(f"{prom}/api/v1/alerts", timeout=3))["data"]["alerts"]
        for a in alerts:
            for s in servers:
                if s.owns(a["labels"]):
                    what = f"{a['labels'].get('alertname')} ({a['labels'].get('severity')})"
                    s.mark("rule_pending", t, what)
                    if a.get("state") == "firing":
                        s.mark("rule_firing", t, what)
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        pass


def _say(msg: str) -> None:
    print(msg, flush=True)


def run(servers: list[Server], *, duration: float, group_wait: str, gpu: str, seed: int,
        poll: float = 5.0, stop_early: bool = False, out=_say, on_ready=None) -> dict:
    if PROMETHEUS is None or ALERTMANAGER is None:
        raise RuntimeError("prometheus and prometheus-alertmanager are needed "
                           "(apt-get install prometheus prometheus-alertmanager)")
    with tempfile.TemporaryDirectory(prefix="alert-e2e-") as tmpdir:
        tmp = Path(tmpdir)
        stack = Stack(tmp)
        t0 = time.time()
        receiver = Receiver(t0)
        try:
            for s in servers:
                if s.scenario:
                    port = int(s.instance.rsplit(":", 1)[1])
                    stack.start(f"sim-{s.role}", [*vllm_drift_cmd(), "simulate", "--host", "127.0.0.1",
                                                  "--port", str(port), "--scenario", s.scenario,
                                                  "--seed", str(seed), "--duration", str(int(duration + 60))])
            drift_port, am_port, prom_port = free_port(), free_port(), free_port()
            (tmp / "vllm-drift.yaml").write_text(yaml.safe_dump({
                "targets": [{"url": s.url, **({"gpu": gpu} if s.scenario and gpu else {})} for s in servers]}))
            stack.start("vllm-drift", [*vllm_drift_cmd(), "serve", "--config", str(tmp / "vllm-drift.yaml"),
                                       "--listen", f"127.0.0.1:{drift_port}", "--duration", str(int(duration + 60))])
            am = yaml.safe_load(AM_CONFIG.read_text())
            am["route"]["group_wait"] = group_wait
            for r in am["receivers"]:
                for w in r.get("webhook_configs") or []:
                    w["url"] = f"http://127.0.0.1:{receiver.port}/{r['name']}"
            (tmp / "alertmanager.yml").write_text(yaml.safe_dump(am))
            stack.start("alertmanager", [ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}",
                                         f"--storage.path={tmp / 'am'}", "--cluster.listen-address=",
                                         f"--web.listen-address=127.0.0.1:{am_port}"])
            (tmp / "prometheus.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
                "rule_files": [str(p) for p in RULE_FILES],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [
                    {"job_name": "vllm", "static_configs": [{"targets": [s.instance for s in servers]}]},
                    {"job_name": "vllm-drift", "static_configs": [{"targets": [f"127.0.0.1:{drift_port}"]}]},
                ]}))
            stack.start("prometheus", [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp / 'prom'}",
                                       f"--web.listen-address=127.0.0.1:{prom_port}"])
            prom, drift = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{drift_port}"
            wait_http(f"{prom}/-/ready", 60, stack)
            out(f"stack up after {time.time() - t0:.0f} s: Prometheus {prom}, Alertmanager "
                f"127.0.0.1:{am_port}, vllm-drift {drift}; watching {duration:.0f} s")
            if on_ready is not None:
                on_ready(time.time() - t0)   # e.g. start the load on external servers now
            shown: set[tuple[str, str]] = set()
            while (t := time.time() - t0) < duration:
                stack.check_alive()
                poll_once(servers, t, prom, drift)
                for n in receiver.notes:
                    for s in servers:
                        if n["status"] == "firing" and s.owns(n["labels"]):
                            s.mark("notification", n["t"], f"{n['labels'].get('alertname')} ({n['labels'].get('severity')})")
                            if n["labels"].get("alertname") in KV_ALERTS:
                                s.mark("kv_notification", n["t"], f"{n['labels'].get('alertname')} ({n['labels'].get('severity')})")
                for s in servers:
                    for hop in HOPS:
                        if hop in s.hops and (s.url, hop) not in shown:
                            shown.add((s.url, hop))
                            out(f"  {s.hops[hop]:6.0f} s  {s.role:<8} {hop:<17} {s.first[hop]}")
                if stop_early and all("kv_notification" in s.hops for s in servers if s.role == "pressure"):
                    break
                time.sleep(poll)
        finally:
            stack.stop()
            receiver.stop()
    return {"servers": servers, "notifications": receiver.notes, "duration": time.time() - t0}


HOPS = ("onset", "finding_warning", "finding_critical", "rule_pending", "rule_firing", "notification", "kv_notification")


def report(result: dict, limit: float, out=print) -> bool:
    ok = True
    out(f"\n{'server':<34} {'hop':<17} {'t (s)':>7} {'after onset':>12}  first")
    for s in result["servers"]:
        onset = s.hops.get("onset")
        for hop in HOPS:
            if hop not in s.hops:
                continue
            t = s.hops[hop]
            rel = f"{t - onset:+.0f}" if onset is not None and hop != "onset" else ""
            out(f"{s.role + ' ' + s.url:<34} {hop:<17} {t:>7.0f} {rel:>12}  {s.first[hop]}")
        if not s.hops:
            out(f"{s.role + ' ' + s.url:<34} (nothing)")
    out("\nnotifications (firing):")
    for n in result["notifications"]:
        if n["status"] != "firing":
            continue
        who = n["labels"].get("target") or n["labels"].get("instance", "")
        out(f"  {n['t']:6.0f} s  {n['receiver']:<7} {n['labels'].get('alertname')} "
            f"({n['labels'].get('severity')}) {who}: {n['annotations'].get('description', '')}")
    for s in result["servers"]:
        if s.role == "pressure":
            onset, page = s.hops.get("onset", 0.0), s.hops.get("kv_notification")
            good = page is not None and page - onset <= limit
            out(f"pressure {s.url}: KV notification {'after %.0f s from onset' % (page - onset) if page is not None else 'none'} "
                f"(goal <= {limit:.0f} s): {'ok' if good else 'FAIL'}")
            ok &= good
        else:
            pages = sorted({n["labels"].get("alertname") for n in result["notifications"]
                            if n["status"] == "firing" and s.owns(n["labels"])})
            out(f"healthy {s.url}: notifications {pages or 'none'}: {'FAIL' if pages else 'ok'}")
            ok &= not pages
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pressure-scenario", default="kv-pressure", help="simulated scenario of the pressure server")
    ap.add_argument("--healthy-scenario", default="healthy", help="simulated scenario of the healthy server")
    ap.add_argument("--target", action="append", default=[], metavar="ROLE=URL",
                    help="an external (e.g. real vLLM) server instead of the simulated one of that role")
    ap.add_argument("--gpu", default="L4", help="GPU hint for the simulated servers (default L4)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--duration", type=float, default=360, help="seconds to watch (default 360)")
    ap.add_argument("--limit", type=float, default=330, help="onset -> KV notification goal (default 330 s)")
    ap.add_argument("--group-wait", default="30s")
    ap.add_argument("--stop-early", action="store_true",
                    help="stop once every pressure server got its KV notification")
    ap.add_argument("--json", type=Path, help="write the hop times and notifications here")
    args = ap.parse_args(argv)
    ext = {}
    for item in args.target:
        role, sep, url = item.partition("=")
        if not sep or role not in ("pressure", "healthy") or not url.startswith("http://127.0.0.1:"):
            ap.error(f"--target {item!r}: expected pressure=URL or healthy=URL on http://127.0.0.1")
        ext[role] = url.rstrip("/")
    servers = [Server(role, ext[role]) if role in ext else
               Server(role, f"http://127.0.0.1:{free_port()}", scenario=scen)
               for role, scen in (("pressure", args.pressure_scenario), ("healthy", args.healthy_scenario))]
    try:
        result = run(servers, duration=args.duration, group_wait=args.group_wait, gpu=args.gpu, seed=args.seed,
                     stop_early=args.stop_early)
    except RuntimeError as exc:
        print(f"alert_e2e: {exc}", file=sys.stderr)
        return 2
    ok = report(result, args.limit)
    if args.json:
        args.json.write_text(json.dumps({
            "duration_s": round(result["duration"], 1), "limit_s": args.limit,
            "servers": [{"role": s.role, "url": s.url, "scenario": s.scenario, "hops_s": s.hops,
                         "first": s.first} for s in result["servers"]],
            "notifications": result["notifications"]}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
