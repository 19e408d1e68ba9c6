"""Faults survived: a real `vllm-drift serve` subprocess next to misbehaving loopback targets.

Each test measures the daemon's own `/metrics` latency on a baseline (healthy targets only, or a
healthy store) and again while the fault is present, in the same test, and asserts the fault
does not move it beyond a generous bound (the outside check's 1 s). It also asserts the failure is
visible (`up` 0, `vllm_drift_scrape_errors_total{reason}`, a `down` status with the error in
`/api/v1/findings`), that healthy targets keep being scraped on time, and that the daemon's RSS
stays bounded. Every server is on 127.0.0.1 and every wait is bounded.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import loopback
from conftest import dead_url, free_port
from daemons import Serve, Simulator, samples, wait_cycles, wait_for

CAPTURE = "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"
V0_CAPTURE = "vllm-0.7.0-v0-aibrix-qwen2.5-coder-1.5b.partial.prom"
RSS_BOUND_MIB = 300          # the outside check's bound
LATENCY_BOUND_S = 1.0        # the outside check's bound


# ----------------------------------------------------------------------------- helpers
def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def assert_latency_held(base: list[float], fault: list[float]) -> None:
    """Relative to the baseline in the same test, with the outside check's absolute ceiling."""
    assert len(base) >= 10 and len(fault) >= 10
    assert max(fault) < LATENCY_BOUND_S, (max(fault), sorted(fault)[-5:])
    assert p90(fault) <= max(10 * p90(base), 0.25), (p90(base), p90(fault))


@pytest.fixture
def capture(shared):
    return shared("fixtures", "prom", CAPTURE).read_bytes()


def capture_site(body: bytes, version: bytes = b'{"version":"0.10.1"}') -> loopback.Site:
    return loopback.Site(loopback.static({"/metrics": body, "/version": version, "/v1/models": b'{"data":[]}'}))


