#!/usr/bin/env python3
"""Generate the vllm-drift Grafana dashboards (grafana/dashboards/*.json) from plain Python.

Why plain dicts and not an SDK: grafanalib (0.7.1, 2024) lags current panel types and
grafana-foundation-sdk ships one build per Grafana version; the JSON model we need is small,
and tests/test_dashboards.py checks it (queries parse, variables defined, ids unique, metrics
exist, committed JSON equals this output). Thresholds (KV warning/critical, TTFT/TPOT SLOs)
come from rules/thresholds.yaml so dashboards and alerts agree.

Queries read the recording rules of rules/prometheus_rules.yaml (era-independent, aggregated
over the vLLM `engine` label) and the daemon's vllm_drift_* families. The `instance` variable
is derived from the daemon's `target` URL (host:port), which is the `instance` label
Prometheus gives a vLLM server it scrapes directly or through a PodMonitor.

Selectors (monitoring-mixin style): `drift_selector` and `vllm_selector` in rules/thresholds.yaml
(default empty: every series) are added to the queries, see `configure`. Generate for other job
labels without editing the file:
    python grafana/build.py --out-dir /tmp/mine --set drift_selector='job="drift"' --set vllm_selector='job="llm"'

Usage: python grafana/build.py [--check] [--out-dir DIR] [--thresholds FILE] [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "dashboards"
THRESHOLDS_FILE = ROOT / "rules" / "thresholds.yaml"
DS = {"type": "prometheus", "uid": "${datasource}"}
NO_DATA = "No traffic"
M = 'model_name=~"$model_name"'


def _matchers(selector: str | None) -> str:
    """'job="x"' -> 'job="x",' (prefix for a matcher list); '' -> ''."""
    selector = (selector or "").strip().strip(",")
    return f"{selector}," if selector else ""


def configure(t: dict[str, Any]) -> None:
    """Set the thresholds and the label selectors every query is built with. As in monitoring
    mixins, `drift_selector` / `vllm_selector` of rules/thresholds.yaml (the same keys
    rules/build.py reads; default empty = every series) scope the dashboards to the job labels of
    the user's Prometheus: `drift_selector` goes into every vllm_drift_* query and the variables,
    `vllm_selector` into every query of raw vllm:* series. The recording rules' outputs need
    neither: rules/build.py applies the same selectors to their inputs."""
    global THRESHOLDS, W, DSEL, VSEL, I, T, MT, V_MODEL, V_TARGET, V_INSTANCE
    THRESHOLDS, W = t, t["rate_window"]
    DSEL, VSEL = _matchers(t.get("drift_selector")), _matchers(t.get("vllm_selector"))
    I = f'instance=~"$instance",{M}'
    T = f'{DSEL}target=~"$target"'
    MT = f'{DSEL}{M},target=~"$target"'
    info = f"vllm_drift_target_info{{{DSEL.rstrip(',')}}}" if DSEL else "vllm_drift_target_info"
    V_MODEL = v_query("model_name", "Model", f"label_values({info}, model_name)")
    V_TARGET = v_query("target", "Target",
                       f'label_values(vllm_drift_target_info{{{DSEL}model_name=~"$model_name"}}, target)')
    # host:port of the target URL = the `instance` label of the vLLM server's own series
    V_INSTANCE = v_query("instance", "vLLM instance",
                         f'label_values(vllm_drift_target_info{{{DSEL}model_name=~"$model_name",target=~"$target"}}, target)',
                         regex="/^(?:[a-z]+:\\/\\/)?([^\\/]+)/")


def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str | None = None) -> dict:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto",
                         "range": not instant, "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def thresholds(*steps: tuple[str, float | None]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


GREEN = ("green", None)


class Board:
    """Lays panels out left to right on Grafana's 24-column grid and numbers them."""

    def __init__(self, uid: str, title: str, description: str, variables: list[dict]):
        self.uid, self.title, self.description = uid, title, description
        self.variables = variables
        self.panels: list[dict] = []
        self.x = self.y = self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0

    def add(self, kind: str, title: str, description: str, targets: list[dict], *,
            unit: str = "short", w: int = 12, h: int = 8, min_: float | None = None,
            max_: float | None = None, steps: dict | None = None, options: dict | None = None,
            custom: dict | None = None, transformations: list | None = None,
            decimals: int | None = None) -> None:
        if self.x + w > 24:
            self._newline()
        defaults: dict[str, Any] = {"unit": unit, "noValue": NO_DATA}
        if min_ is not None:
            defaults["min"] = min_
        if max_ is not None:
            defaults["max"] = max_
        if decimals is not None:
            defaults["decimals"] = decimals
        defaults["thresholds"] = steps or thresholds(GREEN)
        if custom:
            defaults["custom"] = custom
        refs = "ABCDEFGHIJ"
        panel = {
            "type": kind, "title": title, "description": description, "datasource": DS,
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
            "targets": [dict(t, refId=refs[i]) for i, t in enumerate(targets)],
        }
        if transformations:
            panel["transformations"] = transformations
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def json(self) -> dict:
        for i, p in enumerate(self.panels, start=1):
            p["id"] = i
        return {
            "id": None, "uid": self.uid, "title": self.title, "description": self.description,
            "tags": ["vllm", "vllm-drift"], "timezone": "browser", "editable": True,
            "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
            "time": {"from": "now-3h", "to": "now"},
            "links": [{"type": "dashboards", "title": "vllm-drift", "tags": ["vllm-drift"],
                       "asDropdown": True, "includeVars": True, "keepTime": True}],
            "annotations": {"list": []},
            "templating": {"list": self.variables},
            "panels": self.panels,
        }


