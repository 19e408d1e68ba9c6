"""Nothing lost: a real `vllm-drift serve` subprocess killed with SIGKILL (during state writes, and
mid-run) or stopped with SIGTERM (with hanging targets) keeps its state usable and resumes it.

The daemon saves its state at most every `Daemon.STATE_SAVE_MIN_INTERVAL` seconds (30 by
default); these tests run the real CLI through a two-line launcher that lowers it, so a save is
under way often enough for random kills to land inside one.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopback
from conftest import free_port
from daemons import Serve, Simulator, samples, wait_for
from test_faults import CAPTURE

from exporter.drift.state import STATE_FILE, StateStore

LAUNCH = ("import sys\nfrom exporter.daemon import Daemon\nDaemon.STATE_SAVE_MIN_INTERVAL = float(sys.argv[1])\n"
          "from exporter.cli import main\nsys.exit(main(sys.argv[2:]))")


class Launched(Serve):
    """`vllm-drift serve` through the launcher (same CLI, a shorter minimum save interval)."""

    def __init__(self, config_path, env, workdir: Path, *, save_every: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(workdir) / f"daemon-{self.port}.log"
        self.err = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(save_every), "serve", "--config",
                                      str(config_path), "--listen", f"127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=self.err, env=env)
        self.peak_rss = 0.0

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.err.close()


def many_metrics(body: bytes) -> loopback.Handler:
    """Serve `body` at any path ending in /metrics: many targets (http://host:port/tN) on one port."""
    async def handle(reader, writer, path):
        writer.write(loopback.response(body if path.endswith("/metrics") else b"{}",
                                       "text/plain" if path.endswith("/metrics") else "application/json"))
    return handle


def test_sigkill_during_state_writes_leaves_old_or_new_state(shared, tmp_path, cli_env):
    """40 targets make a state file of about 0.4 MiB rewritten every evaluation; SIGKILL at random
    moments, and (every other round) as soon as a save's temp file appears, i.e. mid-write: the
    state file always loads (old or new, never torn)."""
    body = shared("fixtures", "prom", CAPTURE).read_bytes()
    rng = random.Random(8)
    state = tmp_path / "state"
    with loopback.Site(many_metrics(body)) as site:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 0.2s, timeout: 0.2s}\nevaluation: {interval: 0.2s, window: 60s}\n"
                       f"state_dir: {state}\ntargets:\n" + "".join(f"  - url: {site.url}/t{i}\n" for i in range(40)))
        sizes, mid_write, saved_at = [], 0, []
        for round_ in range(12):
            d = Launched(cfg, cli_env, tmp_path, save_every=0.0)
            try:
                d.wait_ready()
                time.sleep(rng.uniform(0.3, 2.0))
                if round_ % 2:     # aim: kill the moment a save's temp file exists (mid-write)
                    end = time.monotonic() + 5
                    while time.monotonic() < end and not any(n.endswith(".tmp") for n in os.listdir(state)):
                        time.sleep(0.0005)
            finally:
                d.kill9()
            leftovers = [p for p in state.iterdir() if p.name.endswith(".tmp")]
            mid_write += bool(leftovers)
            store = StateStore(state)
            doc = store.load()
            assert store.errors == {}, (round_, store.errors)
            assert doc is not None and isinstance(doc.get("windows"), dict) and doc["windows"], round_
            raw = json.loads((state / STATE_FILE).read_bytes())
            saved_at.append(raw["saved_at"])
            sizes.append((state / STATE_FILE).stat().st_size)
            assert not [p for p in state.iterdir() if ".corrupt-" in p.name]
        # each run saved something newer than the last (the file moved on between kills)
        assert saved_at == sorted(saved_at) and len(set(saved_at)) == len(saved_at)
        print(f"\nstate file {min(sizes) / 2**20:.2f}-{max(sizes) / 2**20:.2f} MiB; "
              f"{mid_write}/12 kills left a half-written temp file behind")
        assert mid_write >= 2, "no kill landed inside a save: the test did not test what it says"
        # a restarted daemon clears what a killed write left behind
        (state / ".drift-state.json.killed.tmp").write_bytes(b'{"format": "vllm-drift-state", "ver')
        left = {p.name for p in state.iterdir() if p.name.endswith(".tmp")}
        d = Launched(cfg, cli_env, tmp_path, save_every=0.0)
        try:
            d.wait_ready()
            assert not left & {p.name for p in state.iterdir()}, left
        finally:
            assert d.stop() == 0