# ----------------------------------------------------------------------------- hostile targets
def test_hostile_targets_do_not_slow_metrics_or_healthy_targets(capture, tmp_path, cli_env):
    interval, timeout = 2.0, 1.0
    healthy = [capture_site(capture) for _ in range(3)]
    ok = loopback.static({"/metrics": capture, "/version": b'{"version":"0.10.1"}', "/v1/models": b'{"data":[]}'})
    html_500 = loopback.status("500 Internal Server Error")
    bad_handlers = {
        "hang": (loopback.hang(), "timeout"),
        "headers_then_stall": (loopback.headers_then_stall(), "timeout"),
        "trickle": (loopback.trickle(capture, 0.05), "timeout"),
        "reset_mid_body": (loopback.reset_mid_body(capture[:20000]), "read"),
        "huge_100MiB": (loopback.huge(100 * 2**20), "body_too_large"),
        "huge_unannounced": (loopback.huge_unannounced(100 * 2**20), "body_too_large"),
        "gzip_bomb": (loopback.gzip_bomb_streamed(512 * 2**20), "body_too_large"),
        "html_200": (loopback.static({"/metrics": b"<html><body>Login</body></html>"}, ctype="text/html"), "parse"),
        "html_500": (html_500, "http_status"),
        "flapping": (loopback.flapping(ok, html_500), "http_status"),
    }
    bad = {k: loopback.Site(h) for k, (h, _) in bad_handlers.items()}
    refused = dead_url()                                # nothing listens there
    for s in healthy + list(bad.values()):
        s.__enter__()
    head = (f"scrape: {{interval: {interval}s, timeout: {timeout}s, max_body_bytes: 16MiB}}\n"
            "evaluation: {interval: 2s, window: 60s}\ntargets:\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(head + "".join(f"  - url: {s.url}\n" for s in healthy))
    d = Serve(cfg, cli_env, tmp_path)
    try:
        d.wait_ready()
        base = d.latencies(4)
        base_rss = max(d.rss(), 1.0)
        # the same daemon, now with every kind of bad target beside the healthy ones
        cfg.write_text(head + "".join(f"  - url: {u}\n" for u in [s.url for s in healthy] + [s.url for s in bad.values()]
                                      + [refused]))
        d.proc.send_signal(signal.SIGHUP)
        all_urls = [s.url for s in healthy] + [s.url for s in bad.values()] + [refused]
        wait_for(lambda: len(samples(d.metrics(), "vllm_drift_target_up")) == len(all_urls), timeout=20)
        cycles0 = samples(d.metrics(), "vllm_drift_scrape_cycles_total")[""]
        t0 = time.monotonic()
        fault = []
        seen_up: dict[str, set[float]] = {}
        stale = []
        for _ in range(6):                      # ~12 s: six scrape intervals under fire
            fault += d.latencies(1.6)
            body = d.metrics()
            now = time.time()
            for k, v in samples(body, "vllm_drift_target_up").items():
                seen_up.setdefault(k.split('"')[1], set()).add(v)
            last = samples(body, "vllm_drift_target_last_success_timestamp_seconds")
            for s in healthy:                   # healthy targets are scraped on time
                age = now - last[f'{{target="{s.url}"}}']
                if age > interval + timeout + 1.5:
                    stale.append((s.url, round(age, 2)))
        elapsed = time.monotonic() - t0
        body = d.metrics()
        cycles = samples(body, "vllm_drift_scrape_cycles_total")[""] - cycles0
        assert_latency_held(base, fault)
        assert not stale, stale
        # a cycle waits for its slowest target, which the total deadline bounds
        assert samples(body, "vllm_drift_scrape_cycle_duration_seconds")[""] < timeout + 1.0
        assert cycles >= 0.6 * elapsed / interval, (cycles, elapsed)
        up = samples(body, "vllm_drift_target_up")
        errs = samples(body, "vllm_drift_scrape_errors_total")
        for s in healthy:
            assert up[f'{{target="{s.url}"}}'] == 1.0 and seen_up[s.url] == {1.0}
        for kind, site in bad.items():
            reason = bad_handlers[kind][1]
            assert errs.get(f'{{reason="{reason}",target="{site.url}"}}', 0) >= 1, (kind, reason, errs)
            if kind == "flapping":
                assert seen_up[site.url] == {0.0, 1.0}, seen_up[site.url]
            else:
                assert up[f'{{target="{site.url}"}}'] == 0.0 and seen_up[site.url] == {0.0}, kind
        assert errs.get(f'{{reason="connect",target="{refused}"}}', 0) >= 1
        # the findings API says why it cannot judge a down target
        doc = d.findings()
        for url in [s.url for k, s in bad.items() if k != "flapping"] + [refused]:
            assert doc[url]["status"] == "down" and doc[url]["error"], doc[url]
            assert doc[url]["findings"] == []
        for s in healthy:
            assert doc[s.url]["status"] in ("ok", "insufficient_data") and doc[s.url]["observed"]
        # memory: a 100 MiB body and a 512 MiB gzip bomb every cycle cost at most the body cap
        assert d.peak_rss < RSS_BOUND_MIB, d.peak_rss
        assert d.peak_rss < base_rss + 150, (base_rss, d.peak_rss)
        print(f"\nfaults: /metrics p90 {p90(base)*1e3:.1f} -> {p90(fault)*1e3:.1f} ms (max {max(fault)*1e3:.0f} ms), "
              f"RSS {base_rss:.0f} -> peak {d.peak_rss:.0f} MiB, {cycles:.0f} cycles in {elapsed:.1f} s")
    finally:
        rc = d.stop()
        for s in healthy + list(bad.values()):
            s.__exit__(None, None, None)
    assert rc == 0, d.log()[-3000:]


# ----------------------------------------------------------------------------- restarts and redeploys
class Relay:
    """A loopback target that relays each request to the current upstream (a `vllm-drift simulate`
    process), so the test can swap the server behind one URL: a restart, an upgrade, a redeploy.
    The simulators run in their own processes, so their CPU never skews this process' timings."""

    def __init__(self) -> None:
        self.upstream: tuple[str, int] | None = None
        self.handler: loopback.Handler | None = None
        self.site = loopback.Site(self._handle)

    async def _handle(self, reader, writer, path):
        if self.handler is not None:
            return await self.handler(reader, writer, path)
        import asyncio
        host, port = self.upstream
        r, w = await asyncio.open_connection(host, port)
        try:
            w.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\n\r\n".encode())
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
            writer.write(head + await r.readexactly(length))
        finally:
            w.close()


def _nonnegative_rates(report: dict) -> list[tuple[str, float]]:
    return [(k, v) for k, v in report.get("observed", {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0]


def test_restart_upgrade_and_redeploy_keep_the_target_up(tmp_path, cli_env, shared):
    """A counter reset restarts the window (never a negative rate), a new /version and era are
    picked up, a changed cache_config_info is reported as a config change; `up` stays 1."""
    import yaml
    from exporter.sim.scenario import SCENARIO_DIR

    # the redeployed server: the scenario's redeploy phase (gpu_memory_utilization 0.9 -> 0.75)
    # in force from the start, on vLLM 0.11.0 instead of 0.10.1
    doc = yaml.safe_load((SCENARIO_DIR / "redeploy-regression.yaml").read_text())
    doc["vllm"]["gpu_memory_utilization"] = 0.75
    doc.pop("phases", None)
    redeployed = tmp_path / "redeployed.yaml"
    redeployed.write_text(yaml.safe_dump(doc))
    old = Simulator(cli_env, "--scenario", "redeploy-regression", "--vllm-version", "0.10.1", "--speed", "10",
                    "--seed", "3")
    new = relay = d = None
    try:
        relay = Relay()
        relay.upstream = old.address
        relay.site.__enter__()
        url = relay.site.url
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 0.5s, timeout: 0.5s}\nevaluation: {interval: 1s, window: 8s}\n"
                       f"targets:\n  - url: {url}\n    gpu: L4\n")
        d = Serve(cfg, cli_env, tmp_path)
        key = f'{{target="{url}"}}'
        d.wait_ready()
        before = wait_for(lambda: (lambda r: r if r.get("status") == "ok" else None)(d.findings()[url]), 30)
        samples_before = before["observed"]["window_samples"]
        assert samples_before >= 3
        info = samples(d.metrics(), "vllm_drift_target_info")
        assert any('vllm_version="0.10.1"' in k for k in info), info
        base = d.latencies(2)

        # restart + upgrade + redeploy behind the same URL
        new = Simulator(cli_env, "--scenario", str(redeployed), "--vllm-version", "0.11.0", "--speed", "10",
                        "--seed", "4")
        relay.upstream = new.address
        ups, reports, lat = [], [], []
        end = time.monotonic() + 10
        while time.monotonic() < end:
            lat += d.latencies(0.3, gap=0.05)
            ups.append(samples(d.metrics(), "vllm_drift_target_up")[key])
            reports.append(d.findings()[url])
        assert ups and set(ups) == {1.0}, ups                    # a restart is not an outage
        assert_latency_held(base, lat)
        info = samples(d.metrics(), "vllm_drift_target_info")
        assert any('vllm_version="0.11.0"' in k for k in info), info
        notes = [n for r in reports for n in r.get("notes", [])]
        assert any("config change" in n and "gpu_memory_utilization" in n for n in notes), notes[-5:]
        # the window restarted at the reset: fewer samples than before, and it says why
        assert min(r["observed"]["window_samples"] for r in reports) < samples_before
        explanations = [f.get("explanation") or "" for r in reports for f in r["findings"]]
        explanations += [st.get("reason") or "" for r in reports for st in (r.get("finding_status") or {}).values()]
        assert any("counter reset" in e for e in explanations), explanations[-3:]
        negative = [x for r in reports for x in _nonnegative_rates(r)]
        assert not negative, negative

        # an older engine era behind the same URL (a rollback to a V0 build)
        v0 = shared("fixtures", "prom", V0_CAPTURE).read_bytes()
        relay.handler = loopback.static({"/metrics": v0, "/version": b'{"version":"0.7.0"}',
                                         "/v1/models": b'{"data":[]}'})
        got = wait_for(lambda: [k for k in samples(d.metrics(), "vllm_drift_target_info")
                                if 'engine_era="v0"' in k and 'vllm_version="0.7.0"' in k], 20)
        assert got and samples(d.metrics(), "vllm_drift_target_up")[key] == 1.0
    finally:
        rc = d.stop() if d else 0
        for p in (old, new):
            if p:
                p.stop()
        if relay:
            relay.site.__exit__(None, None, None)
    assert rc == 0, d.log()[-3000:]


# ----------------------------------------------------------------------------- query mode
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary (Debian package `prometheus`)")
def test_slow_prometheus_in_query_mode(capture, tmp_path, cli_env):
    """The store stops answering (SIGSTOP: connections are accepted, nothing comes back): the
    daemon counts query_timeout, keeps the last state and serves /metrics as fast as before;
    after SIGCONT it recovers."""
    from daemons import Prometheus

    sites = [capture_site(capture) for _ in range(2)]
    for s in sites:
        s.__enter__()
    prom = Prometheus(tmp_path, [s.url for s in sites])
    d = None
    try:
        wait_for(lambda: len(prom.up()) == 2 and set(prom.up().values()) == {1.0}, timeout=60)
        cfg = tmp_path / "q.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 30s}\n"
                       f"prometheus: {{url: '{prom.url}', timeout: 1s}}\n")
        d = Serve(cfg, cli_env, tmp_path)
        d.wait_ready()
        base = d.latencies(3)
        prom.proc.send_signal(signal.SIGSTOP)
        try:
            def timeouts():
                errs = samples(d.metrics(), "vllm_drift_scrape_errors_total")
                return sum(v for k, v in errs.items() if 'reason="query_timeout"' in k)
            wait_for(lambda: timeouts() >= 2, timeout=30)
            slow = d.latencies(5)
            body = d.metrics()
            up = samples(body, "vllm_drift_target_up")
            assert all(up[f'{{target="{s.url}"}}'] == 1.0 for s in sites), up   # the last state is kept
            doc = d.findings()
            assert all(doc[s.url]["observed"] for s in sites)
        finally:
            prom.proc.send_signal(signal.SIGCONT)
        assert_latency_held(base, slow)
        n = sum(v for k, v in samples(d.metrics(), "vllm_drift_scrape_errors_total").items() if "query_" in k)
        body = wait_cycles(d.metrics, 4)     # after SIGCONT, cycles complete without new store errors
        assert sum(v for k, v in samples(body, "vllm_drift_scrape_errors_total").items() if "query_" in k) <= n + 2
        assert d.peak_rss < RSS_BOUND_MIB
    finally:
        rc = d.stop() if d else 0
        prom.stop()
        for s in sites:
            s.__exit__(None, None, None)
    assert rc == 0, d.log()[-3000:]


