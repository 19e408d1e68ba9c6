"""End to end on loopback with real components: simulated vLLM servers -> `vllm-drift serve`
-> a real Prometheus (scraping the daemon and the servers, with the shipped rules) -> a real
Alertmanager (the shipped routing) -> a webhook receiver in this test.

Asserts that the KV-pressure alert reaches the receiver for the kv-pressure server and never
for the healthy one, and that every dashboard query is valid PromQL for that Prometheus and
returns data from it.

The rules are built from rules/thresholds.yaml by rules/build.py with every `for:` set to 0s
(alerts cannot wait 10 minutes in a test; `for:` timing is covered by the promtool unit tests),
and Alertmanager's group waits are shortened; everything else is the shipped configuration.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = REPO
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
VLLM_DRIFT = shutil.which("vllm-drift", path=str(Path(sys.executable).parent)) or shutil.which("vllm-drift")
# one server per role the dashboards need: KV pressure (alert), healthy (no alert, prefix
# caching), speculative decoding, and the tier/idle scenarios for the cost dashboard
SCENARIOS = {"kv-pressure": "L4", "healthy": "L4", "spec-decode-harmful": "L40S",
             "wrong-tier": "B200-180GB", "idle-overprovisioned": "H100-SXM-80GB"}
FAST_FOR = ["kv_cache.warning_for=0s", "kv_cache.critical_for=0s", "preemption.for=0s",
            "queue.for=0s", "slo.for=0s", "misconfiguration.for=0s", "tier_misplacement.for=0s",
            "idle_capacity.for=0s", "target_down.for=0s", "metrics_absent.for=0s",
            "evaluation_stalled.for=0s"]
ALERT_WAIT_S = 150
DATA_WAIT_S = 180

if PROMETHEUS is None or ALERTMANAGER is None:
    pytest.skip("prometheus / prometheus-alertmanager not installed (apt-get install prometheus "
                "prometheus-alertmanager); CI installs them", allow_module_level=True)
if VLLM_DRIFT is None:
    pytest.skip("vllm-drift console script not installed (pip install -e .)", allow_module_level=True)


def _flag_hints(scenario: str) -> dict:
    """What an operator knows about a server and vLLM does not export: its --max-num-seqs and
    --max-num-batched-tokens, taken from the scenario's own definition when it is at hand."""
    path = ROOT / "exporter" / "sim" / "scenarios" / f"{scenario}.yaml"
    if not path.exists():
        return {}
    flags = (yaml.safe_load(path.read_text()) or {}).get("vllm") or {}
    return {k: flags[k] for k in ("max_num_seqs", "max_num_batched_tokens") if k in flags}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen, name: str) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{name} not answering {url} after {deadline_s}s")


class Receiver:
    """Alertmanager webhook receiver: records every alert it is sent, with the receiver path."""

    def __init__(self):
        self.alerts: list[tuple[str, dict]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.alerts += [(self.path, a) for a in body.get("alerts", [])]
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                cwd=self.tmp, env=env, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {n} (rc={p.poll()}) ---\n" + l.read_text(errors="replace")[-1500:]
                         for n, p, l in self.procs)

    def stop(self):
        for _, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p, _ in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    s = Stack(tmp)
    receiver = Receiver()
    try:
        # simulated fleet
        sims = {}
        for scen, gpu in SCENARIOS.items():
            port = free_port()
            sims[scen] = port
            s.start(f"sim-{scen}", [VLLM_DRIFT, "simulate", "--host", "127.0.0.1", "--port", str(port),
                                    "--scenario", scen, "--duration", "580"])
        # the daemon
        drift_port = free_port()
        (tmp / "vllm-drift.yaml").write_text(yaml.safe_dump({
            "listen": f"127.0.0.1:{drift_port}",
            "scrape": {"interval": "2s", "timeout": "2s"},
            "evaluation": {"interval": "3s", "window": "2m"},
            "targets": [{"url": f"http://127.0.0.1:{p}", "gpu": SCENARIOS[n], "tp": 1, **_flag_hints(n)}
                        for n, p in sims.items()],
        }))
        s.start("vllm-drift", [VLLM_DRIFT, "serve", "--config", str(tmp / "vllm-drift.yaml"),
                               "--duration", "580"])
        # rules from the shipped source, `for:` shortened
        res = subprocess.run([sys.executable, str(ROOT / "rules" / "build.py"), "--out-dir", str(tmp),
                              *[a for kv in FAST_FOR for a in ("--set", kv)]],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        # the shipped Alertmanager routing, receivers pointed at this test, waits shortened
        am = yaml.safe_load((ROOT / "deploy" / "compose" / "alertmanager.yml").read_text())
        am["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1m")
        for r in am["receivers"]:
            for w in r.get("webhook_configs") or []:
                w["url"] = f"http://127.0.0.1:{receiver.port}/{r['name']}"
        (tmp / "alertmanager.yml").write_text(yaml.safe_dump(am))
        am_port = free_port()
        s.start("alertmanager", [ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}",
                                 f"--storage.path={tmp / 'am-data'}",
                                 f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="])
        # Prometheus scraping the servers and the daemon
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(tmp / "rules" / "prometheus_rules.yaml"), str(tmp / "rules" / "prometheus_alerts.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in sims.values()]}]},
                {"job_name": "vllm-drift", "static_configs": [{"targets": [f"127.0.0.1:{drift_port}"]}]},
            ]}))
        prom = s.start("prometheus", [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp / 'prom-data'}",
                                      f"--web.listen-address=127.0.0.1:{prom_port}"])
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", 60, prom, "prometheus")
        yield {"sims": sims, "prom": f"http://127.0.0.1:{prom_port}", "receiver": receiver, "stack": s,
               "drift": f"http://127.0.0.1:{drift_port}"}
    finally:
        s.stop()
        receiver.stop()


