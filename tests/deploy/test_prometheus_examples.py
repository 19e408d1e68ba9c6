"""The shipped Prometheus and Alertmanager examples (deploy/prometheus/, deploy/alertmanager/) work
as shipped: promtool and amtool accept them, their routes send each severity where the comments
say, the file_sd list feeds the daemon too, and the kubernetes_sd relabelling keeps the right pods
and rewrites a sidecar's loopback target to the pod IP inside a real Prometheus."""
from __future__ import annotations

import copy
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import REPO, free_port

PROM_DIR = REPO / "deploy" / "prometheus"
AM_EXAMPLE = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
K8S_EXAMPLE = PROM_DIR / "kubernetes-sd-scrape.yml"
PROMTOOL, AMTOOL, PROMETHEUS = shutil.which("promtool"), shutil.which("amtool"), shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (Debian package prometheus; scripts/test installs it)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool missing (Debian package prometheus-alertmanager)")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def test_examples_exist_for_static_file_sd_and_kubernetes_sd():
    names = {p.name for p in PROM_DIR.glob("*.yml")}
    assert {"prometheus-static.yml", "prometheus-file-sd.yml", "kubernetes-sd-scrape.yml"} <= names
    for p in PROM_DIR.glob("*.yml"):
        jobs = {j["job_name"] for j in yaml.safe_load(p.read_text())["scrape_configs"]}
        assert {"vllm", "vllm-drift"} <= jobs, p.name     # the job names the rules' defaults document


@needs_promtool
@pytest.mark.parametrize("name", ["prometheus-static.yml", "prometheus-file-sd.yml"])
def test_prometheus_example_passes_promtool_with_rules_and_sd_files(name):
    r = promtool("check", "config", str(PROM_DIR / name))    # full check: rule files, file_sd files
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout and "rules found" in r.stdout


# What Kubernetes SD (role: pod) sets for one container port of a pod; Debian's Prometheus is built
# without Kubernetes SD, so the tests hand these labels to the same relabelling through file_sd.
def _pod(address: str, app: str, port_name: str, pod: str, ns: str = "llm", phase: str = "Running") -> dict:
    host, port = address.rsplit(":", 1)
    return {"targets": [address], "labels": {
        "__meta_kubernetes_namespace": ns, "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_ip": host, "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_node_name": "gpu-node-1",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
        "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name": "true",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_number": port,
        "__meta_kubernetes_pod_container_port_protocol": "TCP"}}


def _as_file_sd(cfg: dict, sd_file: Path) -> dict:
    """The example with every kubernetes_sd_configs block replaced by file_sd on `sd_file`."""
    out = copy.deepcopy(cfg)
    for job in out["scrape_configs"]:
        for block in job.pop("kubernetes_sd_configs"):
            assert block["role"] == "pod" and set(block) <= {"role", "namespaces", "selectors"}
        job["file_sd_configs"] = [{"files": [str(sd_file)], "refresh_interval": "1s"}]
    out.pop("alerting", None)
    out["rule_files"] = [str((K8S_EXAMPLE.parent / f).resolve()) for f in cfg["rule_files"]]
    return out


@needs_promtool
def test_kubernetes_sd_example_is_valid_apart_from_the_sd_block(tmp_path):
    cfg = yaml.safe_load(K8S_EXAMPLE.read_text())
    for am in cfg["alerting"]["alertmanagers"]:
        assert [b["role"] for b in am["kubernetes_sd_configs"]] == ["pod"]
    sd = tmp_path / "pods.json"
    sd.write_text(json.dumps([_pod("10.1.2.3:8000", "vllm", "http", "vllm-0")]))
    out = tmp_path / "prometheus.yml"
    out.write_text(yaml.safe_dump(_as_file_sd(cfg, sd)))
    r = promtool("check", "config", str(out))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_amtool
