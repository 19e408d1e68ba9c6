"""Tests for deploy/: the Dockerfile (static: non-root, healthcheck, pip install .), the compose
stack (every service, mount and target consistent), Prometheus and Alertmanager configs
(promtool / amtool), the daemon configs (loaded by the daemon's own config loader) and the
Kubernetes manifests (built-in kinds against the Kubernetes OpenAPI schemas, Prometheus
Operator kinds against structural schemas, selectors/ports/RBAC wired together, the
PrometheusRule equal to what rules/build.py generates)."""
from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "kubernetes"
SCENARIOS = ["healthy", "kv-pressure", "max-num-seqs-too-low", "oversized-max-model-len",
             "low-gpu-memory-utilization", "idle-overprovisioned", "wrong-tier",
             "spec-decode-harmful", "prefix-caching-off"]  # INTERFACE.md, `vllm-drift simulate`
K8S_VERSION = "1.30.0"


def _tool(name: str):
    return pytest.mark.skipif(shutil.which(name) is None,
                              reason=f"{name} not installed (apt-get install prometheus "
                                     "prometheus-alertmanager); CI installs it")


# ---- Dockerfile -------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_runs_non_root_with_healthcheck_and_pip_install():
    ins = dockerfile()
    ops = [op for op, _ in ins]
    assert ops[0] == "FROM" and re.match(r"python:3\.1[1-9]", ins[0][1])
    users = [arg for op, arg in ins if op == "USER"]
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN"), "RUN after USER"
    assert any(op == "RUN" and re.search(r'pip install "?\.(\$\{EXTRAS\}|\[[a-z,]+\])?"?(\s|$)', arg) for op, arg in ins)
    (hc,) = [arg for op, arg in ins if op == "HEALTHCHECK"]
    assert "/-/healthy" in hc and "9877" in hc and "CMD" in hc
    assert ("EXPOSE", "9877") in ins
    entry = next(arg for op, arg in ins if op == "ENTRYPOINT")
    assert entry == '["vllm-drift"]'
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^vllm-drift = "exporter\.cli:main"', pyproject, flags=re.M)


def test_dockerfile_copy_sources_exist_and_are_not_ignored():
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    kept = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    for op, arg in dockerfile():
        if op == "COPY" and "--from" not in arg:
            *srcs, _dest = arg.split()
            for src in srcs:
                assert (ROOT / src).exists(), f"COPY source {src} missing from the repo"
                assert src.rstrip("/") in kept, f"COPY source {src} excluded by Dockerfile.dockerignore"


