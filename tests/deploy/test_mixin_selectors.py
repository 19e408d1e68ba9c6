"""Rules and dashboards are parameterised like monitoring mixins: `drift_selector` and
`vllm_selector` (rules/thresholds.yaml, default empty) scope every query to the job labels of the
user's Prometheus. Generated here with `--set` overrides, the output is checked selector by
selector with a PromQL parser, and the rules still pass promtool."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

promql_parser = pytest.importorskip("promql_parser", reason="pip install promql-parser (test extra)")
SETS = ["--set", 'drift_selector=job="drift"', "--set", 'vllm_selector=job="llm",namespace=~"prod-.*"']


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value}) of every vector selector; Grafana variables and label_values()
    unwrapped so the parser reads the query Grafana would send."""
    m = re.fullmatch(r"label_values\((.*),\s*\w+\)", expr.strip(), flags=re.S)
    expr = m.group(1) if m else expr
    expr = re.sub(r"\$__(rate_interval|interval|range)", "5m", expr)
    expr = re.sub(r"\$\{?(\w+)\}?", r"VAR_\1", expr)
    out = []

    def walk(node):
        if type(node).__name__ == "VectorSelector":
            out.append((node.name, {x.name: x.value for x in node.matchers.matchers}))
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for child in getattr(node, "args", None) or []:
            walk(child)

    walk(promql_parser.parse(expr))
    return out


def dashboard_queries(folder) -> list[str]:
    out = []
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        stack = list(d["panels"])
        while stack:
            p = stack.pop()
            stack.extend(p.get("panels") or [])
            out.extend(t["expr"] for t in p.get("targets") or [])
        out.extend(v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query")
    return out


def rule_exprs(folder) -> list[str]:
    out = []
    for name in ("prometheus_rules.yaml", "prometheus_alerts.yaml"):
        doc = yaml.safe_load((folder / name).read_text())
        out.extend(r["expr"] for g in doc["groups"] for r in g["rules"])
    return out


def check_scoped(exprs: list[str]) -> tuple[int, int]:
    drift = raw = 0
    for e in exprs:
        for name, matchers in selectors(e):
            if name.startswith("vllm_drift_"):
                assert matchers.get("job") == "drift", (name, e)
                drift += 1
            elif name.startswith("vllm:"):
                assert matchers.get("job") == "llm" and matchers.get("namespace") == "prod-.*", (name, e)
                raw += 1
    return drift, raw


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixin")
    for script in ("rules/build.py", "grafana/build.py"):
        r = subprocess.run([sys.executable, str(REPO / script), "--out-dir", str(out), *SETS],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    return out


def test_dashboards_scope_every_daemon_and_raw_vllm_query(generated):
    drift, raw = check_scoped(dashboard_queries(generated / "grafana" / "dashboards"))
    assert drift >= 20 and raw >= 2


def test_rules_scope_every_daemon_and_raw_vllm_query(generated):
    drift, raw = check_scoped(rule_exprs(generated / "rules"))
    assert drift >= 5 and raw >= 10


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (Debian package prometheus)")
def test_scoped_rules_pass_promtool(generated):
    r = subprocess.run(["promtool", "check", "rules", str(generated / "rules" / "prometheus_rules.yaml"),
                        str(generated / "rules" / "prometheus_alerts.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_documented_defaults_select_every_series():
    t = yaml.safe_load((REPO / "rules" / "thresholds.yaml").read_text())
    assert t["drift_selector"] == "" and t["vllm_selector"] == ""
    for e in dashboard_queries(REPO / "grafana" / "dashboards") + rule_exprs(REPO / "rules"):
        assert all("job" not in m for _, m in selectors(e)), e
