"""Tests for the Grafana dashboards in grafana/: committed JSON equals the generator's output,
the JSON model is sound (ids, grid, datasource, units, descriptions), every variable used is
defined, every panel query parses (promql-parser and promtool), and every metric a query reads
exists: a recording rule we ship, a vllm_drift_* family of the interface contract, or a
documented vLLM metric."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from promql import vector_selectors

ROOT = REPO
SHARED = ROOT.parent / "shared"
DASH_DIR = ROOT / "grafana" / "dashboards"
BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
            "__range_ms", "__from", "__to", "__dashboard", "__org", "__user"}
promql_parser = pytest.importorskip("promql_parser", reason="pip install promql-parser (test extra)")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gbuild = _load("grafana_build", ROOT / "grafana" / "build.py")


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("*.json"))}


def panels(d: dict) -> list[dict]:
    out, stack = [], list(d["panels"])
    while stack:
        p = stack.pop(0)
        out.append(p)
        stack.extend(p.get("panels") or [])
    return out


def queries(d: dict) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and query variable."""
    qs = [(f"panel {p['id']} {p['title']!r}", t["expr"]) for p in panels(d) for t in p.get("targets") or []]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            qs.append((f"variable {v['name']}", v["query"]["query"]))
    return qs


def substitute(expr: str) -> str:
    """What Grafana sends: macros become durations, variables become their All value."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", ".*", expr)  # not label_replace's $1


def label_values_inner(expr: str) -> str:
    m = re.fullmatch(r"label_values\((.*),\s*\w+\)", expr.strip(), flags=re.S)
    return m.group(1) if m else expr


def metric_names(expr: str) -> set[str]:
    return {n.name for n in vector_selectors(promql_parser.parse(substitute(label_values_inner(expr))))
            if isinstance(n.name, str)}


def recording_rules() -> dict[str, str]:
    doc = yaml.safe_load((ROOT / "rules" / "prometheus_rules.yaml").read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def test_committed_dashboards_equal_generated():
    for name, text in gbuild.render().items():
        assert (DASH_DIR / name).read_text() == text, f"{name} is stale: run python grafana/build.py"
    assert sorted(gbuild.render()) == sorted(dashboards())


def test_three_dashboards_with_unique_uids_and_pinned_schema():
    ds = dashboards()
    assert {d["uid"] for d in ds.values()} == {"vllm-drift-fleet", "vllm-drift-instance", "vllm-drift-cost"}
    for d in ds.values():
        assert len(d["uid"]) <= 40 and d["id"] is None and d["schemaVersion"] == 39
        assert "__inputs" not in d, "export-for-sharing form breaks file provisioning"


def test_panel_ids_unique_and_grid_without_overlap():
    for name, d in dashboards().items():
        ps = panels(d)
        ids = [p["id"] for p in ps]
        assert len(ids) == len(set(ids)), name
        cells: dict[tuple[int, int], int] = {}
        for p in ps:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, (name, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: {p['title']!r} overlaps panel {cells[(x, y)]}"
                    cells[(x, y)] = p["id"]


def test_panels_have_datasource_unit_description_and_no_traffic_text():
    for name, d in dashboards().items():
        for p in panels(d):
            if p["type"] == "row":
                continue
            where = f"{name}: {p['title']!r}"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert p["fieldConfig"]["defaults"]["unit"], where
            assert p["fieldConfig"]["defaults"]["noValue"] == "No traffic", where
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(refs) == len(set(refs)), where
            assert all(t["expr"].strip() for t in p["targets"]), where
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), where


def test_descriptions_name_the_metrics_the_panel_reads():
    rec = recording_rules()
    for name, d in dashboards().items():
        for p in panels(d):
            if p["type"] == "row":
                continue
            desc = p["description"]
            for t in p["targets"]:
                for m in metric_names(t["expr"]):
                    if m in rec:
                        raw = metric_names(rec[m])
                        raw |= {n for r in raw if r in rec for n in metric_names(rec[r])}
                        raw = {re.sub(r"_bucket$", "", n) for n in raw}
                        ok = m in desc or any(n in desc for n in raw)
                    else:
                        ok = re.sub(r"_bucket$", "", m) in desc
                    assert ok, f"{name}: {p['title']!r} description does not name {m}"


def test_every_variable_referenced_is_defined():
    for name, d in dashboards().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        assert {"datasource", "model_name"} <= defined, name
        blob = json.dumps([p for p in panels(d)]) + json.dumps(d["templating"]["list"])
        used = set(re.findall(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", blob))
        used = {a or b for a, b in used} - BUILTINS
        # "$1" in label_replace and "$/hour" legends are not variables
        used = {u for u in used if not u.isdigit()}
        assert used <= defined, f"{name}: undefined variables {used - defined}"
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}" and v["refresh"] in (1, 2)


def test_instance_variable_regex_extracts_host_port_from_target():
    d = dashboards()["vllm-drift-instance.json"]
    v = next(v for v in d["templating"]["list"] if v["name"] == "instance")
    # Grafana regex format /.../ with one capture group
    rx = re.compile(v["regex"][1:-1].replace("\\/", "/"))
    assert rx.match("http://10.0.0.5:8000").group(1) == "10.0.0.5:8000"
    assert rx.match("https://vllm-0.llm.svc:8443/").group(1) == "vllm-0.llm.svc:8443"
    assert rx.match("127.0.0.1:8001").group(1) == "127.0.0.1:8001"


def test_raw_rates_use_rate_interval():
    for name, d in dashboards().items():
        for where, expr in queries(d):
            for window in re.findall(r"(?:rate|increase)\([^()]*\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", f"{name} {where}: window {window}"


def test_at_least_twenty_queries_and_all_parse_with_promql_parser():
    total = 0
    for name, d in dashboards().items():
        for where, expr in queries(d):
            try:
                promql_parser.parse(substitute(label_values_inner(expr)))
            except Exception as exc:  # noqa: BLE001 - report which query
                pytest.fail(f"{name} {where}: {exc}\n{expr}")
            total += 1
    assert total >= 20


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (apt-get install prometheus); CI installs it")
def test_all_queries_pass_promtool(tmp_path):
    rules = [{"record": f"dashboard:query_{i}:check", "expr": substitute(label_values_inner(e))}
             for i, (_, e) in enumerate(q for d in dashboards().values() for q in queries(d))]
    f = tmp_path / "dashboard_queries.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    res = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_metric_queried_exists():
    contract = SHARED / "INTERFACE.md"
    catalogue = SHARED / "reference" / "vllm-metrics.md"
    if not contract.exists() or not catalogue.exists():
        pytest.skip(f"contract/catalogue not present under {SHARED}")
    families = set(re.findall(r"`(vllm_drift_\w+)", contract.read_text()))
    documented = catalogue.read_text()
    rec = recording_rules()
    for name, d in dashboards().items():
        for where, expr in queries(d):
            for m in metric_names(expr):
                if m in rec or m in families:
                    continue
                base = re.sub(r"_(bucket|sum|count)$", "", m)
                assert m.startswith("vllm:") and f"`{base}" in documented, f"{name} {where}: unknown metric {m}"


def test_provisioning_files():
    prov = ROOT / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1
    (src,) = ds["datasources"]
    assert src["type"] == "prometheus" and src["url"].startswith("http") and src["jsonData"]["timeInterval"]
    dash = yaml.safe_load((prov / "dashboards" / "vllm-drift.yaml").read_text())
    (provider,) = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: matcher value}) for every vector selector, variables left as is."""
    marked = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", lambda m: f"VAR_{m.group(1) or m.group(2)}", expr)
    marked = marked.replace("VAR___rate_interval", "1m").replace("VAR___interval", "1m").replace("VAR___range", "1h")
    return [(n.name, {m.name: m.value for m in n.matchers.matchers})
            for n in vector_selectors(promql_parser.parse(label_values_inner(marked)))]


# the daemon's own families carry no target label (INTERFACE.md)
DAEMON_SELF = {"vllm_drift_last_evaluation_timestamp_seconds", "vllm_drift_evaluation_duration_seconds",
               "vllm_drift_config_reload_failures_total"}


def test_variables_filter_every_series_they_can():
    """Where a dashboard defines `target`/`instance`, every drift series is filtered by target
    and every vLLM series by instance and model, so picking one server narrows every panel."""
    rec = recording_rules()
    for name, d in dashboards().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        for p in panels(d):
            for t in p.get("targets") or []:
                for metric, matchers in selectors(t["expr"]):
                    where = f"{name}: {p['title']!r}: {metric}"
                    if metric in DAEMON_SELF:
                        continue
                    if metric.startswith("vllm_drift_") or metric.startswith("job_target_model:"):
                        assert matchers.get("target") == "VAR_target" or "target" not in defined, where
                    elif metric.startswith("vllm:") or metric in rec and metric.startswith("instance_model"):
                        assert matchers.get("instance") == "VAR_instance", where
                        assert matchers.get("model_name") == "VAR_model_name", where
                    else:
                        assert metric not in rec, f"{where}: fleet-level record ignores the filters"