def test_healthcheck_command_tells_healthy_from_down(tmp_path):
    """Run the image's HEALTHCHECK command against the real daemon on loopback."""
    import socket
    import time

    (hc,) = [arg for op, arg in dockerfile() if op == "HEALTHCHECK"]
    argv = yaml.safe_load(hc.split("CMD", 1)[1].strip())  # JSON exec form
    assert argv[0] == "python" and "127.0.0.1:9877" in argv[-1]
    # same command, pointed at a free loopback port instead of the daemon's 9877
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a.replace("127.0.0.1:9877", f"127.0.0.1:{port}") for a in argv]

    daemon = shutil.which("vllm-drift", path=str(Path(sys.executable).parent)) or shutil.which("vllm-drift")
    if daemon is None:
        pytest.skip("vllm-drift console script not installed (pip install -e .)")
    # the real daemon, one unreachable target: /-/healthy must still answer
    proc = subprocess.Popen([daemon, "serve", "--listen", f"127.0.0.1:{port}", "--target",
                             "http://127.0.0.1:9", "--duration", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([sys.executable, *argv[1:]], timeout=10, capture_output=True).returncode:
            assert proc.poll() is None, "vllm-drift serve exited"
            assert time.monotonic() < deadline, "HEALTHCHECK never passed against a running daemon"
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert subprocess.run([sys.executable, *argv[1:]], timeout=10,
                          capture_output=True).returncode != 0


# ---- compose ----------------------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def test_compose_simulates_every_scenario_and_wires_the_stack():
    services = compose()["services"]
    sims = {n: s for n, s in services.items() if s.get("command", [None])[0] == "simulate"}
    scen = {}
    for name, s in sims.items():
        cmd = s["command"]
        scen[cmd[cmd.index("--scenario") + 1]] = name
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and "--port" in cmd
        assert s["read_only"] is True and s["image"] == "vllm-drift:local"
    assert sorted(scen) == sorted(SCENARIOS)
    for needed in ("vllm-drift", "prometheus", "alertmanager", "grafana"):
        assert needed in services
    assert services["vllm-drift"]["command"][0] == "serve"
    assert (ROOT / services["vllm-drift"]["build"]["context"].replace("../..", ".")).exists()
    assert (COMPOSE / services["vllm-drift"]["build"]["context"] / services["vllm-drift"]["build"]["dockerfile"]).exists()

    # every simulated server is a daemon target and a Prometheus `vllm` scrape target
    daemon_cfg = yaml.safe_load((COMPOSE / "vllm-drift.yaml").read_text())
    urls = {t["url"] for t in daemon_cfg["targets"]}
    assert urls == {f"http://{n}:8000" for n in sims}
    prom = yaml.safe_load((COMPOSE / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "vllm")
    assert set(job["static_configs"][0]["targets"]) == {f"{n}:8000" for n in sims}
    drift = next(j for j in prom["scrape_configs"] if j["job_name"] == "vllm-drift")
    assert drift["static_configs"][0]["targets"] == ["vllm-drift:9877"]


def test_compose_bind_mounts_exist_and_match_provisioning():
    services = compose()["services"]
    mounts = {}
    for name, s in services.items():
        for v in s.get("volumes") or []:
            src, dest = v.split(":")[:2]
            if src.startswith("."):
                assert (COMPOSE / src).exists(), f"{name}: bind source {src} missing"
                mounts[dest] = (COMPOSE / src).resolve()
    assert mounts["/etc/prometheus/rules"] == (ROOT / "rules").resolve()
    assert mounts["/etc/grafana/provisioning"] == (ROOT / "grafana" / "provisioning").resolve()
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/vllm-drift.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert mounts[path] == (ROOT / "grafana" / "dashboards").resolve()
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "grafana" / "dashboards" / Path(home).name).exists() and home.startswith(path)
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


@_tool("promtool")
def test_prometheus_config_passes_promtool_with_the_shipped_rules(tmp_path):
    shutil.copy(COMPOSE / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(ROOT / "rules", tmp_path / "rules")  # the compose mount layout
    res = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "2 rule files found" in out


@_tool("amtool")
def test_alertmanager_config_and_routing():
    cfg = str(COMPOSE / "alertmanager.yml")
    res = subprocess.run(["amtool", "check-config", cfg], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    for labels, receiver in ((["severity=critical", "alertname=VLLMKVCachePressure"], "pager"),
                             (["severity=warning", "alertname=VLLMQueueBacklog"], "ticket"),
                             (["severity=info"], "blackhole")):
        res = subprocess.run(["amtool", "config", "routes", "test", "--config.file", cfg,
                              f"--verify.receivers={receiver}", *labels],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"{labels} -> {res.stdout.strip()} (wanted {receiver})"


def _daemon_configs() -> list[tuple[str, dict]]:
    out = [("deploy/compose/vllm-drift.yaml", yaml.safe_load((COMPOSE / "vllm-drift.yaml").read_text()))]
    for f in ("fleet.yaml", "sidecar.yaml"):
        for d in yaml.safe_load_all((K8S / f).read_text()):
            if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]:
                out.append((f"deploy/kubernetes/{f}", yaml.safe_load(d["data"]["config.yaml"])))
    return out


def test_daemon_configs_load_with_the_daemons_loader():
    config = pytest.importorskip("exporter.config", reason="daemon config module not importable")
    loaded = {src: config.config_from_dict(data, source=src) for src, data in _daemon_configs()}
    assert len(loaded) == 3
    assert loaded["deploy/kubernetes/fleet.yaml"].kubernetes.label_selector == "app.kubernetes.io/name=vllm"
    assert [t.url for t in loaded["deploy/kubernetes/sidecar.yaml"].targets] == ["http://127.0.0.1:8000"]


# ---- Kubernetes -------------------------------------------------------------------------
def manifests() -> list[tuple[str, dict]]:
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        docs += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string"}}, "separator": {"type": "string"},
    "targetLabel": {"type": "string"}, "regex": {"type": "string"}, "modulus": {"type": "integer"},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                        "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                        "dropequal", "DropEqual"]}}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_ENDPOINT = {"type": "object", "additionalProperties": False, "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
    "interval": _DURATION, "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL}}}
_SELECTOR = {"type": "object", "properties": {"matchLabels": {"type": "object",
             "additionalProperties": {"type": "string"}}, "matchExpressions": {"type": "array"}}}
_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
# Structural subsets of the Prometheus Operator v1 CRDs (monitoring.coreos.com): the fields we
# use, with additionalProperties false so a typo fails.
CRD_SCHEMAS = {
    "ServiceMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                       "properties": {"metadata": _META, "spec": {
                           "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                           "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                          "jobLabel": {"type": "string"},
                                          "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
    "PodMonitor": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                   "properties": {"metadata": _META, "spec": {
                       "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
                       "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                      "jobLabel": {"type": "string"},
                                      "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}}},
    "PrometheusRule": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                       "properties": {"metadata": _META, "spec": {
                           "type": "object", "required": ["groups"], "additionalProperties": False,
                           "properties": {"groups": {"type": "array", "items": {
                               "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                               "properties": {"name": {"type": "string"}, "interval": _DURATION,
                                              "rules": {"type": "array", "items": {
                                                  "type": "object", "required": ["expr"], "additionalProperties": False,
                                                  "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                                  "properties": {"record": {"type": "string"}, "alert": {"type": "string"},
                                                                 "expr": {"type": "string"}, "for": _DURATION,
                                                                 "keep_firing_for": _DURATION,  # operator >= 0.65
                                                                 "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                                                 "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}}}}},
}


def test_builtin_kinds_validate_against_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extra)")
    kinds = set()
    for name, doc in manifests():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{name} {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
        kinds.add(doc["kind"])
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "ConfigMap"} <= kinds


def test_operator_kinds_validate_structurally():
    jsonschema = pytest.importorskip("jsonschema")
    seen = set()
    for name, doc in manifests():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
            seen.add(doc["kind"])
    assert seen == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_structural_schema_rejects_a_typo():
    jsonschema = pytest.importorskip("jsonschema")
    doc = next(d for _, d in manifests() if d["kind"] == "ServiceMonitor")
    bad = yaml.safe_load(yaml.safe_dump(doc))
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CRD_SCHEMAS["ServiceMonitor"])


def _pods(docs):
    for name, d in docs:
        if d["kind"] == "Deployment":
            yield name, d, d["spec"]["template"]


def test_selectors_ports_probes_and_security_are_wired():
    docs = manifests()
    by_kind: dict[str, list[dict]] = {}
    for _, d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    configmaps = {d["metadata"]["name"] for d in by_kind["ConfigMap"]}
    for name, dep, tpl in _pods(docs):
        labels = tpl["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        for vol in tpl["spec"].get("volumes") or []:
            if "configMap" in vol:
                assert vol["configMap"]["name"] in configmaps, f"{name}: missing ConfigMap"
        for c in tpl["spec"]["containers"]:
            if "vllm-drift" not in c["image"]:
                continue
            sec = {**(tpl["spec"].get("securityContext") or {}), **(c.get("securityContext") or {})}
            assert sec["runAsNonRoot"] and sec["readOnlyRootFilesystem"], f"{name}: {c['name']}"
            assert sec["allowPrivilegeEscalation"] is False
            assert c["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
            assert c["readinessProbe"]["httpGet"]["path"] == "/-/ready"
            assert [p["containerPort"] for p in c["ports"]] == [9877]
            assert "nvidia.com/gpu" not in str(c.get("resources")), "the daemon needs no GPU"
    pod_templates = [t for _, _, t in _pods(docs)]
    for mon in by_kind["PodMonitor"]:
        sel = mon["spec"]["selector"]["matchLabels"]
        matched = [t for t in pod_templates if sel.items() <= t["metadata"]["labels"].items()]
        ports = {p["name"] for t in matched for c in t["spec"]["containers"] for p in c.get("ports") or []}
        for ep in mon["spec"]["podMetricsEndpoints"]:
            # the fleet PodMonitor selects the user's vLLM pods (not in these files): port `http`
            assert ep["port"] in ports or (not matched and ep["port"] == "http"), mon["metadata"]["name"]
    services = by_kind["Service"]
    for mon in by_kind["ServiceMonitor"]:
        sel = mon["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
        assert {e["port"] for e in mon["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
        assert any(svc["spec"]["selector"].items() <= t["metadata"]["labels"].items() for t in pod_templates)


def test_fleet_rbac_allows_discovery_for_the_daemons_service_account():
    docs = [d for _, d in manifests()]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {(res, verb) for r in role["rules"] for res in r["resources"] for verb in r["verbs"]}
    for res in ("pods", "nodes"):
        for verb in ("get", "list", "watch"):
            assert (res, verb) in granted
    assert not any(v in {"create", "update", "patch", "delete", "*"} for r in role["rules"] for v in r["verbs"])
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "vllm-drift")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": dep["metadata"]["namespace"]} in binding["subjects"]


def test_sidecar_relabeling_maps_loopback_target_to_pod_ip():
    """The PodMonitor rewrites the sidecar's target (127.0.0.1) to the pod IP, so the
    dashboards' instance variable (host:port of target) matches vLLM's own instance label."""
    mon = next(d for n, d in manifests() if n == "sidecar.yaml" and d["kind"] == "PodMonitor")
    (rule,) = [r for ep in mon["spec"]["podMetricsEndpoints"] for r in ep.get("metricRelabelings") or []]
    joined = ";".join(["http://127.0.0.1:8000", "10.1.2.3:9877"])  # target;instance
    m = re.fullmatch(rule["regex"], joined)  # Prometheus anchors relabel regexes
    assert m
    rewritten = re.sub(r"\$(\d)", lambda g: m.group(int(g.group(1))), rule["replacement"])
    assert rewritten == "http://10.1.2.3:8000"
    assert re.fullmatch(rule["regex"], "http://10.9.9.9:8000;10.1.2.3:9877") is None


def test_kustomization_lists_existing_files():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["resources"] and all((K8S / r).exists() for r in kust["resources"])
    assert "prometheusrule.yaml" in kust["resources"]


def _rules_build():
    spec = importlib.util.spec_from_file_location("rules_build_deploy", ROOT / "rules" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prometheusrule_is_generated_from_rules():
    b = _rules_build()
    assert (ROOT / b.CRD_FILE).read_text() == b.render(b.load_thresholds())[b.CRD_FILE]
    crd = yaml.safe_load((ROOT / b.CRD_FILE).read_text())
    plain = [g for f in (b.RULES_FILE, b.ALERTS_FILE) for g in yaml.safe_load((ROOT / f).read_text())["groups"]]
    assert crd["spec"]["groups"] == plain


@_tool("promtool")
def test_prometheusrule_spec_passes_promtool(tmp_path):
    crd = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"groups": crd["spec"]["groups"]}))
    res = subprocess.run(["promtool", "check", "rules", str(tmp_path / "spec.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_readme_commands_refer_to_existing_paths():
    text = (DEPLOY / "README.md").read_text()
    for cmd in re.findall(r"^\s*(?:docker|kubectl)[^\n]*$", text, flags=re.M):
        for tok in shlex.split(cmd):
            if tok.startswith(("deploy/", "grafana/", "rules/")):
                assert (ROOT / tok.rstrip("/")).exists(), f"README refers to missing {tok}"


def test_dashboards_configmap_is_generated_and_holds_the_dashboards():
    import json

    spec = importlib.util.spec_from_file_location("grafana_build_deploy", ROOT / "grafana" / "build.py")
    gb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gb)
    path = K8S / "grafana-dashboards.yaml"
    assert path.read_text() == gb.render_configmap(gb.render()), "stale: run python grafana/build.py"
    cm = yaml.safe_load(path.read_text())
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: json.loads(p.read_text()) for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
    assert {k: json.loads(v) for k, v in cm["data"].items()} == files
    # kubectl apply keeps the whole object in an annotation limited to 256 KiB
    assert len(path.read_bytes()) < 200_000


def test_state_dir_is_a_writable_volume_under_a_read_only_root():
    """The daemon writes only its state file: every shipped deployment runs it with a read-only
    root filesystem, sets `state_dir`, and mounts a writable volume exactly there; the image
    creates that directory owned by its unprivileged user (a named volume inherits the owner)."""
    ins = dockerfile()
    uid = [arg for op, arg in ins if op == "USER"][-1].split(":")[0]
    assert any(op == "RUN" and re.search(rf"install -d -o {uid} -g \d+ (-m \d+ )?/var/lib/vllm-drift", arg)
               for op, arg in ins)
    configs = dict(_daemon_configs())
    for src, cfg in configs.items():
        assert cfg.get("state_dir") == "/var/lib/vllm-drift", src
    svc = compose()["services"]["vllm-drift"]
    assert svc.get("read_only") is True and "/tmp" in svc.get("tmpfs", [])
    named = set(compose().get("volumes") or {})
    assert any(v.split(":")[0] in named and v.split(":")[1] == "/var/lib/vllm-drift" and not v.endswith(":ro")
               for v in svc["volumes"])
    for f in ("fleet.yaml", "sidecar.yaml"):
        docs = list(yaml.safe_load_all((K8S / f).read_text()))
        config_maps = {d["metadata"]["name"]: yaml.safe_load(d["data"]["config.yaml"])
                       for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})}
        for dep in (d for d in docs if d["kind"] == "Deployment"):
            spec = dep["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in spec.get("volumes") or []}
            for c in spec["containers"]:
                if "vllm-drift" not in c["image"]:
                    continue
                mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
                cfg_vol = volumes[mounts["/etc/vllm-drift"]["name"]]
                state_dir = config_maps[cfg_vol["configMap"]["name"]]["state_dir"]
                m = mounts[state_dir]
                assert not m.get("readOnly") and ({"emptyDir", "persistentVolumeClaim"} & set(volumes[m["name"]])), f
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, f