def active(doc: dict, url: str) -> dict[str, float]:
    t = doc[url]
    return {f["finding"]: f["since"] for f in t["findings"] if f["severity"] in ("warning", "critical")}


def test_kill9_mid_run_resumes_windows_and_findings(tmp_path, cli_env):
    """A daemon watching a kv-pressure simulator is SIGKILLed once the finding is active; the next
    one reports the same finding (same `since`) at its first evaluation, long before a fresh
    window could have filled, with the old window's samples."""
    window = 20.0
    sim = Simulator(cli_env, "--scenario", "kv-pressure", "--speed", "20", "--seed", "1")
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 0.5s, timeout: 0.5s}\nevaluation: {interval: 1s, window: 20s}\n"
                       f"state_dir: {tmp_path / 'state'}\ntargets:\n  - url: {sim.url}\n    gpu: L4\n")
        d1 = Launched(cfg, cli_env, tmp_path, save_every=1.0)
        try:
            d1.wait_ready()
            # kv_pressure is active from the first evaluations (an instant finding); wait for a
            # window that also judges rates, so the saved one is worth restoring
            first = wait_for(lambda: (lambda doc: active(doc, sim.url) if "kv_pressure" in active(doc, sim.url)
                                      and doc[sim.url]["status"] == "ok" else None)(d1.findings()), 60)
            time.sleep(1.5)       # at least one save after the finding went active
        finally:
            d1.kill9()
        t_restart = time.monotonic()
        d2 = Launched(cfg, cli_env, tmp_path, save_every=1.0)
        try:
            d2.wait_ready()
            after = d2.findings()[sim.url]
            took = time.monotonic() - t_restart
            assert took < window / 2, took                    # sooner than a new window could judge
            assert after["status"] == "ok", after["findings"]
            assert active(d2.findings(), sim.url).get("kv_pressure") == first["kv_pressure"]
            # the window covers more time than this daemon has been up: it is the restored one
            # (saved windows are thinned, so it holds fewer samples than before the kill)
            assert after["observed"]["window_seconds"] > took + 2, (after["observed"]["window_seconds"], took)
            assert after["observed"]["window_seconds"] >= 0.5 * window
            body = d2.metrics()
            assert f'vllm_drift_finding{{finding="kv_pressure",model_name="{after["model_name"]}"' in body or \
                any('finding="kv_pressure"' in k for k in samples(body, "vllm_drift_finding"))
            assert not samples(body, "vllm_drift_state_errors_total")
        finally:
            assert d2.stop() == 0
    finally:
        sim.stop()


def delayed(body: bytes, seconds: float) -> loopback.Handler:
    """Answers /metrics correctly, but only after `seconds` (a slow, healthy server)."""
    import asyncio

    async def handle(reader, writer, path):
        if path == "/metrics":
            await asyncio.sleep(seconds)
        writer.write(loopback.response(body if path == "/metrics" else b"{}"))
    return handle


