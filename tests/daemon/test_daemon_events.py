"""The daemon talks: `vllm-drift serve` against a simulated server under KV pressure logs, as
JSON lines, the target's discovery, its first scrape, its window filling by quarters, its first
evaluation and the kv_pressure finding opening (with score and explanation), and is never silent
for longer than an evaluation interval (plus scheduling slack) after it starts. The transition
logic (opened / escalated / de-escalated / cleared) is checked on its own with real findings."""
from __future__ import annotations

import datetime
import json
import time

from structlog.testing import capture_logs

from daemons import Serve, wait_for
from exporter.events import Narrator, transitions
from exporter.report import Finding, ModelReport
from sim_running import start


def _lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _t(rec: dict) -> float:
    return datetime.datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()


def test_serve_logs_discovery_window_first_evaluation_and_findings(tmp_path, cli_env):
    running, _ = start("kv-pressure", seed=3)
    with running:
        url = running.urls[0]
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\n"
                       "evaluation: {interval: 2s, window: 8s}\n"
                       f"targets:\n  - url: {url}\n    gpu: L4\n    tp: 1\n")
        d = Serve(cfg, cli_env, tmp_path)
        try:
            def opened():
                recs = _lines(d.log())
                return any(r.get("event") == "window full" for r in recs) and [r for r in recs
                        if r.get("event") in ("finding opened", "finding escalated")
                        and r.get("finding") == "kv_pressure"
                        and r.get("severity") in ("warning", "critical")]

            wait_for(opened, timeout=60, step=0.5)
            time.sleep(2.5)                  # one more evaluation: a summary line after it
        finally:
            assert d.stop() == 0
    recs = _lines(d.log())
    by = {}
    for r in recs:
        by.setdefault(r["event"], []).append(r)
    assert by["target discovered"][0]["target"] == url
    first = by["first scrape"][0]
    assert first["target"] == url and first["models"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert first["vllm_version"] == "0.11.0" and first["engine_era"]
    pcts = [r["percent"] for r in by["window filling"]]     # the quarter reached, once each
    assert pcts and pcts == sorted(set(pcts)) and set(pcts) <= {25, 50, 75}
    assert by["window full"][0]["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    fe = by["first evaluation"][0]
    assert fe["target"] == url and fe["status"] in ("ok", "insufficient_data")
    assert "needs_more_data" in fe
    kv = [r for r in by["finding opened"] if r["finding"] == "kv_pressure"][0]
    assert 0 < kv["score"] <= 1 and kv["explanation"] and kv["target"] == url
    for r in by["finding opened"]:           # every opened finding says what and why
        assert r["severity"] in ("info", "warning", "critical") and r["explanation"]
        if r.get("parameter"):
            assert "recommended" in r and "configured" in r
    # order: discovered -> first scrape -> first evaluation -> window full
    order = [r["event"] for r in recs]
    assert order.index("target discovered") < order.index("first scrape") < order.index("first evaluation")
    # never silent for more than an evaluation interval (2 s): one summary line per evaluation,
    # so the gaps are the scheduler's (slack for a loaded 2-core machine) and the lines keep up
    start_at = _t(by["listening"][0])
    times = [_t(r) for r in recs if _t(r) >= start_at]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 2 * 2.0 + 6.0, gaps
    evals = [_t(r) for r in by["evaluation"]]
    assert len(evals) >= 3 and len(evals) >= (evals[-1] - start_at) / 2.0 / 2
    ev = by["evaluation"][-1]
    assert ev["targets"] == 1 and ev["models"] == 1 and ev["critical"] + ev["warning"] >= 1


def _f(name: str, sev: str, score: float = 0.5, **kw) -> Finding:
    return Finding(finding=name, severity=sev, score=score, explanation=f"{name} because", **kw)


def test_transitions_opened_escalated_de_escalated_cleared():
    prev = {"kv_pressure": _f("kv_pressure", "warning"), "max_num_seqs": _f("max_num_seqs", "critical"),
            "idle_capacity": _f("idle_capacity", "info")}
    cur = {"kv_pressure": _f("kv_pressure", "critical", 0.9), "max_num_seqs": _f("max_num_seqs", "warning"),
           "max_model_len": _f("max_model_len", "warning")}
    got = [(t.kind, t.finding.finding) for t in transitions(prev, cur)]
    assert got == [("cleared", "idle_capacity"), ("escalated", "kv_pressure"),
                   ("opened", "max_model_len"), ("de-escalated", "max_num_seqs")]
    assert transitions(cur, cur) == []                  # same severities: nothing to say
    assert transitions({}, {}) == []


def test_narrator_logs_each_transition_once_with_the_recommendation():
    n = Narrator()
    rep = lambda fs, secs: ModelReport(target="http://t", model_name="m", findings=tuple(fs),
                                       observed={"window_seconds": secs})
    mnl = _f("max_model_len", "warning", 0.4, parameter="max_model_len", configured=32768, recommended=4096)
    with capture_logs() as logs:
        n.evaluated("http://t", "m", rep([], 2.0), 60.0, slack_s=2.0)
        n.evaluated("http://t", "m", rep([mnl], 15.0), 60.0, slack_s=2.0)
        n.evaluated("http://t", "m", rep([mnl], 30.0), 60.0, slack_s=2.0)
        n.evaluated("http://t", "m", rep([_f("max_model_len", "critical", 0.8, parameter="max_model_len",
                                              configured=32768, recommended=4096)], 58.0), 60.0, slack_s=2.0)
        n.evaluated("http://t", "m", rep([], 58.5), 60.0, slack_s=2.0)
    events = [(e["event"], e.get("percent")) for e in logs]
    assert events == [("first evaluation", None), ("window filling", 25), ("finding opened", None),
                      ("window filling", 50), ("window full", None), ("finding escalated", None),
                      ("finding cleared", None)]
    opened = logs[2]
    assert opened["recommended"] == 4096 and opened["configured"] == 32768 and opened["explanation"]
    assert logs[5]["previous_severity"] == "warning" and logs[5]["severity"] == "critical"


def test_narrator_says_when_an_engine_sleeps_and_wakes():
    n = Narrator()
    rep = lambda level, secs: ModelReport(target="http://t", model_name="m",
                                          observed={"window_seconds": secs, "sleep_level": level})
    with capture_logs() as logs:
        n.evaluated("http://t", "m", rep(0, 30.0), 60.0)
        n.evaluated("http://t", "m", rep(1, 60.0), 60.0)
        n.evaluated("http://t", "m", rep(1, 60.0), 60.0)        # still asleep: said once
        n.evaluated("http://t", "m", rep(0, 0.0), 60.0)         # woke: the window starts again
        n.evaluated("http://t", "m", rep(0, 30.0), 60.0)
        n.evaluated("http://t", "m", rep(None, 45.0), 60.0)     # a scrape without the gauge: no event
    events = [(e["event"], e.get("level"), e.get("percent")) for e in logs]
    assert events == [("window filling", None, 50), ("first evaluation", None, None),
                      ("engine asleep", 1, None), ("window full", None, None), ("engine awake", None, None),
                      ("window filling", None, 50), ("window filling", None, 75)]