def ts_custom(stack: bool = False, line_thresholds: bool = False) -> dict:
    c: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                         "spanNulls": False, "showPoints": "never"}
    if stack:
        c["stacking"] = {"mode": "normal", "group": "A"}
    if line_thresholds:
        c["thresholdsStyle"] = {"mode": "line"}
    return c


# ---- variables --------------------------------------------------------------------------
def v_datasource() -> dict:
    return {"type": "datasource", "name": "datasource", "label": "Data source",
            "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
            "options": [], "includeAll": False, "multi": False}


def v_query(name: str, label: str, query: str, *, regex: str = "", hide: int = 0) -> dict:
    return {"type": "query", "name": name, "label": label, "datasource": DS,
            "definition": query, "query": {"query": query, "refId": "StandardVariableQuery"},
            "refresh": 2, "regex": regex, "sort": 1, "hide": hide, "current": {},
            "options": [], "includeAll": True, "multi": True, "allValue": ".*"}




def _braced(matchers: str) -> str:
    return f"{{{matchers.rstrip(',')}}}" if matchers else ""


def drift_as_instance(expr: str) -> str:
    """Give a vllm_drift_* series the `instance` label of the vLLM server it describes."""
    return f'label_replace({expr}, "instance", "$1", "target", "(?:[a-z]+://)?([^/]+).*")'


configure(yaml.safe_load(THRESHOLDS_FILE.read_text()))


