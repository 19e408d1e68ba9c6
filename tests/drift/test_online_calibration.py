"""Online self-calibration through the pipeline: a simulated server whose true step times are
1.5x what the calculator predicts (and says nothing about it) is learned from its own window; a
new replica of the same pool starts calibrated from what its peers taught; fits survive a daemon
restart through the state file; an unscaled healthy server stays quiet."""
from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import replace

from exporter.config import Config, EvaluationConfig, ScrapeConfig, TargetSpec
from exporter.daemon import Daemon
from exporter.model.calibrate import ONLINE_STEP_FACTORS
from exporter.parse import parse_vllm
from exporter.parse.metadata import Metadata
from exporter.pipeline import Pipelines
from exporter.sim.scenario import build, load_scenario

URL = "http://127.0.0.1:{}"


def _server(seed: int, scale: float = 1.5):
    return build(replace(load_scenario("healthy"), step_time_scale=scale), seed=seed)


def _feed(fleet: Pipelines, state, url: str, t0: float, seconds: float, scrape_s: float = 15.0):
    """Scrape a simulated server into its pipeline for `seconds` of sim time; evaluate at the end."""
    name = state.model_name
    pipe = fleet.pipeline(TargetSpec(url=url, gpu="L4"), name)
    meta = Metadata(vllm_version=state.version, served_models=(name,),
                    max_model_len={name: state.max_model_len}, root={name: state.scenario.model})
    t = t0
    while t < t0 + seconds:
        t += scrape_s
        state.engine.advance_to(state.scenario.warmup_s + t)
        [snap] = parse_vllm(state.exposition(), target=url, timestamp=1.7e9 + t)
        pipe.observe(snap)
    return pipe, pipe.evaluate(meta, 1.7e9 + t), (snap, meta)


def _observed_tpot(report) -> float:
    return report.observed["tpot_mean_s"]


def test_a_slower_server_is_learned_from_its_window():
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep, _ = _feed(fleet, _server(1), URL.format(1), 0.0, 240.0)
    obs = _observed_tpot(rep)
    assert rep.prediction_basis == "calibrated"
    assert abs(rep.predicted_tpot_seconds - obs) / obs < 0.05
    assert abs(rep.prior_tpot_seconds - obs) / obs > 0.2
    doc = rep.to_json()["predicted"]
    assert doc["basis"] == "calibrated" and doc["prior_tpot_seconds"] == rep.prior_tpot_seconds
    assert set(doc["calibration"]["factors"]) == {"step_overhead", "bandwidth_efficiency",
                                                  "compute_efficiency", "per_token", "ttft_steps",
                                                  "ttft_prefill"}


def test_ttft_is_learned_where_it_is_the_prefill_path(monkeypatch):
    """Live arrivals are not a benchmark's clients: the a-priori TTFT (fitted on closed-loop sweeps
    whose clients arrive together) is far above a Poisson stream's. The window's mean TTFT
    teaches the TTFT factors; the step-time factors, and the inter-token gap the latency alerts
    are held to, stay what the TPOT taught."""
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep, _ = _feed(fleet, _server(1, scale=1.0), URL.format(1), 0.0, 240.0)
    obs = rep.observed["ttft_mean_s"]
    assert rep.prediction_basis == "calibrated"
    assert abs(rep.prior_ttft_seconds - obs) / obs > 1.0            # the prior: over twice the TTFT seen
    assert abs(rep.predicted_ttft_seconds - obs) / obs < 0.15
    k = len(ONLINE_STEP_FACTORS)
    [pool] = fleet.calibration.pools.values()
    # the same window without its TTFT (every window's counted as queueing): the same speed learned
    monkeypatch.setattr("exporter.drift.calibration.QUEUE_SHARE", -1.0)
    blind = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep2, _ = _feed(blind, _server(1, scale=1.0), URL.format(1), 0.0, 240.0)
    [pool2] = blind.calibration.pools.values()
    assert pool2.mean[k:] == [0.0, 0.0] and min(map(abs, pool.mean[k:])) > 0.1
    assert abs(rep2.predicted_tpot_seconds - rep.predicted_tpot_seconds) / rep.predicted_tpot_seconds < 0.01
    assert abs(rep2.slo_seconds["tpot"] - rep.slo_seconds["tpot"]) / rep.slo_seconds["tpot"] < 0.01