def query(prom: str, expr: str) -> list[dict]:
    data = get_json(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10)
    assert data["status"] == "success", data
    return data["data"]["result"]


def kv_alerts(receiver: Receiver, instance: str) -> list[tuple[str, dict]]:
    return [(path, a) for path, a in list(receiver.alerts)
            if a["labels"].get("alertname") == "VLLMKVCachePressure" and a["labels"].get("instance") == instance]


def test_kv_pressure_alert_reaches_the_receiver_for_the_kv_pressure_server_only(stack):
    kv_inst = f"127.0.0.1:{stack['sims']['kv-pressure']}"
    ok_inst = f"127.0.0.1:{stack['sims']['healthy']}"
    end = time.monotonic() + ALERT_WAIT_S
    while time.monotonic() < end and not kv_alerts(stack["receiver"], kv_inst):
        time.sleep(1)
    got = kv_alerts(stack["receiver"], kv_inst)
    assert got, "no VLLMKVCachePressure alert delivered for the kv-pressure server\n" + stack["stack"].logs()
    path, alert = got[0]
    # routed by the shipped Alertmanager config: warning -> ticket, critical -> pager
    assert path == {"warning": "/ticket", "critical": "/pager"}[alert["labels"]["severity"]]
    assert alert["status"] == "firing"
    assert alert["annotations"]["runbook_url"].endswith("#vllmkvcachepressure")
    assert kv_inst in alert["annotations"]["description"]
    # the healthy server is scraped, evaluated, and below the threshold: no alert in any state
    usage = query(stack["prom"], f'instance_model:vllm_kv_cache_usage_perc:max{{instance="{ok_inst}"}}')
    assert usage and float(usage[0]["value"][1]) < 0.9
    time.sleep(5)
    assert kv_alerts(stack["receiver"], ok_inst) == []
    active = get_json(f"{stack['prom']}/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in active if a["labels"].get("alertname") == "VLLMKVCachePressure"
                and a["labels"].get("instance") == ok_inst]


def _dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for f in sorted((ROOT / "grafana" / "dashboards").glob("*.json")):
        d = json.loads(f.read_text())
        stack = list(d["panels"])
        while stack:
            p = stack.pop(0)
            stack.extend(p.get("panels") or [])
            out += [(f"{f.name}: {p['title']} [{t['refId']}]", t["expr"]) for t in p.get("targets") or []]
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", v["query"]["query"], flags=re.S)
                out.append((f"{f.name}: variable {v['name']}", inner.group(1) if inner else v["query"]["query"]))
    return out


def _grafana_substitute(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "5m")
    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", ".*", expr)  # not label_replace's $1


def test_every_dashboard_query_is_valid_and_returns_data(stack):
    queries = _dashboard_queries()
    assert len(queries) >= 20
    pending = dict(queries)
    end = time.monotonic() + DATA_WAIT_S
    while pending and time.monotonic() < end:
        for where, expr in list(pending.items()):
            # invalid PromQL makes Prometheus answer 400: raised here, not retried
            if query(stack["prom"], _grafana_substitute(expr)):
                del pending[where]
        if pending:
            time.sleep(3)
    assert not pending, ("dashboard queries without data after "
                         f"{DATA_WAIT_S}s:\n" + "\n".join(f"{w}: {e}" for w, e in pending.items()))