# ---- dashboards -------------------------------------------------------------------------
def fleet() -> dict:
    mc = THRESHOLDS["misconfiguration"]["score"]
    kv = THRESHOLDS["kv_cache"]
    b = Board("vllm-drift-fleet", "vLLM fleet overview (vllm-drift)",
              "Findings, waste and the most drifted vLLM servers across the fleet.",
              [v_datasource(), V_MODEL, V_TARGET, V_INSTANCE])
    b.row("Fleet health")
    b.add("stat", "Targets up", "Targets vllm-drift scrapes successfully (vllm_drift_target_up).",
          [target(f"sum(vllm_drift_target_up{{{T}}})", "up")], w=4, h=4)
    b.add("stat", "Targets down", "Targets vllm-drift cannot scrape (vllm_drift_target_up == 0).",
          [target(f"count(vllm_drift_target_up{{{T}}} == 0) or vector(0)", "down")], w=4, h=4,
          steps=thresholds(GREEN, ("red", 1)))
    b.add("stat", "Active findings by severity",
          "Findings the daemon reports right now, by severity (vllm_drift_finding).",
          [target(f"sum by (severity) (vllm_drift_finding{{{MT}}})", "{{severity}}")], w=4, h=4)
    b.add("stat", "Estimated waste", "Sum of vllm_drift_estimated_waste_dollars_per_hour over "
          "the selected models: what misplacement and idle capacity cost per hour.",
          [target(f"sum(vllm_drift_estimated_waste_dollars_per_hour{{{MT}}})", "$/hour")],
          unit="currencyUSD", w=4, h=4, decimals=2, steps=thresholds(GREEN, ("orange", 1), ("red", 10)))
    b.add("stat", "Worst misconfiguration score",
          "Highest vllm_drift_misconfiguration_score in the fleet (0 = optimal, 1 = worst case).",
          [target(f"max(vllm_drift_misconfiguration_score{{{MT}}})", "score")], unit="none",
          decimals=2, min_=0, max_=1, w=4, h=4, steps=thresholds(GREEN, ("orange", mc), ("red", 0.8)))
    b.add("stat", "Last evaluation age",
          "Seconds since the daemon last finished an evaluation "
          "(time() - vllm_drift_last_evaluation_timestamp_seconds).",
          [target(f"time() - max(vllm_drift_last_evaluation_timestamp_seconds{_braced(DSEL)})", "age")], unit="s",
          w=4, h=4, steps=thresholds(GREEN, ("red", THRESHOLDS["evaluation_stalled"]["seconds"])))
    b.row("Findings")
    b.add("timeseries", "Findings by severity",
          "Active findings over time, by severity (vllm_drift_finding).",
          [target(f"sum by (severity) (vllm_drift_finding{{{MT}}})", "{{severity}}")],
          custom=ts_custom(stack=True))
    b.add("table", "Active findings", "Every active finding (vllm_drift_finding == 1); details "
          "and explanations at the daemon's /api/v1/findings.",
          [target(f"vllm_drift_finding{{{MT}}} == 1", instant=True, fmt="table")],
          transformations=[{"id": "organize", "options": {
              "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True},
              "indexByName": {"target": 0, "model_name": 1, "finding": 2, "severity": 3}}}])
    b.row("Drift")
    b.add("table", "Top drifted servers",
          "Ten servers with the highest misconfiguration score over all parameters "
          "(recording rule job_target_model:vllm_drift_misconfiguration_score:max).",
          [target(f"topk(10, job_target_model:vllm_drift_misconfiguration_score:max{{{MT}}})",
                  instant=True, fmt="table")],
          unit="none", decimals=2, steps=thresholds(GREEN, ("orange", mc), ("red", 0.8)),
          transformations=[{"id": "organize", "options": {
              "excludeByName": {"Time": True, "__name__": True, "job": True},
              "renameByName": {"Value": "worst score"}}},
              {"id": "sortBy", "options": {"sort": [{"field": "worst score", "desc": True}]}}])
    b.add("bargauge", "Misconfiguration score by parameter",
          "Worst vllm_drift_misconfiguration_score per parameter across the selected servers.",
          [target(f"max by (parameter) (vllm_drift_misconfiguration_score{{{MT}}})", "{{parameter}}",
                  instant=True)],
          unit="none", min_=0, max_=1, decimals=2,
          steps=thresholds(GREEN, ("orange", mc), ("red", 0.8)),
          options={"orientation": "horizontal", "displayMode": "gradient"})
    b.add("timeseries", "Estimated waste by model",
          "vllm_drift_estimated_waste_dollars_per_hour summed per model.",
          [target(f"sum by (model_name) (vllm_drift_estimated_waste_dollars_per_hour{{{MT}}})",
                  "{{model_name}}")], unit="currencyUSD", custom=ts_custom(stack=True))
    b.add("timeseries", "Drift score by target",
          "Worst misconfiguration score per server over time "
          "(job_target_model:vllm_drift_misconfiguration_score:max).",
          [target(f"job_target_model:vllm_drift_misconfiguration_score:max{{{MT}}}", "{{target}}")],
          unit="none", min_=0, max_=1, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("orange", mc)))
    b.row("Load seen by vLLM")
    b.add("timeseries", "KV cache usage",
          "Share of KV-cache blocks in use, worst engine per server "
          "(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc via "
          "instance_model:vllm_kv_cache_usage_perc:max).",
          [target(f"instance_model:vllm_kv_cache_usage_perc:max{{{I}}}", "{{instance}}")],
          unit="percentunit", min_=0, max_=1, w=8, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("orange", kv["warning_ratio"]), ("red", kv["critical_ratio"])))
    b.add("timeseries", "Waiting requests",
          "Requests queued per server (vllm:num_requests_waiting summed over engines).",
          [target(f"instance_model:vllm_num_requests_waiting:sum{{{I}}}", "{{instance}}")], w=8)
    b.add("timeseries", "Preemptions",
          f"Preemptions per second per server (rate of vllm:num_preemptions_total over {W}).",
          [target(f"instance_model:vllm_num_preemptions:rate{W}{{{I}}}", "{{instance}}")],
          unit="ops", w=8)
    b.add("timeseries", "Output tokens per second by model",
          f"Generated tokens/s (rate of vllm:generation_tokens_total over {W}).",
          [target(f"sum by (model_name) (instance_model:vllm_generation_tokens:rate{W}{{{I}}})",
                  "{{model_name}}")], unit="short", w=12)
    b.add("timeseries", "TTFT p99 by server",
          "p99 time to first token (vllm:time_to_first_token_seconds via "
          "instance_model_quantile:vllm_time_to_first_token_seconds:histogram_quantile).",
          [target('instance_model_quantile:vllm_time_to_first_token_seconds:histogram_quantile'
                  f'{{quantile="0.99",{I}}}', "{{instance}}")], unit="s", w=12,
          custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("red", THRESHOLDS["slo"]["ttft_p99_seconds"])))
    return b.json()