def test_a_queue_for_kv_blocks_teaches_no_ttft():
    """Under KV pressure (requests waiting for blocks, preemptions) the TTFT is a queue the KV
    findings score: it must not teach the pool a TTFT its healthy replicas would then be held to."""
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep, _ = _feed(fleet, build(load_scenario("kv-pressure"), seed=3), URL.format(3), 0.0, 240.0)
    assert rep.observed["waiting_mean"] > 1 and rep.observed["ttft_mean_s"] > 20 * rep.prior_ttft_seconds
    [pool] = fleet.calibration.pools.values()
    assert pool.updates == 1                                    # its TPOT was learned
    assert pool.mean[len(ONLINE_STEP_FACTORS):] == [0.0, 0.0]
    assert any(f["finding"] == "kv_pressure" for f in rep.to_json()["findings"])


def test_a_new_replica_starts_from_what_its_pool_learned():
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    for i in range(3):
        _feed(fleet, _server(10 + i), URL.format(10 + i), 0.0, 240.0)
    # a fourth replica, five scrapes old: too few requests of its own to be a measurement
    _, rep, _ = _feed(fleet, _server(20), URL.format(20), 0.0, 10.0, scrape_s=2.0)
    assert rep.prediction_basis == "calibrated"
    assert rep.calibration["updates"] == 3          # taught by its peers, not by its own data
    alone = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep_alone, _ = _feed(alone, _server(20), URL.format(20), 0.0, 10.0, scrape_s=2.0)
    assert rep_alone.prediction_basis == "prior"
    assert rep.predicted_tpot_seconds > 1.3 * rep_alone.predicted_tpot_seconds


def test_pools_survive_the_state_document():
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    pipe, rep, (snap, meta) = _feed(fleet, _server(1), URL.format(1), 0.0, 240.0)
    doc = json.loads(json.dumps(fleet.to_state([pipe])))
    again = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    again.restore(doc)
    fresh = again.pipeline(TargetSpec(url=URL.format(1), gpu="L4"), snap.model_name, window_s=600)
    fresh.observe(snap)
    rep2 = fresh.evaluate(meta, snap.timestamp)
    assert rep2.prediction_basis == "calibrated"
    assert abs(rep2.predicted_tpot_seconds - rep.predicted_tpot_seconds) / rep.predicted_tpot_seconds < 0.02


def test_daemon_restart_resumes_with_its_fits(tmp_path):
    import loopback
    import time
    state = _server(3)
    state.speed = 60.0
    t0 = time.monotonic()
    name = state.model_name.encode()
    models = b'{"object":"list","data":[{"id":"' + name + b'","object":"model","root":"' + name + b'"}]}'

    def metrics() -> bytes:
        state.tick(time.monotonic() - t0)
        return state.exposition().encode()

    def cfg(url):
        return Config(listen="127.0.0.1:0", scrape=ScrapeConfig(interval=0.5, timeout=0.5, jitter=0.01),
                      evaluation=EvaluationConfig(interval=1.0, window=60.0),
                      targets=[TargetSpec(url=url, gpu="L4")], state_dir=str(tmp_path))

    with loopback.Site(loopback.static({"/metrics": metrics, "/v1/models": models,
                                        "/version": b'{"version":"' + state.version.encode() + b'"}'})) as site:
        d1 = Daemon(cfg(site.url))
        asyncio.run(d1.run(duration=6.0))
        saved = json.loads((tmp_path / "drift-state.json").read_text())["state"]["calibration"]["pools"]
        assert saved and all(p["updates"] >= 1 for p in saved.values())
        d2 = Daemon(cfg(site.url))
        d2.load_state()
        assert d2.pipelines.calibration.pools.keys() == saved.keys()
        [pool] = d2.pipelines.calibration.pools.values()
        assert pool.mean == next(iter(saved.values()))["mean"]