def test_alertmanager_example_passes_amtool_and_routes_by_severity():
    r = subprocess.run([AMTOOL, "check-config", str(AM_EXAMPLE)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    alerts = yaml.safe_load((REPO / "rules" / "prometheus_alerts.yaml").read_text())
    names = {rule["alert"] for g in alerts["groups"] for rule in g["rules"]}
    cases = {("VLLMKVCachePressure", "critical"): "pager", ("VLLMKVCachePressure", "warning"): "ticket",
             ("VLLMDriftIdleCapacity", "warning"): "llm-platform-tickets", ("Anything", "info"): "blackhole",
             ("VLLMDriftKVPressure", "warning"): "ticket", ("VLLMDriftKVPressure", "critical"): "pager"}
    for (alert, severity), receiver in cases.items():
        assert alert in names or alert == "Anything"
        r = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={AM_EXAMPLE}",
                            f"alertname={alert}", f"severity={severity}"], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == receiver, (alert, severity, r.stdout, r.stderr)


def test_file_sd_list_is_the_daemons_target_list_too(monkeypatch):
    from exporter.config import load_config
    from exporter.discovery.file_sd import parse_file_sd

    monkeypatch.chdir(REPO)     # the daemon example names the file relative to the repository root
    cfg = load_config(str(PROM_DIR / "vllm-drift-file-sd.yaml"))
    assert cfg.file_sd == ["deploy/prometheus/targets/vllm.yml"]
    path = REPO / cfg.file_sd[0]
    specs = parse_file_sd(str(path), path.read_text())
    assert {s.url for s in specs} == {"http://10.0.1.11:8000", "http://10.0.1.12:8000", "http://10.0.2.21:8000"}
    big = next(s for s in specs if s.url.endswith("10.0.2.21:8000"))
    assert (big.gpu, big.tp, big.model) == ("A100-80GB", 4, "meta-llama/Llama-3.1-70B-Instruct")
    prom = yaml.safe_load((PROM_DIR / "prometheus-file-sd.yml").read_text())
    vllm_job = next(j for j in prom["scrape_configs"] if j["job_name"] == "vllm")
    assert vllm_job["file_sd_configs"][0]["files"] == ["targets/vllm.yml"]   # the same file, from Prometheus


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@needs_promtool
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus missing (Debian package prometheus)")
def test_kubernetes_relabelling_in_a_real_prometheus(tmp_path, cli_env):
    """A vLLM pod with a sidecar at pod IP 127.0.0.2 (loopback), its vLLM also reachable on
    127.0.0.1 as inside the pod; a fleet-daemon pod; an unrelated pod. Prometheus must scrape vLLM
    as job vllm, the sidecar and the daemon as job vllm-drift, drop the rest, and rewrite the
    sidecar's target http://127.0.0.1:P to http://127.0.0.2:P = the vLLM series' instance."""
    p = free_port()
    sims = [subprocess.Popen([sys.executable, "-m", "exporter", "simulate", "--host", host, "--port", str(p),
                              "--speed", "10", "--duration", "120"], env=cli_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for host in ("127.0.0.1", "127.0.0.2")]
    dport = free_port()
    dcfg = tmp_path / "sidecar.yaml"
    dcfg.write_text(f"scrape: {{interval: 1s, timeout: 1s}}\nevaluation: {{interval: 2s, window: 10s}}\n"
                    f"targets:\n  - url: http://127.0.0.1:{p}\n")
    sidecar = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(dcfg),
                                "--listen", f"127.0.0.2:{dport}", "--duration", "120"], env=cli_env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sd = tmp_path / "pods.json"
    sd.write_text(json.dumps([
        _pod(f"127.0.0.2:{p}", "vllm", "http", "vllm-0"),
        _pod(f"127.0.0.2:{dport}", "vllm", "drift-metrics", "vllm-0"),
        _pod(f"127.0.0.3:{free_port()}", "vllm-drift", "metrics", "vllm-drift-fleet-0", ns="monitoring"),
        _pod(f"127.0.0.4:{free_port()}", "redis", "http", "cache-0"),
        _pod(f"127.0.0.5:{p}", "vllm", "http", "vllm-done", phase="Succeeded"),
    ]))
    cfg = _as_file_sd(yaml.safe_load(K8S_EXAMPLE.read_text()), sd)
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in cfg["scrape_configs"]:
        job.pop("scrape_interval", None)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    pport = free_port()
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{pport}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{pport}"
    try:
        def q(expr):
            return _get_json(base + "/api/v1/query?query=" + urllib.parse.quote(expr))["data"]["result"]

        deadline, drift, vllm = time.monotonic() + 60, [], []
        while time.monotonic() < deadline and not (drift and vllm):
            time.sleep(1)
            try:
                drift = q('vllm_drift_target_up{job="vllm-drift"} == 1')
                vllm = q('vllm:num_requests_running{job="vllm"}')
            except OSError:
                pass
        targets = _get_json(base + "/api/v1/targets")["data"]
    finally:
        _stop(prom, sidecar, *sims)
    active = {(t["labels"]["job"], t["labels"]["instance"]): t["labels"] for t in targets["activeTargets"]}
    assert set(active) == {("vllm", f"127.0.0.2:{p}"), ("vllm-drift", f"127.0.0.2:{dport}"),
                           ("vllm-drift", next(g["targets"][0] for g in json.loads(sd.read_text())
                                               if g["labels"]["__meta_kubernetes_pod_name"] == "vllm-drift-fleet-0"))}
    assert active[("vllm", f"127.0.0.2:{p}")]["pod"] == "vllm-0" and active[("vllm", f"127.0.0.2:{p}")]["namespace"] == "llm"
    assert len(targets["droppedTargets"]) >= 2 * 5 - 3
    assert drift and vllm, "no series from the sidecar or from vLLM"
    # the sidecar's loopback target, rewritten to the pod IP: it names the vLLM series' instance
    assert {s["metric"]["target"] for s in drift} == {f"http://127.0.0.2:{p}"}
    assert {s["metric"]["instance"] for s in vllm} == {f"127.0.0.2:{p}"}
