"""Several scrapers of one simulated vLLM server, in process and in sim time: each has its own
window (and its own scrape phase), evaluated through the pipeline as the daemon does. Used by the
findings tests (instant findings, three daemons agreeing, hint checks)."""
from __future__ import annotations

from dataclasses import replace

from exporter.config import Config, EvaluationConfig, TargetSpec
from exporter.parse import parse_vllm
from exporter.parse.metadata import Metadata
from exporter.pipeline import Pipelines
from exporter.sim.scenario import build, load_scenario

T0 = 1.7e9


class SimServer:
    """One simulated server; `scrape(t)` renders its exposition at sim second `t` (monotonic)."""

    def __init__(self, scenario: str, *, seed: int = 1, started: float = 0.0, **flags) -> None:
        """`started`: the sim second the server (re)started at (a restart: counters from zero)."""
        sc = load_scenario(scenario)
        if flags:
            sc = replace(sc, flags=replace(sc.flags, **flags))
        self.sc = sc
        self.started = started
        self.state = build(sc, seed=seed, start_time=T0 + started) if started else build(sc, seed=seed)
        self.t = started
        name = self.state.model_name
        self.model_name = name
        self.meta = Metadata(vllm_version=self.state.version, served_models=(name,),
                             max_model_len={name: self.state.max_model_len}, root={name: sc.model})

    def scrape(self, t: float, url: str):
        assert t >= self.t
        self.t = t
        self.state.engine.advance_to(self.sc.warmup_s + t - self.started)
        return parse_vllm(self.state.exposition(), target=url, timestamp=T0 + t)


class Scraper:
    """One daemon's view of a server: its config, engine state and window."""

    def __init__(self, server: SimServer, *, url: str = "http://127.0.0.1:1", gpu: str | None = "hint",
                 window_s: float = 600.0, interval_s: float = 30.0, one_shot: bool = False,
                 **hints) -> None:
        self.server = server
        gpu = server.sc.gpu if gpu == "hint" else gpu
        self.spec = TargetSpec(url=url, gpu=gpu, tp=server.sc.tp, **hints)
        self.fleet = Pipelines(Config(evaluation=EvaluationConfig(interval=interval_s, window=window_s)),
                               one_shot=one_shot)
        self.pipe = self.fleet.pipeline(self.spec, server.model_name, window_s=window_s)

    def observe(self, snaps) -> None:
        for s in snaps:
            self.pipe.observe(s)

    def evaluate(self, t: float):
        return self.pipe.evaluate(self.server.meta, T0 + t)


def loud(report) -> set[str]:
    return {f.finding for f in report.findings if f.severity in ("warning", "critical")}
