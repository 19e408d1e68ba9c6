"""The pipeline on the simulator's engine (in process: parse -> window -> evaluate, as the
daemon does): scores and report fields, observed capacity used over the predicted one, counter
resets, config-change events, windows surviving (de)serialisation, and scan on real captures."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import VLLM_CPU
from exporter.config import Config, EvaluationConfig, TargetSpec
from exporter.drift.engine import DriftEngine
from exporter.parse import parse_vllm
from exporter.pipeline import Pipelines, TargetPipeline, evaluate_snapshots
from exporter.parse.metadata import Metadata
from exporter.sim.scenario import build, load_scenario
from exporter.window import window_from_dict, window_to_dict

URL = "http://127.0.0.1:1"


class Feed:
    """A simulated server scraped every `scrape_s` seconds of sim time into a window."""

    def __init__(self, scenario, *, seed=1, window_s=60.0, gpu_hint=True, engine_hints=False, state=None,
                 **flags):
        sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
        rate = flags.pop("traffic_rate", None)
        if rate is not None:   # the same deployment under another offered load
            sc = replace(sc, phases=tuple(replace(p, traffic=replace(p.traffic, rate=rate)) for p in sc.phases))
        if flags:
            sc = replace(sc, flags=replace(sc.flags, **flags))
        self.sc = sc
        self.state = state or build(sc, seed=seed)
        extra = {}
        if engine_hints:   # what the operator knows and vLLM does not export
            extra = {"max_num_seqs": sc.flags.max_num_seqs, "max_num_batched_tokens": sc.flags.max_num_batched_tokens}
        self.spec = TargetSpec(url=URL, gpu=sc.gpu if gpu_hint else None, tp=sc.tp, **extra)
        name = self.state.model_name
        self.meta = Metadata(vllm_version=self.state.version, served_models=(name,),
                             max_model_len={name: self.state.max_model_len}, root={name: sc.model})
        self.cfg = Config(evaluation=EvaluationConfig(interval=5, window=window_s))
        self.fleet = Pipelines(self.cfg)
        self.pipe = self.fleet.pipeline(self.spec, name, window_s=window_s)
        self.t = 0.0
        self.snap = None

    def advance(self, seconds, scrape_s=2.0, eval_every=5.0):
        reports = []
        end = self.t + seconds
        next_eval = self.t + eval_every
        while self.t < end - 1e-9:
            self.t = round(self.t + scrape_s, 6)
            self.state.engine.advance_to(self.sc.warmup_s + self.t)
            [self.snap] = parse_vllm(self.state.exposition(), target=URL, timestamp=1.7e9 + self.t)
            self.pipe.observe(self.snap)
            if self.t + 1e-9 >= next_eval:
                next_eval += eval_every
                reports.append(self.evaluate())
        return reports

    def evaluate(self):
        return self.pipe.evaluate(self.meta, 1.7e9 + self.t)

    @property
    def window(self):
        return self.pipe.window


def loud(report):
    return {f.finding for f in report.findings if f.severity in ("warning", "critical")}


def test_healthy_scenario_is_quiet_and_fully_scored():
    f = Feed("healthy", engine_hints=True)
    reports = f.advance(90)
    assert all(not loud(r) for r in reports)
    last = reports[-1]
    assert last.status == "ok"
    assert last.kv_pressure_score == 0.0
    assert 0.0 < last.idle_capacity_ratio < 0.85
    assert last.predicted_kv_cache_tokens and last.observed_kv_cache_tokens_ratio == pytest.approx(1.0, abs=0.02)
    assert last.misconfiguration["gpu_memory_utilization"] == 0.0
    assert last.configured["max_model_len"] == 4096 and last.configured["enable_prefix_caching"] == 1.0
    doc = last.to_json()
    json.dumps(doc)
    assert doc["findings"] == [x.to_json() for x in last.findings]


def test_kv_pressure_scores_and_recommends_from_the_observed_pool():
    f = Feed("kv-pressure")
    last = f.advance(90)[-1]
    assert "kv_pressure" in loud(last)
    assert last.kv_pressure_score > 0.02
    kv = next(x for x in last.findings if x.finding == "kv_pressure")
    assert kv.since is not None and "preemptions/min" in kv.explanation
    mns = [x for x in last.findings if x.finding == "max_num_seqs"]
    assert mns and mns[0].recommended < 256 and mns[0].binding == "kv_cache"


def test_observed_capacity_beats_the_prediction():
    """A server that reports half the blocks the calculator predicts (another process on the
    GPU, say): the ratio is exported and recommendations use the observed pool."""
    full = Feed("kv-pressure", engine_hints=True)
    blocks = full.state.resolved.config.num_gpu_blocks
    half = Feed("kv-pressure", engine_hints=True, num_gpu_blocks=blocks // 2)
    r_full, r_half = full.advance(90)[-1], half.advance(90)[-1]
    assert r_half.observed_kv_cache_tokens_ratio == pytest.approx(0.5, abs=0.02)
    assert r_half.predicted_kv_cache_tokens == r_full.predicted_kv_cache_tokens
    rec_full = next(x.recommended for x in r_full.findings if x.finding == "max_num_seqs")
    rec_half = next(x.recommended for x in r_half.findings if x.finding == "max_num_seqs")
    assert rec_half < rec_full


def test_unknown_gpu_is_named_with_the_way_to_give_it():
    f = Feed("healthy", gpu_hint=False)
    last = f.advance(60)[-1]
    assert last.predicted_kv_cache_tokens is None
    st = last.finding_status["tier_misplacement"]
    assert st["status"] == "unavailable" and "targets[].gpu" in st["reason"] and "file_sd" in st["reason"]
    assert not any(x.finding == "unavailable" for x in last.findings)    # a status, not a finding


def test_a_whole_windows_confidence_does_not_move_with_the_scrape_times():
    """Confidence grows while the window fills; once it is whole it is 1 at every evaluation,
    although the span its baselines cover moves with where the evaluation falls between scrapes
    (a finding's gauge must not flicker, nor its family be written anew every evaluation)."""
    f = Feed("kv-pressure")                     # window 60 s, scrapes every 2 s, evaluations every 5 s
    reports = f.advance(150)
    conf = [(r.evaluated_at - 1.7e9, next((x.confidence for x in r.findings if x.finding == "kv_pressure"), None))
            for r in reports]
    filling = [c for t, c in conf if t < 50 and c is not None]
    whole = [c for t, c in conf if t >= 62]
    assert filling and filling == sorted(filling) and filling[-1] < 1
    assert whole and all(c == 1.0 for c in whole)


def test_short_window_is_insufficient_data_and_reset_restarts_it():
    f = Feed("kv-pressure")
    first = f.advance(10)
    assert all(r.status == "insufficient_data" for r in first)
    # what the snapshots prove is reported at once; rate-based findings say how long they need
    assert [x.finding for x in first[-1].findings] == ["kv_pressure"]
    assert 0 < first[-1].findings[0].confidence < 1
    assert first[-1].finding_status["max_num_seqs"]["status"] == "insufficient_data"
    assert "more minute" in first[-1].finding_status["max_num_seqs"]["reason"]
    assert not first[-1].recommended
    reports = f.advance(80)
    assert "kv_pressure" in loud(reports[-1])
    [kv] = [x for x in reports[-1].findings if x.finding == "kv_pressure"]
    assert kv.confidence > first[-1].findings[0].confidence           # grows as the window fills
    # the server restarts: counters start again from zero, a fresh window
    f.state = build(f.sc, seed=7, start_time=1.7e9 + f.t)
    f.sc = replace(f.sc, warmup_s=f.sc.warmup_s - f.t)
    after = f.advance(10)
    assert after[-1].status == "insufficient_data"
    assert "kv_pressure" in loud(after[-1])          # held while the new window fills
    assert f.window.resets == 1


def test_config_change_is_recorded():
    f = Feed("healthy")
    f.advance(30)
    other = Feed("healthy", gpu_memory_utilization=0.85)
    [snap] = parse_vllm(other.state.exposition(), target=URL, timestamp=1.7e9 + f.t + 1)
    f.pipe.observe(snap)
    f.snap = snap
    f.t += 1
    report = f.evaluate()
    assert any(n.startswith("config change") and "gpu_memory_utilization 0.9 -> 0.85" in n for n in report.notes)
    assert f.fleet.engine.trackers[DriftEngine.key(URL, snap.model_name)].events[-1]["kind"] == "config_change"


def test_window_survives_serialisation():
    f = Feed("kv-pressure", window_s=120.0)
    f.advance(120)                     # 60 snapshots: thinned to about 32 in the saved form
    doc = json.loads(json.dumps(window_to_dict(f.window)))
    assert len(doc["snapshots"]) < 40
    w2 = window_from_dict(doc)
    a, b = f.window.summary(1.7e9 + f.t), w2.summary(1.7e9 + f.t)
    # rates and quantiles come from the whole first and last snapshots: exact
    for key in ("prompt_tokens_per_s", "generation_tokens_per_s", "preemptions_per_s", "requests_per_s",
                "duration_s"):
        assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-9), key
    assert b.ttft == a.ttft and b.prompt_len == a.prompt_len
    # gauge statistics from the saved sample of snapshots: close
    for key in ("kv_usage_mean", "kv_usage_max"):
        assert getattr(b, key) == pytest.approx(getattr(a, key), abs=0.05), key
    assert b.running_max <= a.running_max