# ----------------------------------------------------------------------------- state directory
def _state_case(kind: str, root: Path) -> tuple[Path, list[str] | None, str]:
    """(state_dir, command wrapper, shell prefix) for a state directory that cannot be written.

    - not_a_dir: the state dir's parent is a regular file (works for any user).
    - read_only: a 0555 directory, daemon run as uid/gid 65534 with `setpriv` (root would ignore
      the permission bits).
    - full: a 64 KiB tmpfs, filled up, mounted in a private mount namespace (`unshare -m`) that only
      the daemon sees; it already holds a good state file that must survive the failed saves.
    """
    if kind == "not_a_dir":
        (root / "plainfile").write_text("x")
        return root / "plainfile" / "state", None, ""
    if kind == "read_only":
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv not available to drop root")
        state = root / "state"
        state.mkdir()
        state.chmod(0o555)
        if os.geteuid() != 0:
            return state, None, ""
        return state, ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"], ""
    if kind == "full":
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("needs root and unshare to mount a small tmpfs")
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {root}"],
                               capture_output=True, timeout=10)
        if probe.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
        state = root / "state"
        state.mkdir()
        good = json.dumps({"format": "vllm-drift-state", "version": 1, "saved_at": 1.0,
                           "state": {"evaluator": {}, "windows": {}}})
        # inside the namespace: mount, put the old state file, fill the rest, then run the daemon
        prefix = (f"mount -t tmpfs -o size=64k tmpfs {state} && printf '%s' '{good}' > {state}/drift-state.json && "
                  f"(dd if=/dev/zero of={state}/filler bs=4k 2>/dev/null; true) && exec ")
        return state, ["unshare", "-m"], prefix
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["not_a_dir", "read_only", "full"])
def test_unwritable_state_dir_is_counted_not_fatal(kind, capture, cli_env):
    root = Path(tempfile.mkdtemp(prefix="vllm-drift-state-"))
    root.chmod(0o755)           # readable by the unprivileged daemon of the read_only case
    site = capture_site(capture)
    site.__enter__()
    d = None
    try:
        state, wrap, prefix = _state_case(kind, root)
        cfg = root / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 1s, window: 30s}\n"
                       f"state_dir: {state}\ntargets:\n  - url: {site.url}\n")
        cfg.chmod(0o644)
        logs = root / "logs"
        logs.mkdir()
        d = Serve(cfg, cli_env, logs, wrap=wrap, shell_prefix=prefix)
        d.wait_ready()
        base = d.latencies(2)
        wait_for(lambda: samples(d.metrics(), "vllm_drift_state_errors_total").get('{operation="save"}', 0) >= 2, 20)
        during = d.latencies(3)
        assert_latency_held(base, during)
        assert samples(d.metrics(), "vllm_drift_target_up")[f'{{target="{site.url}"}}'] == 1.0
        assert d.proc.poll() is None
        rc = d.stop()
        assert rc == 0, d.log()[-2000:]         # the final save fails too, and that is not fatal
        log = d.log()
        assert "state file problem" in log and '"operation": "save"' in log
        if kind == "read_only" and os.geteuid() == 0:
            assert not any(state.iterdir())     # really nothing written
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop()
        site.__exit__(None, None, None)
        shutil.rmtree(root, ignore_errors=True)


