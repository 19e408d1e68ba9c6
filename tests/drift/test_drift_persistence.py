"""The daemon's drift state survives a restart: a real `Daemon` scrapes a simulated vLLM server
over loopback HTTP, raises kv_pressure, stops (saving the state file), and a second daemon on the
same state_dir reports the same active finding at its first evaluation with the same `since`.
A corrupt state file is set aside and counted in vllm_drift_state_errors_total, never fatal."""
from __future__ import annotations

import asyncio
import json
import time

import loopback

from exporter.config import Config, EvaluationConfig, ScrapeConfig, TargetSpec
from exporter.daemon import Daemon
from exporter.sim.scenario import build, load_scenario


class SimSite:
    """A simulated server whose sim time runs `speed` times faster than wall time."""

    def __init__(self, scenario: str, speed: float = 20.0):
        self.state = build(load_scenario(scenario), seed=1)
        self.state.speed = speed
        self.t0 = time.monotonic()
        name = self.state.model_name.encode()
        models = (b'{"object":"list","data":[{"id":"' + name + b'","object":"model","root":"' + name
                  + b'","max_model_len":' + str(self.state.max_model_len).encode() + b'}]}')
        self.site = loopback.Site(loopback.static({
            "/metrics": self.metrics, "/v1/models": models,
            "/version": b'{"version":"' + self.state.version.encode() + b'"}'}))

    def metrics(self) -> bytes:
        self.state.tick(time.monotonic() - self.t0)
        return self.state.exposition().encode()

    def __enter__(self):
        self.site.__enter__()
        return self

    def __exit__(self, *exc):
        self.site.__exit__(*exc)


def config(url: str, state_dir) -> Config:
    return Config(listen="127.0.0.1:0", scrape=ScrapeConfig(interval=0.5, timeout=0.5, jitter=0.01),
                  evaluation=EvaluationConfig(interval=1.0, window=6.0),
                  targets=[TargetSpec(url=url, gpu="L4")], state_dir=str(state_dir))


def active(d: Daemon) -> dict[str, float]:
    doc = json.loads(d.published.findings)
    return {f["finding"]: f["since"] for t in doc["targets"] for f in t.get("findings", [])
            if f["severity"] in ("warning", "critical")}


def test_findings_and_windows_survive_a_restart(tmp_path):
    with SimSite("kv-pressure") as sim:
        d1 = Daemon(config(sim.site.url, tmp_path))
        asyncio.run(d1.run(duration=9.0))
        first = active(d1)
        assert "kv_pressure" in first, json.loads(d1.published.findings)
        doc = json.loads((tmp_path / "drift-state.json").read_text())
        assert doc["version"] == 1 and doc["format"] == "vllm-drift-state"
        [wkey] = doc["state"]["windows"]
        assert wkey.startswith(sim.site.url + "|") and len(doc["state"]["windows"][wkey]["snapshots"]) >= 3

        d2 = Daemon(config(sim.site.url, tmp_path))
        asyncio.run(d2.run(duration=1.6))        # one evaluation, far less than raise-after x interval
        second = active(d2)
        assert second.get("kv_pressure") == first["kv_pressure"]
        assert d2.state_store.errors == {}


def test_corrupt_state_is_set_aside_and_counted(tmp_path):
    (tmp_path / "drift-state.json").write_text('{"format": "vllm-drift-state", "version": 1, "state": ')
    with SimSite("healthy") as sim:
        d = Daemon(config(sim.site.url, tmp_path))
        asyncio.run(d.run(duration=2.0))
        metrics = d.exposition.render().decode()
    assert 'vllm_drift_state_errors_total{operation="load"} 1.0' in metrics
    aside = [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1
    assert json.loads((tmp_path / "drift-state.json").read_text())["format"] == "vllm-drift-state"  # saved anew