def test_evaluator_state_restores_active_findings():
    f = Feed("kv-pressure")
    f.advance(90)
    saved = json.loads(json.dumps(f.fleet.to_state([f.pipe])))
    fleet2 = Pipelines(f.cfg)
    assert fleet2.restore(saved) == (1, 1)
    before = {x.finding: x.since for x in f.evaluate().findings if x.severity != "info"}
    p2 = TargetPipeline(fleet2, f.spec, f.snap.model_name, f.window)
    p2.latest = f.snap
    after = {x.finding: x.since for x in p2.evaluate(f.meta, 1.7e9 + f.t).findings if x.severity != "info"}
    assert after == before and "kv_pressure" in after
    # the saved window is claimed by the first pipeline of the same (target, model)
    p3 = fleet2.pipeline(f.spec, f.snap.model_name)
    assert len(p3.window) > 2 and not fleet2.restored_windows


def test_scan_pair_on_real_captures_reports_a_status(shared, tmp_path):
    """scan --json on a real capture pair carries the same finding objects as the daemon."""
    cap = shared("fixtures", "prom", "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom")
    out = subprocess.run([sys.executable, "-m", "exporter", "scan", "--json", str(cap), "--after", str(cap),
                          "--interval", "30"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["targets"][0]
    # the same file twice: no requests in between, so settings are not judged
    assert t["status"] == "insufficient_data"
    assert {"finding", "severity", "score", "parameter", "configured", "recommended", "explanation"} <= set(t["findings"][0])


CPU = VLLM_CPU


def _scan_pair(a: str, b: str, interval: float) -> dict:
    out = subprocess.run([sys.executable, "-m", "exporter", "scan", "--json", str(CPU / a), "--after", str(CPU / b),
                          "--interval", str(interval)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["targets"][0]


def test_real_vllm_cpu_kv_pressure_pair_fires_kv_pressure():
    """Real vLLM 0.32 (CPU build) with a 48-block pool and 48 concurrent clients, two captures
    20 s apart (CAPTURES.md, KV-pressure run): preemptions climb while KV sits near full."""
    if not (CPU / "vllm-0.32.0-cpu-kv-pressure-a.prom").exists():
        pytest.skip("vllm-cpu captures not present")
    t = _scan_pair("vllm-0.32.0-cpu-kv-pressure-a.prom", "vllm-0.32.0-cpu-kv-pressure-b.prom", 20)
    kv = [f for f in t["findings"] if f["finding"] == "kv_pressure"]
    assert kv and kv[0]["severity"] in ("warning", "critical")
    a, b = (parse_vllm((CPU / n).read_bytes(), target="x", timestamp=0.0)[0]
            for n in ("vllm-0.32.0-cpu-kv-pressure-a.prom", "vllm-0.32.0-cpu-kv-pressure-b.prom"))
    per_min = (b.counters["num_preemptions_total"] - a.counters["num_preemptions_total"]) / 20 * 60
    assert per_min > 0 and f"{per_min:.1f} preemptions/min" in kv[0]["explanation"]
    assert t["scores"]["kv_pressure"] == kv[0]["score"] > 0.5
    assert t["configured"]["gpu_memory_utilization"] is not None


def test_real_vllm_cpu_steady_load_raises_nothing_at_warning():
    """The same server with a 2M-token pool at 8 concurrent clients: no pressure, and without a
    GPU hint an engine that steps all the time is not called idle above `info`."""
    if not (CPU / "vllm-0.32.0-cpu-load-a.prom").exists():
        pytest.skip("vllm-cpu captures not present")
    t = _scan_pair("vllm-0.32.0-cpu-load-a.prom", "vllm-0.32.0-cpu-load-b.prom", 30)
    assert t["status"] == "ok"
    assert [f for f in t["findings"] if f["severity"] != "info"] == []
    assert t["scores"]["kv_pressure"] == 0.0


def test_server_without_load_metrics_is_unavailable_not_zero():
    """--disable-log-stats: only cache_config_info is exported; nothing is judged from zeros."""
    st = build(load_scenario("healthy"), seed=1)
    text = "\n".join(l for l in st.exposition().splitlines() if "cache_config_info" in l) + "\n"
    snaps = [parse_vllm(text, target=URL, timestamp=1.7e9 + dt) for dt in (0, 30)]
    [r] = evaluate_snapshots(Pipelines(Config(), one_shot=True), TargetSpec(url=URL), snaps, None, 1.7e9 + 30,
                             window_s=3600)
    assert r.status == "unavailable"
    assert r.findings == ()
    assert {s["status"] for s in r.finding_status.values()} == {"unavailable"}
    assert "needs vLLM's load metrics" in r.finding_status["kv_pressure"]["reason"]
    assert r.kv_pressure_score is None and r.idle_capacity_ratio is None


def test_vanished_targets_are_forgotten_and_events_reported():
    f = Feed("healthy")
    f.advance(30)
    other = Feed("healthy", gpu_memory_utilization=0.85)
    [snap] = parse_vllm(other.state.exposition(), target=URL, timestamp=1.7e9 + f.t + 1)
    f.pipe.observe(snap)
    f.snap, f.t = snap, f.t + 1
    r = f.evaluate()
    assert r.events and r.events[-1]["changed"]["gpu_memory_utilization"] == ["0.9", "0.85"]
    assert r.to_json()["events"] == list(r.events)
    # another target evaluated two hours later: the silent one's state is dropped
    g = Feed("healthy")
    g.fleet = f.fleet
    g.spec = TargetSpec(url="http://127.0.0.1:2", gpu="L4")
    g.pipe = f.fleet.pipeline(g.spec, g.state.model_name, window_s=60.0)
    g.advance(30)
    g.pipe.evaluate(g.meta, 1.7e9 + 7200 + g.t)
    assert list(f.fleet.engine.trackers) == [DriftEngine.key("http://127.0.0.1:2", g.snap.model_name)]


def test_report_carries_the_derived_quantities_behind_the_scores():
    f = Feed("max-num-seqs-too-low")
    last = f.advance(90)[-1]
    d = last.derived
    assert last.to_json()["derived"] == d
    mns = next(x for x in last.findings if x.finding == "max_num_seqs")
    assert d["max_num_seqs"] == mns.configured == 6 and d["max_num_seqs_source"].startswith("inferred")
    assert d["queue_share"] > 0 and d["kv_bound_requests"] >= mns.recommended
    assert d["gpu"] == "L4" and d["model"] and d["missing_hints"] == []


def test_reload_keeps_the_stable_state():
    f = Feed("kv-pressure")
    f.advance(90)
    before = f.fleet.engine
    f.fleet.reconfigure(f.cfg)
    assert f.fleet.engine is not before and f.fleet.engine.trackers is before.trackers and before.trackers


def test_unknown_model_and_gpu_hints_are_named():
    from exporter.drift.predict import resolve_hints
    res = resolve_hints(["my-private-finetune"], "H100-SXM-80GB")
    assert res.model is None and res.missing == ("model",)
    assert "targets[].model" in res.notes[0] and "my-private-finetune" in res.notes[0]
    res = resolve_hints(["meta-llama/Llama-3.1-8B-Instruct"], "Quantum-GPU-9000")
    assert res.model is not None and res.missing == ("gpu",) and "Quantum-GPU-9000" in res.notes[0]


def test_quiet_server_is_not_judged_but_its_idleness_is_scored():
    f = Feed("idle-overprovisioned", traffic_rate=0.001)
    last = f.advance(90)[-1]
    assert last.status == "insufficient_data"
    assert "requests finished" in last.finding_status["max_num_seqs"]["reason"]
    assert last.finding_status["idle_capacity"]["status"] == "ok"
    assert last.idle_capacity_ratio is not None and last.idle_capacity_ratio > 0.97
    assert {x.finding for x in last.findings} <= {"idle_capacity"}