def test_full_state_fs_keeps_the_old_state(capture, cli_env):
    """On a full filesystem the atomic save fails before the rename: the old file is intact.
    Checked from inside the daemon's mount namespace by the daemon's own loader at restart."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a small tmpfs")
    root = Path(tempfile.mkdtemp(prefix="vllm-drift-full-"))
    site = capture_site(capture)
    site.__enter__()
    try:
        state = root / "state"
        state.mkdir()
        script = root / "run.sh"
        cfg = root / "c.yaml"
        cfg.write_text("scrape: {interval: 0.5s, timeout: 0.5s}\nevaluation: {interval: 0.5s, window: 30s}\n"
                       f"state_dir: {state}\ntargets:\n  - url: {site.url}\n")
        port = free_port()
        serve = f"{sys.executable} -m exporter serve --config {cfg} --listen 127.0.0.1:{port}"
        # 1) a run with room writes a good state; 2) fill the fs, a second run fails its saves;
        # 3) the file on disk is still the first run's, byte for byte
        script.write_text(f"""set -e
mount -t tmpfs -o size=256k tmpfs {state}
timeout -s TERM 6 {serve} 2>{root}/run1.log || true
cp {state}/drift-state.json {root}/after-run1.json
dd if=/dev/zero of={state}/filler bs=4k 2>/dev/null || true
timeout -s TERM 5 {serve} 2>{root}/run2.log || true
cp {state}/drift-state.json {root}/after-run2.json
""")
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {root}/state"],
                               capture_output=True, timeout=10)
        if probe.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
        out = subprocess.run(["unshare", "-m", "sh", str(script)], capture_output=True, timeout=60, env=cli_env)
        assert out.returncode == 0, out.stderr.decode()
        first = (root / "after-run1.json").read_bytes()
        doc = json.loads(first)
        assert doc["format"] == "vllm-drift-state" and doc["state"]["windows"], doc.keys()
        run2 = (root / "run2.log").read_text()
        assert "state file problem" in run2 and "No space left" in run2, run2[-2000:]
        assert (root / "after-run2.json").read_bytes() == first
    finally:
        site.__exit__(None, None, None)
        shutil.rmtree(root, ignore_errors=True)


def test_hostile_metadata_endpoints(capture, tmp_path, cli_env):
    """/version and /v1/models are read too: deeply nested JSON (a RecursionError in the JSON
    decoder), a huge body and HTML must leave the target up with its metadata unknown, and the
    scrape cycle of everyone else intact."""
    deep = b"[" * 500_000                     # under the 1 MiB cap of /v1/models
    kinds = {
        "deep_json": loopback.static({"/metrics": capture, "/version": b'{"version":' + b"[" * 60_000,
                                      "/v1/models": deep}),
        "huge_json": loopback.static({"/metrics": capture, "/version": b'{"version":"' + b"9" * 200_000 + b'"}',
                                      "/v1/models": b'{"data":[' + b'{"id":"m"},' * 200_000 + b'{"id":"m"}]}'}),
        "html": loopback.static({"/metrics": capture, "/version": b"<html>no</html>", "/v1/models": b"<html>no</html>"}),
    }
    sites = {k: loopback.Site(h) for k, h in kinds.items()}
    healthy = capture_site(capture)
    for s in [healthy, *sites.values()]:
        s.__enter__()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 1s, window: 60s}\ntargets:\n" +
                   "".join(f"  - url: {s.url}\n" for s in [healthy, *sites.values()]))
    d = Serve(cfg, cli_env, tmp_path)
    try:
        d.wait_ready()
        body = wait_cycles(d.metrics, 2)         # cycles complete
        up = samples(body, "vllm_drift_target_up")
        for s in [healthy, *sites.values()]:
            assert up[f'{{target="{s.url}"}}'] == 1.0, s.url
        info = samples(body, "vllm_drift_target_info")
        assert any(f'target="{healthy.url}"' in k and 'vllm_version="0.10.1"' in k for k in info)
        for s in sites.values():                 # the version is unknown, not garbage
            row = [k for k in info if f'target="{s.url}"' in k]
            assert row and 'vllm_version="unknown"' in row[0], row
        assert d.proc.poll() is None
    finally:
        rc = d.stop()
        for s in [healthy, *sites.values()]:
            s.__exit__(None, None, None)
    log = d.log()
    assert rc == 0 and "RecursionError" not in log and "raised an exception" not in log, log[-3000:]


def test_a_target_with_thousands_of_models_is_refused(capture, tmp_path, cli_env):
    """One exposition naming 20,000 distinct model_name values (2.3 MiB, well under the body
    cap) would mean 20,000 windows, evaluations and label sets. A vLLM server serves one model
    (a handful with several engines), so such a target is refused as bad input: down, counted
    under `parse`, and none of its series reach our exposition."""
    n = 20_000
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1' for i in range(n)]
    lines += ["# TYPE vllm:kv_cache_usage_perc gauge"]
    lines += [f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i}"}} 0.5' for i in range(n)]
    many = loopback.Site(loopback.static({"/metrics": ("\n".join(lines) + "\n").encode()}))
    healthy = capture_site(capture)
    for s in (healthy, many):
        s.__enter__()
    cfg = tmp_path / "c.yaml"
    head = "scrape: {interval: 2s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\ntargets:\n"
    cfg.write_text(head + f"  - url: {healthy.url}\n")
    d = Serve(cfg, cli_env, tmp_path)
    try:
        d.wait_ready()
        base = d.latencies(3)
        base_rss = d.rss()
        cfg.write_text(head + f"  - url: {healthy.url}\n  - url: {many.url}\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: f'target="{many.url}"' in d.metrics(), timeout=30)
        during = d.latencies(8)
        body = d.metrics()
        assert_latency_held(base, during)
        up = samples(body, "vllm_drift_target_up")
        assert up[f'{{target="{healthy.url}"}}'] == 1.0 and up[f'{{target="{many.url}"}}'] == 0.0
        assert samples(body, "vllm_drift_scrape_errors_total").get(f'{{reason="parse",target="{many.url}"}}', 0) >= 1
        assert body.count(f'target="{many.url}"') < 20, body.count(f'target="{many.url}"')
        assert "models" in d.findings()[many.url]["error"]
        assert d.peak_rss < base_rss + 100, (base_rss, d.peak_rss)
    finally:
        rc = d.stop()
        for s in (healthy, many):
            s.__exit__(None, None, None)
    assert rc == 0
