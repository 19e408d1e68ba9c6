"""Tests for the Prometheus rules in rules/: generated output is current, promtool accepts the
rules and passes every unit test in tests/rules/, every alert and recording rule is covered,
thresholds really drive the alerts, and the rules read real vLLM captures of every era."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from promql import nodes, vector_selectors

ROOT = REPO
SHARED = ROOT.parent / "shared"
RULE_FILES = [ROOT / "rules" / "prometheus_rules.yaml", ROOT / "rules" / "prometheus_alerts.yaml"]
UNIT_TESTS = sorted((ROOT / "tests" / "rules").glob("*_test.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus); CI installs it")


def _load_build():
    spec = importlib.util.spec_from_file_location("rules_build", ROOT / "rules" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rules_build"] = mod
    spec.loader.exec_module(mod)
    return mod


build = _load_build()


def _rules() -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_committed_rules_equal_generated():
    files = build.render(build.load_thresholds())
    for rel, text in files.items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run python rules/build.py"


def test_build_check_mode_detects_stale_file(tmp_path):
    assert build.main(["--out-dir", str(tmp_path)]) == 0
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / build.ALERTS_FILE).write_text("groups: []\n")
    assert build.main(["--check", "--out-dir", str(tmp_path)]) == 1


def test_set_rejects_unknown_threshold_key():
    with pytest.raises(SystemExit, match="unknown key 'warning_ratioo'"):
        build.load_thresholds(overrides=["kv_cache.warning_ratioo=0.5"])


def test_every_alert_is_complete_and_links_an_existing_runbook_section():
    runbook = (ROOT / "docs" / "runbooks.md").read_text()
    # GitHub anchors: lower-case heading text, spaces to '-', punctuation dropped
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    alerts = [r for r in _rules() if "alert" in r]
    assert len({a["alert"] for a in alerts}) >= 13
    for a in alerts:
        assert a["labels"]["severity"] in {"critical", "warning", "info"}, a["alert"]
        ann = a["annotations"]
        assert ann["summary"].endswith("."), a["alert"]
        constant = "absent(" in a["expr"] or a["expr"].endswith("== 0")  # value says nothing
        assert "{{ $value" in ann["description"] or constant, a["alert"]
        assert "{{ $labels." in ann["description"] or "absent(" in a["expr"], a["alert"]
        url, _, anchor = ann["runbook_url"].partition("#")
        assert url.endswith("docs/runbooks.md") and anchor == a["alert"].lower()
        assert anchor in anchors, f"docs/runbooks.md has no section for {a['alert']}"
        if "absent(" not in a["expr"] and "increase(" not in a["expr"]:
            assert "for" in a, f"{a['alert']} fires on a single evaluation"


def test_raw_vllm_rules_aggregate_away_engine_and_cover_old_names():
    text = "\n".join(r["expr"] for r in _rules())
    for old, new in [("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
                     ("vllm:time_per_output_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"),
                     ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total")]:
        assert old in text and new in text
    for r in _rules():
        if "record" in r and re.search(r"\bvllm:", r["expr"]):
            assert "without (engine" in r["expr"], r["record"]


def test_every_vllm_metric_the_rules_read_is_a_real_vllm_name():
    ref = SHARED / "reference" / "vllm-metrics.md"
    if not ref.exists():
        pytest.skip(f"reference catalogue {ref} not present")
    promql_parser = pytest.importorskip("promql_parser")
    names: set[str] = set()
    for r in _rules():
        for node in nodes(promql_parser.parse(r["expr"])):
            v = getattr(node, "name", None)
            if isinstance(v, str) and v.startswith("vllm:"):
                names.add(v)
    assert len(names) >= 15
    catalogue = ref.read_text()
    for n in sorted(names):
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        assert f"`{base}" in catalogue or f"`{n}" in catalogue, f"{n} is not a documented vLLM metric"


@needs_promtool
def test_promtool_check_rules_lint_clean():
    res = _promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
@pytest.mark.parametrize("unit", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(unit):
    res = _promtool("test", "rules", unit.name, cwd=unit.parent)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case_and_every_record_is_tested():
    firing, quiet, exprs = set(), set(), []
    for unit in UNIT_TESTS:
        for t in yaml.safe_load(unit.read_text())["tests"]:
            for a in t.get("alert_rule_test") or []:
                (firing if a.get("exp_alerts") else quiet).add(a["alertname"])
            exprs += [e["expr"] for e in t.get("promql_expr_test") or []]
    names = {r["alert"] for r in _rules() if "alert" in r}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown staying quiet"
    for rec in {r["record"] for r in _rules() if "record" in r}:
        assert any(re.search(re.escape(rec) + r"(?![\w:])", e) for e in exprs), f"{rec} untested"
    # both severities of the KV alert fire somewhere
    sev = {e["exp_labels"]["severity"] for u in UNIT_TESTS
           for t in yaml.safe_load(u.read_text())["tests"] for a in t.get("alert_rule_test") or []
           if a["alertname"] == "VLLMKVCachePressure" for e in a.get("exp_alerts") or []}
    assert sev == {"warning", "critical"}
    sev = {e["exp_labels"]["severity"] for u in UNIT_TESTS
           for t in yaml.safe_load(u.read_text())["tests"] for a in t.get("alert_rule_test") or []
           if a["alertname"] == "VLLMDriftKVPressure" for e in a.get("exp_alerts") or []}
    assert sev == {"warning", "critical"}


@needs_promtool
def test_thresholds_drive_alerts(tmp_path):
    """Raising the KV warning threshold in thresholds.yaml silences a 95% server; lowering the
    preemptions-per-request threshold makes a 0.2-per-request server fire."""
    files = build.render(build.load_thresholds(overrides=[
        "kv_cache.warning_ratio=0.97", "preemption.per_finished_request=0.1"]))
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    lab = 'instance="a",model_name="m",engine="0"'
    unit = {
        "rule_files": [build.RULES_FILE, build.ALERTS_FILE],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:kv_cache_usage_perc{{{lab}}}", "values": "0.95x30"},
                {"series": f"vllm:num_requests_waiting{{{lab}}}", "values": "3x30"},
                {"series": f"vllm:num_preemptions_total{{{lab}}}", "values": "0+30x30"},
                {"series": f'vllm:request_success_total{{{lab},finished_reason="stop"}}',
                 "values": "0+150x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "VLLMKVCachePressure", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "VLLMPreemptionStorm", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "instance": "a", "model_name": "m"},
                    "exp_annotations": {
                        "summary": "vLLM is preempting requests continuously.",
                        "description": "m on a preempted 0.20 times per finished request over "
                                       "the last 5m (threshold 0.1); preempted requests are "
                                       "recomputed or swapped, which inflates TTFT and "
                                       "inter-token latency.",
                        "runbook_url": "docs/runbooks.md#vllmpreemptionstorm"}}]},
            ],
        }],
    }
    (tmp_path / "unit.yaml").write_text(yaml.safe_dump(unit))
    res = _promtool("test", "rules", "unit.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def _groups(name: str) -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"]
            if g["name"] == name for r in g["rules"]]


def test_raw_gauges_are_read_through_windows_not_single_samples():
    """vLLM's KV and queue gauges swing by whole requests between scrapes: an alert that holds
    one sample with `for:` resets on every dip. Every read of them in an alert is windowed."""
    gauges = ("instance_model:vllm_kv_cache_usage_perc:max", "instance_model:vllm_num_requests_waiting:sum",
              "instance_model:vllm_num_requests_running:sum")
    n = 0
    for a in _groups("vllm-drift.vllm.alerts"):
        for g in gauges:
            total = a["expr"].count(g)
            windowed = len(re.findall(r"\w+_over_time\((?:[\d.]+,\s*)?" + re.escape(g) + r"\[\w+\]", a["expr"]))
            assert total == windowed, f"{a['alert']} reads {g} without a window"
            n += windowed
    assert n >= 5
    # a fixed preemption rate is not a storm on a busy server: the threshold is per request
    storm = next(a for a in _groups("vllm-drift.vllm.alerts") if a["alert"] == "VLLMPreemptionStorm")
    assert "per_request_success" in storm["expr"]


def test_drift_alerts_page_on_the_daemons_finding_severity():
    """The daemon's per-target knowledge and hysteresis decide: every drift-finding alert
    selects vllm_drift_finding at warning/critical and none reads a raw ratio or score."""
    alerts = _groups("vllm-drift.daemon.alerts")
    on_findings = {a["alert"] for a in alerts if "vllm_drift_finding{" in a["expr"]}
    assert {"VLLMDriftKVPressure", "VLLMDriftMisconfiguration", "VLLMDriftTierMisplacement",
            "VLLMDriftIdleCapacity"} <= on_findings
    for a in alerts:
        assert "vllm_drift_idle_capacity_ratio" not in a["expr"], a["alert"]
        assert not re.search(r"vllm_drift_\w*score\S*\s*>", a["expr"]), a["alert"]
        for sel in re.findall(r"vllm_drift_finding\{([^}]*)\}", a["expr"]):
            assert 'severity=~"warning|critical"' in sel or 'severity="critical"' in sel, a["alert"]
    kv = [a for a in alerts if a["alert"] == "VLLMDriftKVPressure"]
    assert {a["labels"]["severity"] for a in kv} == {"warning", "critical"}
    t = build.load_thresholds()
    # the daemon finding -> notification hop fits ~2.5 min: for + one evaluation + group_wait
    assert build._seconds(t["kv_pressure_finding"]["for"]) + 15 + 30 <= 150


def test_latency_alerts_compare_with_each_targets_own_slo():
    for name, metric in (("VLLMTTFTP99OverSLO", "ttft"), ("VLLMTPOTP99OverSLO", "tpot")):
        a = next(r for r in _groups("vllm-drift.vllm.alerts") if r["alert"] == name)
        own = f'instance_model:vllm_drift_slo_seconds:max{{metric="{metric}",quantile="0.99"}}'
        assert a["expr"].count(own) == 2  # compared with, and the default only "unless" it exists
        assert "unless on (instance, model_name)" in a["expr"]


@needs_promtool
def test_installed_prometheus_supports_keep_firing_for():
    """The critical KV alert uses keep_firing_for (Prometheus >= 2.42): promtool must know it."""
    assert any("keep_firing_for" in a for a in _groups("vllm-drift.vllm.alerts"))
    out = _promtool("--version")
    m = re.search(r"version (\d+)\.(\d+)", out.stdout + out.stderr)
    assert m and (int(m.group(1)), int(m.group(2))) >= (2, 42), out.stdout


def _fixture_series(path: Path) -> tuple[list[dict], float | None, float]:
    """Input series for promtool from a real capture: every vllm: sample held constant."""
    from prometheus_client.parser import text_string_to_metric_families

    series, kv_new, kv_old, running = [], [], [], 0.0
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            if not s.name.startswith("vllm:") or s.name.endswith("_created"):
                continue
            labels = {"job": "vllm", "instance": path.stem[:40], **s.labels}
            sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            series.append({"series": f"{s.name}{{{sel}}}", "values": f"{s.value!r}x10"})
            if s.name == "vllm:kv_cache_usage_perc":
                kv_new.append(s.value)
            elif s.name == "vllm:gpu_cache_usage_perc":
                kv_old.append(s.value)
            elif s.name == "vllm:num_requests_running":
                running += s.value
    kv = max(kv_new) if kv_new else (max(kv_old) if kv_old else None)
    return series, kv, running


@needs_promtool
@pytest.mark.parametrize("capture", sorted((SHARED / "fixtures" / "prom").glob("*.prom"))
                         if (SHARED / "fixtures" / "prom").exists() else [None])
def test_recording_rules_read_real_captures_of_every_era(capture, tmp_path):
    if capture is None:
        pytest.skip(f"real captures not present under {SHARED / 'fixtures' / 'prom'}")
    series, kv, running = _fixture_series(capture)
    assert kv is not None, f"{capture.name} has no KV usage gauge under either name"
    shutil.copy(RULE_FILES[0], tmp_path / "rules.yaml")
    model = next(re.search(r'model_name="([^"]+)"', s["series"]).group(1)
                 for s in series if "model_name=" in s["series"])
    inst = capture.stem[:40]
    labels = f'{{instance="{inst}",job="vllm",model_name="{model}"}}'
    unit = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": "instance_model:vllm_kv_cache_usage_perc:max", "eval_time": "5m",
             "exp_samples": [{"labels": "instance_model:vllm_kv_cache_usage_perc:max" + labels,
                              "value": kv}]},
            {"expr": "instance_model:vllm_num_requests_running:sum", "eval_time": "5m",
             "exp_samples": [{"labels": "instance_model:vllm_num_requests_running:sum" + labels,
                              "value": running}]},
            # idle captures: counters do not move, so rates are 0 and no quantile is recorded
            {"expr": "instance_model_quantile:vllm_time_to_first_token_seconds:histogram_quantile",
             "eval_time": "5m", "exp_samples": []},
        ]}]}
    (tmp_path / "unit.yaml").write_text(yaml.safe_dump(unit, width=10000))
    res = _promtool("test", "rules", "unit.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_runbook_queries_parse_and_read_existing_metrics():
    """The 'Confirm' queries in docs/runbooks.md are what an on-call engineer pastes: they must
    be valid PromQL and read metrics that exist (ours, vLLM's, or Prometheus' own)."""
    promql_parser = pytest.importorskip("promql_parser")
    contract, catalogue = SHARED / "INTERFACE.md", SHARED / "reference" / "vllm-metrics.md"
    text = (ROOT / "docs" / "runbooks.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 13
    records = {r["record"] for r in _rules() if "record" in r}
    families = set(re.findall(r"`(vllm_drift_\w+)", contract.read_text())) if contract.exists() else None
    documented = catalogue.read_text() if catalogue.exists() else None
    n = 0
    for block in blocks:
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line:
                continue
            expr = re.sub(r"<[^>]+>", "x", line)
            try:
                tree = promql_parser.parse(expr)
            except Exception as exc:  # noqa: BLE001
                pytest.fail(f"runbook query does not parse: {line}: {exc}")
            n += 1
            names = {n.name for n in vector_selectors(tree) if n.name}
            for m in names:
                if m in records or m in {"up", "process_cpu_seconds_total"}:
                    continue
                if m.startswith("vllm_drift_") and families is not None:
                    assert m in families, f"runbook reads {m}, not in INTERFACE.md"
                elif m.startswith("vllm:") and documented is not None:
                    assert f"`{re.sub(r'_(bucket|sum|count)$', '', m)}" in documented, m
                elif not m.startswith(("vllm_drift_", "vllm:")):
                    pytest.fail(f"runbook reads unknown metric {m}")
    assert n >= 30


REAL_SWING = ROOT / "tests" / "fixtures" / "vllm-cpu" / "kv-pressure-swing-15s.csv"
REAL_SWING_TEST = ROOT / "tests" / "rules" / "real_swing_test.yaml"


def test_real_swing_replay_is_the_committed_capture():
    """tests/rules/real_swing_test.yaml replays the timeline polled every 15 s from a real vLLM
    0.32 CPU server under KV pressure: its input series must be exactly that capture."""
    import csv

    rows = list(csv.DictReader(REAL_SWING.open()))
    assert len(rows) >= 20
    doc = yaml.safe_load(REAL_SWING_TEST.read_text())
    series = {s["series"].split("{")[0]: s["values"].split() for s in doc["tests"][0]["input_series"]}
    for name in ("kv_cache_usage_perc", "num_requests_waiting", "num_preemptions_total",
                 "request_success_total"):
        assert [float(v) for v in series[f"vllm:{name}"]] == [float(r[name]) for r in rows], name
    # the capture has the texture the rules are built for: whole-request swings, a queue, preemption
    kv = [float(r["kv_cache_usage_perc"]) for r in rows]
    assert max(kv) - min(kv) > 0.3 and 0.2 < sum(k > 0.9 for k in kv) / len(kv) < 0.9
    assert float(rows[-1]["num_preemptions_total"]) > float(rows[0]["num_preemptions_total"])