def test_sigterm_drains_and_exits_in_bound_with_hanging_targets(shared, tmp_path, cli_env):
    """SIGTERM while a cycle is in flight: a slow but healthy target's scrape completes (its
    window is in the saved state), hanging targets are cut at the scrape deadline, nothing is
    cancelled, and the process exits 0 within the scrape timeout plus a small margin."""
    body = shared("fixtures", "prom", CAPTURE).read_bytes()
    timeout, slow_s = 3.0, 1.5
    with loopback.Site(loopback.hang()) as h1, loopback.Site(loopback.headers_then_stall()) as h2, \
            loopback.Site(delayed(body, slow_s)) as slow:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"scrape: {{interval: 30s, timeout: {timeout}s}}\nevaluation: {{interval: 30s, window: 60s}}\n"
                       f"state_dir: {tmp_path / 'state'}\ntargets:\n"
                       f"  - url: {slow.url}\n  - url: {h1.url}\n  - url: {h2.url}\n")
        d = Serve(cfg, cli_env, tmp_path)
        try:
            # the first cycle starts at once: wait until every target has its request open
            wait_for(lambda: "/metrics" in slow.requests and h1.requests and h2.requests, timeout=30, step=0.02)
            t = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            rc = d.proc.wait(timeout + 10)
            took = time.monotonic() - t
        finally:
            if d.proc.poll() is None:
                d.proc.kill()
        log = d.log()
        assert rc == 0, log[-2000:]
        assert took < timeout + 3.0, took
        assert '"event": "stopped"' in log
        assert "CancelledError" not in log and "raised an exception" not in log, log[-2000:]
        doc = StateStore(tmp_path / "state").load()
        assert doc is not None and any(k.startswith(slow.url + "|") for k in doc["windows"]), doc and list(doc["windows"])
        print(f"\nSIGTERM with a cycle in flight: exit 0 after {took:.2f} s (scrape timeout {timeout:g} s)")


@pytest.mark.parametrize("content", [b'{"format": "vllm-drift-state", "version": 1, "state": ',
                                     b"\x00\xff garbage", b'{"format": "vllm-drift-state", "version": 99, "state": {}}',
                                     b'{"format": "vllm-drift-state", "version": 1, "state": {"evaluator": 5}}',
                                     b"[" * 100_000])
def test_corrupt_state_file_is_set_aside_and_reported(content, shared, tmp_path, cli_env):
    body = shared("fixtures", "prom", CAPTURE).read_bytes()
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_bytes(content)
    with loopback.Site(loopback.static({"/metrics": body})) as site:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 1s, window: 60s}\n"
                       f"state_dir: {state}\ntargets:\n  - url: http://127.0.0.1:{site.port}\n")
        d = Serve(cfg, cli_env, tmp_path)
        try:
            d.wait_ready()
            body_ = d.metrics()
            assert samples(body_, "vllm_drift_state_errors_total").get('{operation="load"}', 0) >= 1, body_[-500:]
            assert samples(body_, "vllm_drift_target_up")[f'{{target="{site.url}"}}'] == 1.0
        finally:
            assert d.stop() == 0
    log = d.log()
    assert "state file problem" in log
    aside = [p for p in state.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert json.loads((state / STATE_FILE).read_bytes())["format"] == "vllm-drift-state"   # saved anew


def test_window_of_a_target_down_at_restart_is_kept(shared, tmp_path, cli_env):
    """A daemon restarted while a target is down (a node reboot takes both) saves its state
    several times before that target comes back: the target's restored window must survive
    those saves instead of being dropped from the file."""
    body = shared("fixtures", "prom", CAPTURE).read_bytes()
    state = tmp_path / "state"
    site = loopback.Site(loopback.static({"/metrics": body}))
    site.__enter__()
    url = site.url
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scrape: {interval: 0.5s, timeout: 0.5s}\nevaluation: {interval: 0.5s, window: 600s}\n"
                   f"state_dir: {state}\ntargets:\n  - url: {url}\n")
    try:
        d = Launched(cfg, cli_env, tmp_path, save_every=0.0)
        d.wait_ready()
        time.sleep(1.5)
        assert d.stop() == 0
    finally:
        site.__exit__(None, None, None)
    saved = StateStore(state).load()["windows"]
    assert [k for k in saved if k.startswith(url + "|")]
    d = Launched(cfg, cli_env, tmp_path, save_every=0.0)       # the target is down now
    try:
        d.wait_ready()
        wait_for(lambda: samples(d.metrics(), "vllm_drift_scrape_errors_total").get(
            f'{{reason="connect",target="{url}"}}', 0) >= 3, 20)
    finally:
        assert d.stop() == 0
    again = StateStore(state).load()["windows"]
    assert set(again) == set(saved) and all(again[k] == saved[k] for k in saved)