def instance() -> dict:
    kv, slo = THRESHOLDS["kv_cache"], THRESHOLDS["slo"]
    mc = THRESHOLDS["misconfiguration"]["score"]
    b = Board("vllm-drift-instance", "vLLM instance detail (vllm-drift)",
              "One vLLM server: observed load and latency next to the model's predictions and "
              "recommendations.", [v_datasource(), V_MODEL, V_TARGET, V_INSTANCE])
    b.row("KV cache")
    b.add("timeseries", "KV cache usage vs pressure score",
          "Share of KV blocks in use (vllm:kv_cache_usage_perc / vllm:gpu_cache_usage_perc, worst "
          "engine) and the daemon's vllm_drift_kv_pressure_score.",
          [target(f"instance_model:vllm_kv_cache_usage_perc:max{{{I}}}", "usage {{instance}}"),
           target(f"vllm_drift_kv_pressure_score{{{T}}}", "pressure score {{target}}")],
          unit="percentunit", min_=0, max_=1, w=12, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("orange", kv["warning_ratio"]), ("red", kv["critical_ratio"])))
    pred = drift_as_instance(f"vllm_drift_predicted_kv_cache_tokens{{{T}}}")
    b.add("timeseries", "KV tokens in use vs predicted capacity",
          "vllm_drift_predicted_kv_cache_tokens (what vLLM should log as 'GPU KV cache size') and "
          "the tokens in use estimated as KV usage (vllm:kv_cache_usage_perc) x that capacity.",
          [target(f"max by (instance) ({pred})", "predicted capacity {{instance}}"),
           target(f"instance_model:vllm_kv_cache_usage_perc:max{{{I}}}\n"
                  f"* on (instance) group_left ()\nmax by (instance) ({pred})", "in use {{instance}}")],
          unit="short", w=12)
    b.add("timeseries", "Preemptions",
          f"Preemptions per second (rate of vllm:num_preemptions_total over {W}, all engines).",
          [target(f"instance_model:vllm_num_preemptions:rate{W}{{{I}}}", "{{instance}}")],
          unit="ops", w=12)
    b.add("timeseries", "Prefix cache hit ratio",
          "Prefix-cache hits / queries (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, "
          "or the gpu_prefix_cache_* names on older servers).",
          [target(f"instance_model:vllm_prefix_cache_hits_per_queries:ratio_rate{W}{{{I}}}",
                  "{{instance}}")], unit="percentunit", min_=0, max_=1, w=12)
    b.row("Scheduler")
    b.add("timeseries", "Running and waiting vs recommended max_num_seqs",
          "vllm:num_requests_running and vllm:num_requests_waiting (summed over engines) against "
          "vllm_drift_recommended_value and vllm_drift_configured_value for max_num_seqs.",
          [target(f"instance_model:vllm_num_requests_running:sum{{{I}}}", "running {{instance}}"),
           target(f"instance_model:vllm_num_requests_waiting:sum{{{I}}}", "waiting {{instance}}"),
           target(f'vllm_drift_recommended_value{{{T},parameter="max_num_seqs"}}', "recommended {{target}}"),
           target(f'vllm_drift_configured_value{{{T},parameter="max_num_seqs"}}', "configured {{target}}")],
          w=12)
    b.add("table", "Configured vs recommended",
          "vllm_drift_configured_value and vllm_drift_recommended_value per parameter.",
          [target(f"vllm_drift_configured_value{{{T}}}", instant=True, fmt="table"),
           target(f"vllm_drift_recommended_value{{{T}}}", instant=True, fmt="table")], w=12,
          transformations=[
              {"id": "merge", "options": {}},
              {"id": "organize", "options": {
                  "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
                  "renameByName": {"Value #A": "configured", "Value #B": "recommended"}}}])
    b.add("bargauge", "Misconfiguration score by parameter",
          "vllm_drift_misconfiguration_score per parameter (0 = optimal, 1 = worst case).",
          [target(f"vllm_drift_misconfiguration_score{{{T}}}", "{{parameter}}", instant=True)],
          unit="none", min_=0, max_=1, decimals=2, w=12,
          steps=thresholds(GREEN, ("orange", mc), ("red", 0.8)),
          options={"orientation": "horizontal", "displayMode": "gradient"})
    b.add("timeseries", "Token throughput",
          f"Prompt and generated tokens per second (rates over {W} of vllm:prompt_tokens_total "
          "and vllm:generation_tokens_total).",
          [target(f"instance_model:vllm_prompt_tokens:rate{W}{{{I}}}", "prompt {{instance}}"),
           target(f"instance_model:vllm_generation_tokens:rate{W}{{{I}}}", "output {{instance}}")],
          w=12)
    b.row("Latency")
    b.add("timeseries", "Time to first token vs predicted and SLO",
          "p50/p90/p99 of vllm:time_to_first_token_seconds "
          "(instance_model_quantile:vllm_time_to_first_token_seconds:histogram_quantile) next to "
          "vllm_drift_predicted_ttft_seconds (the mean the model expects at the observed load; "
          "basis=\"calibrated\" once learned from the server's pool); the red "
          f"line is the {slo['ttft_p99_seconds']} s p99 SLO from rules/thresholds.yaml.",
          [target('instance_model_quantile:vllm_time_to_first_token_seconds:histogram_quantile'
                  f'{{{I}}}', "p{{quantile}} {{instance}}"),
           target(f"vllm_drift_predicted_ttft_seconds{{{T}}}", "predicted {{target}} ({{basis}})")],
          unit="s", w=12, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("red", slo["ttft_p99_seconds"])))
    b.add("timeseries", "Time per output token vs predicted and SLO",
          "p50/p90/p99 of vllm:inter_token_latency_seconds (vllm:time_per_output_token_seconds "
          "on servers before 0.10.2) next to vllm_drift_predicted_tpot_seconds; the red line is "
          f"the {slo['tpot_p99_seconds']} s p99 SLO.",
          [target('instance_model_quantile:vllm_inter_token_latency_seconds:histogram_quantile'
                  f'{{{I}}}', "p{{quantile}} {{instance}}"),
           target(f"vllm_drift_predicted_tpot_seconds{{{T}}}", "predicted {{target}} ({{basis}})")],
          unit="s", w=12, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("red", slo["tpot_p99_seconds"])))
    b.row("Request shape")
    b.add("timeseries", "Prompt length quantiles",
          "p50/p90/p99 prompt tokens per finished request (vllm:request_prompt_tokens).",
          [target(f"instance_model_quantile:vllm_request_prompt_tokens:histogram_quantile{{{I}}}",
                  "p{{quantile}} {{instance}}")], w=12)
    b.add("timeseries", "Output length quantiles",
          "p50/p90/p99 generated tokens per finished request (vllm:request_generation_tokens).",
          [target(f"instance_model_quantile:vllm_request_generation_tokens:histogram_quantile{{{I}}}",
                  "p{{quantile}} {{instance}}")], w=12)
    for name, title in (("vllm:request_prompt_tokens", "Prompt length distribution"),
                        ("vllm:request_generation_tokens", "Output length distribution")):
        b.add("heatmap", title,
              f"Finished requests per {name} bucket and interval ({name}_bucket increases).",
              [target(f"sum by (le) (increase({name}_bucket{{{VSEL}{I}}}[$__rate_interval]))",
                      "{{le}}", fmt="heatmap")], w=12,
              options={"calculate": False, "yAxis": {"unit": "short"},
                       "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges"}})
    b.row("Speculative decoding")
    b.add("timeseries", "Draft acceptance rate",
          "Accepted / proposed draft tokens (vllm:spec_decode_num_accepted_tokens_total / "
          "vllm:spec_decode_num_draft_tokens_total); empty when speculation is off.",
          [target(f"instance_model:vllm_spec_decode_num_accepted_tokens_per_draft_tokens:ratio_rate{W}{{{I}}}",
                  "acceptance {{instance}}")], unit="percentunit", min_=0, max_=1, w=12)
    b.add("timeseries", "Speculative decoding score",
          "vllm_drift_misconfiguration_score{parameter=\"speculative_decoding\"}: high when "
          "speculation costs more than it saves at this acceptance rate and load.",
          [target(f'vllm_drift_misconfiguration_score{{{T},parameter="speculative_decoding"}}',
                  "{{target}}")], unit="none", min_=0, max_=1, w=12,
          custom=ts_custom(line_thresholds=True), steps=thresholds(GREEN, ("orange", mc)))
    return b.json()