def test_instance_variable_maps_each_daemon_target_to_its_vllm_series(stack):
    """The instance dashboard derives `instance` from the daemon's `target` with the variable's
    regex; each derived value must select that server's own vLLM series in Prometheus."""
    d = json.loads((ROOT / "grafana" / "dashboards" / "vllm-drift-instance.json").read_text())
    var = next(v for v in d["templating"]["list"] if v["name"] == "instance")
    rx = re.compile(var["regex"][1:-1].replace("\\/", "/"))
    inner = re.fullmatch(r"label_values\((.*),\s*target\)", var["query"]["query"], flags=re.S).group(1)
    end = time.monotonic() + 60
    targets: set[str] = set()
    while time.monotonic() < end and len(targets) < len(SCENARIOS):
        targets = {r["metric"]["target"] for r in query(stack["prom"], _grafana_substitute(inner))}
        time.sleep(1)
    assert len(targets) == len(SCENARIOS)
    for t in targets:
        inst = rx.match(t).group(1)
        assert inst in {f"127.0.0.1:{p}" for p in stack["sims"].values()}
        assert query(stack["prom"], f'instance_model:vllm_num_requests_running:sum{{instance="{inst}"}}'), t


def test_tier_misplacement_alert_joins_real_daemon_series(stack):
    """VLLMDriftTierMisplacement joins waste and misplacement score with group_left: on the
    daemon's real series it must fire for the wrong-tier server (with both GPU labels) and not
    for the healthy one."""
    wrong = f"http://127.0.0.1:{stack['sims']['wrong-tier']}"
    healthy = f"http://127.0.0.1:{stack['sims']['healthy']}"

    def tier_alerts(target: str) -> list[dict]:
        return [a for _, a in list(stack["receiver"].alerts)
                if a["labels"].get("alertname") == "VLLMDriftTierMisplacement" and a["labels"].get("target") == target]

    end = time.monotonic() + ALERT_WAIT_S
    while time.monotonic() < end and not tier_alerts(wrong):
        time.sleep(1)
    got = tier_alerts(wrong)
    assert got, "no VLLMDriftTierMisplacement delivered for the wrong-tier server\n" + stack["stack"].logs()
    labels = got[0]["labels"]
    assert labels["current_gpu"] and labels["recommended_gpu"] and labels["current_gpu"] != labels["recommended_gpu"]
    waste = query(stack["prom"], f'vllm_drift_estimated_waste_dollars_per_hour{{target="{wrong}"}}')
    assert waste and float(waste[0]["value"][1]) > 1.0
    shown = re.search(r"estimated waste \$(\d+\.\d\d)/hour", got[0]["annotations"]["description"])
    assert shown and float(shown.group(1)) > 1.0, got[0]["annotations"]["description"]
    assert tier_alerts(healthy) == []


def test_every_shipped_rule_evaluates_without_error_on_real_series(stack):
    """Matching errors (duplicate series in a group_left, many-to-many `or`) only show with
    real label sets: every rule must report health ok once evaluated."""
    end = time.monotonic() + 30
    while True:
        groups = get_json(f"{stack['prom']}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if all(r["health"] == "ok" for r in rules) or time.monotonic() > end:
            break
        time.sleep(1)
    shipped = sum(len(g["rules"]) for f in ("prometheus_rules.yaml", "prometheus_alerts.yaml")
                  for g in yaml.safe_load((ROOT / "rules" / f).read_text())["groups"])
    assert len(rules) == shipped
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad


def test_misconfiguration_alert_names_configured_and_recommended_values(stack):
    """The misconfiguration alert's description looks up the configured and recommended values
    with the `query` template function; on the real Prometheus both must resolve."""
    end = time.monotonic() + ALERT_WAIT_S
    got: list[dict] = []
    while time.monotonic() < end and not got:
        got = [a for _, a in list(stack["receiver"].alerts)
               if a["labels"].get("alertname") == "VLLMDriftMisconfiguration"]
        time.sleep(1)
    assert got, "no VLLMDriftMisconfiguration delivered\n" + stack["stack"].logs()
    healthy = f"http://127.0.0.1:{stack['sims']['healthy']}"
    assert not [a for a in got if a["labels"]["target"] == healthy]
    for a in got:
        m = re.search(r"configured (\S+), recommended (\S+)\.$", a["annotations"]["description"])
        assert m, a["annotations"]["description"]
        assert m.group(2) != "unknown", a["annotations"]["description"]
        rec = query(stack["prom"], f'vllm_drift_recommended_value{{target="{a["labels"]["target"]}",'
                                   f'parameter="{a["labels"]["finding"]}"}}')  # setting findings are named after it
        assert rec