def test_scan_of_a_dumped_pair(tmp_path, cli_env):
    """The outside check's scenario through the CLI: two dumps of one seed, 120 and 240 s."""
    def dump(name, seconds, *extra):
        path = tmp_path / name
        with open(path, "w") as f:
            subprocess.run(["vllm-drift", "simulate", "--scenario", "healthy", "--seed", "11", "--dump",
                            str(seconds), *extra], stdout=f, check=True, env=cli_env, timeout=300)
        return str(path)

    def scan(a, b):
        out = subprocess.run(["vllm-drift", "scan", a, "--after", b, "--gpu", "L4", "--json"],
                             capture_output=True, text=True, env=cli_env, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["targets"][0]

    slow = scan(dump("sa", 120, "--step-time-scale", "1.5"), dump("sb", 240, "--step-time-scale", "1.5"))
    obs, pred = slow["observed"]["tpot_mean_s"], slow["predicted"]
    assert pred["basis"] == "calibrated" and abs(pred["tpot_seconds"] - obs) / obs < 0.05
    assert abs(pred["prior_tpot_seconds"] - obs) / obs > 0.2
    healthy = scan(dump("ha", 120), dump("hb", 240))
    assert not [f for f in healthy["findings"] if f["severity"] in ("warning", "critical")]


def test_unconfigured_slo_is_what_the_hardware_should_deliver():
    """No SLO configured: the objective the latency alerts compare p99 with is the model's expected
    p99 at the observed load (x 1.5, never under the defaults); a healthy L4 meets it, so the
    shipped rules do not page it for missing a number set for another GPU."""
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    _, rep, _ = _feed(fleet, _server(1, scale=1.0), URL.format(1), 0.0, 240.0)
    assert rep.slo_source == {"ttft": "expected", "tpot": "expected"}
    assert rep.slo_seconds["tpot"] >= 0.15 and rep.slo_seconds["ttft"] >= 2.0
    # the alert reads the inter-token gap p99 and the TTFT p99 of the same window
    assert rep.observed["itl_p99_s"] < rep.slo_seconds["tpot"]
    assert rep.observed["ttft_p99_s"] < rep.slo_seconds["ttft"]
    # a configured SLO is used as given
    fleet2 = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    pipe = fleet2.pipeline(TargetSpec(url=URL.format(2), gpu="L4", slo={"ttft_p99": 0.5, "tpot_p99": 0.05}),
                           rep.model_name)
    state = _server(2, scale=1.0)
    [snap] = parse_vllm(state.exposition(), target=URL.format(2), timestamp=1.7e9)
    pipe.observe(snap)
    rep2 = pipe.evaluate(None, 1.7e9)
    assert rep2.slo_seconds == {"ttft": 0.5, "tpot": 0.05}
    assert rep2.slo_source == {"ttft": "configured", "tpot": "configured"}


def test_a_targets_last_answers_are_reused_on_a_grid():
    """A target evaluated again at a load that differs below the 3-significant-digit grid gets
    its last answers back (the same prediction object), within 0.5 % of the exact load's; a
    load that moved is asked again; a target that leaves takes its answers with it."""
    from exporter.drift.calibration import FleetCalibration
    from exporter.model.perf import predict
    from exporter.model.setup import Setup
    from exporter.model.traffic import Traffic

    setup = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "L4", tp=1)
    fleet = FleetCalibration()
    kw = dict(target="http://a:1", model_name="m", prefix_hit_ratio=0.0, tpot_mean=None,
              window_requests=0.0, lifetime_requests=None, now=0.0)
    a = fleet.evaluate(setup, prompt_mean=1000.4, output_mean=250.2, running_mean=12.31, **kw)
    first = fleet.memo[("http://a:1", "m")][1]
    b = fleet.evaluate(setup, prompt_mean=1000.1, output_mean=250.4, running_mean=12.33, **kw)
    assert fleet.memo[("http://a:1", "m")][1] is first and a.prior_tpot_s == b.prior_tpot_s
    exact = predict(setup, Traffic(prompt_tokens_mean=1000.4, output_tokens_mean=250.2), concurrency=12.31)
    assert abs(a.prior_tpot_s - exact.tpot_s) / exact.tpot_s < 0.005
    c = fleet.evaluate(setup, prompt_mean=1000.1, output_mean=250.4, running_mean=24.0, **kw)
    assert fleet.memo[("http://a:1", "m")][1] is not first and c.prior_tpot_s > a.prior_tpot_s
    fleet.forget("http://a:1", "m")
    assert fleet.memo == {}
    # the spread (a numeric gradient, 5 model runs) is reused while the load stays within 15 %
    # and the pool has not moved by 8 updates; it only decides the basis
    learn = dict(kw, tpot_mean=0.08, window_requests=200.0, one_shot=True)
    fleet.evaluate(setup, prompt_mean=1000.0, output_mean=250.0, running_mean=12.0, **learn)
    then = fleet.memo[("http://a:1", "m")][5]
    assert then[0] == 1 and fleet.memo[("http://a:1", "m")][4] is not None
    fleet.evaluate(setup, prompt_mean=1050.0, output_mean=240.0, running_mean=12.9, **kw)
    assert fleet.memo[("http://a:1", "m")][5] is then
    fleet.evaluate(setup, prompt_mean=1050.0, output_mean=240.0, running_mean=20.0, **kw)
    assert fleet.memo[("http://a:1", "m")][5] is not then