def cost() -> dict:
    tier = THRESHOLDS["tier_misplacement"]
    idle = THRESHOLDS["idle_capacity"]["ratio"]
    b = Board("vllm-drift-cost", "vLLM GPU tiers and cost (vllm-drift)",
              "Where the fleet pays for GPUs it does not need: tier misplacement and idle capacity.",
              [v_datasource(), V_MODEL, V_TARGET, V_INSTANCE])
    b.row("Summary")
    waste = f"sum(vllm_drift_estimated_waste_dollars_per_hour{{{MT}}})"
    b.add("stat", "Estimated waste per hour", "Sum of vllm_drift_estimated_waste_dollars_per_hour.",
          [target(waste, "$/hour")], unit="currencyUSD", decimals=2, w=6, h=4)
    b.add("stat", "Estimated waste per month",
          "vllm_drift_estimated_waste_dollars_per_hour x 730 hours.",
          [target(f"{waste} * 730", "$/month")], unit="currencyUSD", decimals=0, w=6, h=4)
    b.add("stat", "Misplaced servers",
          f"Servers whose vllm_drift_tier_misplacement_score exceeds {tier['score']}.",
          [target(f"count(vllm_drift_tier_misplacement_score{{{MT}}} > {tier['score']}) or vector(0)",
                  "servers")], w=6, h=4, steps=thresholds(GREEN, ("orange", 1)))
    b.add("stat", "Mean idle capacity",
          "Average vllm_drift_idle_capacity_ratio: share of predicted sustainable capacity unused.",
          [target(f"avg(vllm_drift_idle_capacity_ratio{{{MT}}})", "idle")], unit="percentunit",
          min_=0, max_=1, w=6, h=4, steps=thresholds(GREEN, ("orange", idle)))
    b.row("Tiers")
    b.add("table", "Tier placement",
          "Current and recommended GPU per server with vllm_drift_tier_misplacement_score.",
          [target(f"vllm_drift_tier_misplacement_score{{{MT}}}", instant=True, fmt="table")],
          unit="none", decimals=2, w=24,
          steps=thresholds(GREEN, ("orange", tier["score"])),
          transformations=[{"id": "organize", "options": {
              "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
              "indexByName": {"target": 0, "model_name": 1, "current_gpu": 2, "recommended_gpu": 3},
              "renameByName": {"Value": "misplacement score"}}}])
    b.add("bargauge", "Servers by current GPU",
          "Count of servers per current_gpu label of vllm_drift_tier_misplacement_score.",
          [target(f"count by (current_gpu) (vllm_drift_tier_misplacement_score{{{MT}}})",
                  "{{current_gpu}}", instant=True)], w=12,
          options={"orientation": "horizontal", "displayMode": "basic"})
    b.add("bargauge", "Servers by recommended GPU",
          "Count of servers per recommended_gpu label of vllm_drift_tier_misplacement_score.",
          [target(f"count by (recommended_gpu) (vllm_drift_tier_misplacement_score{{{MT}}})",
                  "{{recommended_gpu}}", instant=True)], w=12,
          options={"orientation": "horizontal", "displayMode": "basic"})
    b.row("Waste and idle capacity")
    b.add("bargauge", "Waste by server",
          "vllm_drift_estimated_waste_dollars_per_hour per server, largest first.",
          [target(f"sort_desc(sum by (target, model_name) "
                  f"(vllm_drift_estimated_waste_dollars_per_hour{{{MT}}}))",
                  "{{target}} ({{model_name}})", instant=True)],
          unit="currencyUSD", decimals=2, w=12,
          options={"orientation": "horizontal", "displayMode": "gradient"})
    b.add("timeseries", "Waste by model",
          "vllm_drift_estimated_waste_dollars_per_hour summed per model.",
          [target(f"sum by (model_name) (vllm_drift_estimated_waste_dollars_per_hour{{{MT}}})",
                  "{{model_name}}")], unit="currencyUSD", w=12, custom=ts_custom(stack=True))
    b.add("timeseries", "Idle capacity by server",
          "vllm_drift_idle_capacity_ratio per server over time.",
          [target(f"vllm_drift_idle_capacity_ratio{{{MT}}}", "{{target}}")], unit="percentunit",
          min_=0, max_=1, w=12, custom=ts_custom(line_thresholds=True),
          steps=thresholds(GREEN, ("orange", idle)))
    b.add("timeseries", "Requests per second by model",
          f"Finished requests/s (rate of vllm:request_success_total over {W}), to set waste "
          "against the traffic served.",
          [target(f"sum by (model_name) (instance_model:vllm_request_success:rate{W}{{{I}}})",
                  "{{model_name}}")], unit="reqps", w=12)
    return b.json()