def test_a_refused_fit_is_logged_once_then_counted():
    # an H100 server hinted as an L4: every fit of its window would leave the physical range.
    # The first refusal is a warning; the next (every update interval while the contradiction
    # lasts) are counted in vllm_drift_model_calibration_rejections, not logged again at warning
    import structlog
    fleet = Pipelines(Config(evaluation=EvaluationConfig(window=600)))
    state = build(load_scenario("idle-overprovisioned"), seed=3)
    with structlog.testing.capture_logs() as logs:
        for i in range(5):
            _, rep, _ = _feed(fleet, state, URL.format(9), 120.0 * i, 120.0)
    rejected = [e for e in logs if e["event"] == "calibration rejected"]
    assert len(rejected) >= 2
    assert [e["log_level"] for e in rejected] == ["warning"] + ["debug"] * (len(rejected) - 1)
    assert "vllm_drift_model_calibration_rejections" in rejected[0]["repeats"]
    assert sum(p.rejected for p in fleet.calibration.pools.values()) == len(rejected)


def test_calibration_file_rows_faster_than_the_gpu_are_logged_and_left_out():
    """The daemon seeds a pool from `calibration_files` as calc does: a row under the GPU's
    datasheet floor is left out of the seed, and said once in the log, by line."""
    import structlog

    from exporter.drift.calibration import FleetCalibration
    from exporter.model.calibrate import Row
    from exporter.model.perf import predict, tpot_floor_s
    from exporter.model.setup import Setup
    from exporter.model.traffic import Traffic

    setup = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "L4", tp=1)
    t = Traffic(prompt_tokens_mean=1024, output_tokens_mean=256)
    rows = []
    for line, c in enumerate((1, 8, 32), start=2):
        p = predict(setup, t, concurrency=c)
        tpot = p.tpot_s
        if c == 8:   # line 3: 8 clients, at 80 % of what the L4 can do
            tpot = 0.8 * tpot_floor_s(setup, prompt_tokens=1024, output_tokens=256, concurrency=c,
                                      tpot_s=p.tpot_s, ttft_s=p.ttft_s)
        rows.append(Row(setup.model.name, "L4", 1, "bf16", 1024, 256, c, tpot, p.ttft_s, line))
    fleet = FleetCalibration(rows)
    kw = dict(target="http://a:1", model_name="m", prefix_hit_ratio=0.0, tpot_mean=None,
              window_requests=0.0, lifetime_requests=None, now=0.0)
    with structlog.testing.capture_logs() as logs:
        fleet.evaluate(setup, prompt_mean=1024, output_mean=256, running_mean=8, **kw)
        fleet.evaluate(setup, prompt_mean=1024, output_mean=256, running_mean=16, **kw)
    aside = [e for e in logs if e["event"] == "calibration rows set aside"]
    assert len(aside) == 1 and any("line 3" in n and "floor" in n for n in aside[0]["notes"])