DASHBOARDS = {"vllm-drift-fleet.json": fleet, "vllm-drift-instance.json": instance,
              "vllm-drift-cost.json": cost}


CONFIGMAP = ROOT / "deploy" / "kubernetes" / "grafana-dashboards.yaml"


def render() -> dict[str, str]:
    return {name: json.dumps(fn(), indent=2, sort_keys=False) + "\n" for name, fn in DASHBOARDS.items()}


def render_configmap(dashboards: dict[str, str]) -> str:
    """The same dashboards as a ConfigMap for the Grafana sidecar of kube-prometheus-stack."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "vllm-drift-dashboards", "namespace": "monitoring",
                       "labels": {"app.kubernetes.io/name": "vllm-drift", "grafana_dashboard": "1"},
                       "annotations": {"grafana_folder": "vLLM"}},
          "data": dict(dashboards)}

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, lambda d, v: d.represent_scalar(
        "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))
    return ("# GENERATED by grafana/build.py -- do not edit by hand.\n"
            + yaml.dump(cm, Dumper=Dumper, sort_keys=False, width=1000))


def _load_thresholds(path: Path, overrides: list[str]) -> dict[str, Any]:
    """rules/build.py's loader (YAML plus dotted KEY=VALUE overrides): one parser for both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_drift_rules_build", ROOT / "rules" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.load_thresholds(path, overrides)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if committed JSON differs")
    ap.add_argument("--out-dir", type=Path, default=ROOT, help="root to write into (default: repo)")
    ap.add_argument("--thresholds", type=Path, default=THRESHOLDS_FILE)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting, e.g. drift_selector='job=\"vllm-drift\"'")
    args = ap.parse_args(argv)
    configure(_load_thresholds(args.thresholds, args.set))
    stale = []
    dashboards = render()
    files = {args.out_dir / OUT.relative_to(ROOT) / name: text for name, text in dashboards.items()}
    files[args.out_dir / CONFIGMAP.relative_to(ROOT)] = render_configmap(dashboards)
    for path, text in files.items():
        name = path.relative_to(args.out_dir)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(name))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale dashboards (run python grafana/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
