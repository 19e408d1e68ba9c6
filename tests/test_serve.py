"""`vllm-drift serve` as a real subprocess against real captures served over loopback HTTP."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import loopback
from daemons import Daemon, get, samples, wait_cycles, wait_for

VERSION = {"vllm-0.10.1": b'{"version":"0.10.1"}', "vllm-0.11.0": b'{"version":"0.11.0"}', "vllm-0.7.0": b'{"version":"0.7.0"}'}


@pytest.fixture
def fleet(captures):
    """One loopback server per real capture (mixed eras), plus one that answers 500."""
    sites = []
    try:
        for name, body in captures.items():
            version = next((v for k, v in VERSION.items() if name.startswith(k)), b'{"version":"unknown"}')
            site = loopback.Site(loopback.static({"/metrics": body, "/version": version,
                                                   "/v1/models": b'{"data":[]}'}))
            site.__enter__()
            site.capture = name
            sites.append(site)
        bad = loopback.Site(loopback.status("500 Internal Server Error"))
        bad.__enter__()
        bad.capture = None
        sites.append(bad)
        yield sites
    finally:
        for s in sites:
            s.__exit__(None, None, None)


def test_serve_mixed_era_fleet(fleet, tmp_path, cli_env):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\ntargets:\n" +
                   "".join(f"  - url: {s.url}\n" for s in fleet))
    d = Daemon(cfg, cli_env)
    try:
        def all_scraped():
            text = d.metrics()
            return text if len(samples(text, "vllm_drift_target_up")) == len(fleet) else None
        body = wait_for(all_scraped)
        up = samples(body, "vllm_drift_target_up")
        for s in fleet:
            assert up[f'{{target="{s.url}"}}'] == (0.0 if s.capture is None else 1.0), s.capture
        durations = samples(body, "vllm_drift_target_scrape_duration_seconds")
        assert all(0 < v < 1 for v in durations.values()) and len(durations) == len(fleet)
        bad = fleet[-1].url
        errs = samples(body, "vllm_drift_scrape_errors_total")
        assert errs[f'{{reason="http_status",target="{bad}"}}'] >= 1
        info = samples(body, "vllm_drift_target_info")
        assert any('vllm_version="0.10.1"' in k and 'engine_era="v1"' in k for k in info)
        assert any('engine_era="v0"' in k for k in info)
        # ready once the first evaluation finished, and findings list every target
        wait_for(lambda: get(d.url + "/-/ready")[0] == 200)
        doc = json.loads(get(d.url + "/api/v1/findings")[1])
        by_target = {t["target"]: t for t in doc["targets"]}
        assert set(by_target) == {s.url for s in fleet}
        good = next(s for s in fleet if s.capture and s.capture.startswith("vllm-0.10.1"))
        t = by_target[good.url]
        assert t["observed"]["num_gpu_blocks"] == 850 and isinstance(t["findings"], list)
        assert by_target[bad]["status"] == "down"
        assert get(d.url + "/-/healthy")[0] == 200 and "/api/v1/findings" in get(d.url + "/")[1]
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=d.metrics(), capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
    finally:
        log = d.stop()
    assert d.proc.returncode == 0, log[-2000:]
    assert '"event": "listening"' in log


def test_bad_config_reload_keeps_the_old_one(fleet, tmp_path, cli_env):
    cfg = tmp_path / "c.yaml"
    good = fleet[0]
    cfg.write_text(f"scrape: {{interval: 1s, timeout: 1s}}\nevaluation: {{interval: 2s, window: 60s}}\ntargets:\n  - url: {good.url}\n")
    d = Daemon(cfg, cli_env)
    try:
        wait_for(lambda: samples(d.metrics(), "vllm_drift_target_up").get(f'{{target="{good.url}"}}') == 1.0)
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\ntargets:\n  - url: not-a-url\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: samples(d.metrics(), "vllm_drift_config_reload_failures_total").get("") == 1.0)
        body = wait_cycles(d.metrics, 2)      # scraping goes on under the old config
        assert samples(body, "vllm_drift_target_up").get(f'{{target="{good.url}"}}') == 1.0
        # a valid change is picked up from the file without a signal
        other = fleet[1]
        cfg.write_text(f"scrape: {{interval: 1s, timeout: 1s}}\ntargets:\n  - url: {good.url}\n  - url: {other.url}\n")
        os.utime(cfg, (time.time() + 3, time.time() + 3))
        wait_for(lambda: f'{{target="{other.url}"}}' in samples(d.metrics(), "vllm_drift_target_up"))
        assert samples(d.metrics(), "vllm_drift_config_reloads_total")[""] >= 1
    finally:
        log = d.stop()
    assert "config reload failed" in log and "targets[0].url: not a URL" in log


def test_serve_bad_config_exits_2(tmp_path, cli_env):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s, bogus: 1}\n")
    out = subprocess.run([sys.executable, "-m", "exporter", "serve", "--config", str(cfg)], capture_output=True,
                         text=True, env=cli_env, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "scrape.bogus: unknown key" in out.stderr and str(cfg) in out.stderr


def test_each_kind_of_bad_target_is_down_with_its_reason(captures, tmp_path, cli_env):
    good = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    router = (b'# TYPE vllm:num_requests_running gauge\n'
              b'vllm:num_requests_running{server="http://10.0.0.1:8000"} 1\n'
              b'# TYPE vllm:current_qps gauge\nvllm:current_qps{server="http://10.0.0.1:8000"} 2\n')
    kinds = {
        "not_vllm": loopback.static({"/metrics": b"# TYPE node_load1 gauge\nnode_load1 0.5\n"}),
        "parse": loopback.static({"/metrics": b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m" 1\n'}),
        "http_status": loopback.status("503 Service Unavailable"),
        "timeout": loopback.hang(),
        "body_too_large": loopback.huge(8 * 2**20),
        "router": loopback.static({"/metrics": router}),
    }
    html_page = loopback.static({"/metrics": b"<html><body><h1>Welcome to nginx!</h1></body></html>"}, ctype="text/html")
    sites = {k: loopback.Site(h) for k, h in kinds.items()}
    sites["html"] = loopback.Site(html_page)
    sites["good"] = loopback.Site(loopback.static({"/metrics": good}))
    for s in sites.values():
        s.__enter__()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s, max_body_bytes: 1MiB}\nevaluation: {interval: 2s, window: 60s}\n"
                   "targets:\n" + "".join(f"  - url: {s.url}\n" for s in sites.values()))
    d = Daemon(cfg, cli_env)
    try:
        def settled():
            text = d.metrics()
            return text if len(samples(text, "vllm_drift_target_up")) == len(sites) else None
        wait_for(settled)
        body = wait_cycles(d.metrics, 1)
        up = samples(body, "vllm_drift_target_up")
        errs = samples(body, "vllm_drift_scrape_errors_total")
        for kind, site in sites.items():
            assert up[f'{{target="{site.url}"}}'] == (1.0 if kind == "good" else 0.0), kind
            if kind in kinds:
                assert errs.get(f'{{reason="{kind}",target="{site.url}"}}', 0) >= 1, (kind, errs)
        assert any(f'target="{sites["html"].url}"' in k for k in errs)
        targets = json.loads(get(d.url + "/api/v1/targets")[1])["targets"]
        by = {t["target"]: t for t in targets}
        assert "production-stack router" in by[sites["router"].url]["last_error"] or "router" in by[sites["router"].url]["last_error"]
        assert by[sites["good"].url]["last_error"] is None
    finally:
        d.stop()
        for s in sites.values():
            s.__exit__(None, None, None)


def test_large_buffers_come_from_mmap_unless_the_operator_chose(monkeypatch):
    """On glibc the daemon asks for scraped bodies to be mmap'd (freed back to the system)."""
    import platform

    from exporter.commands.serve import large_buffers_from_mmap
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert large_buffers_from_mmap() is False             # the operator's setting stays
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert large_buffers_from_mmap() is True


def test_the_open_file_limit_is_raised_to_the_hard_one():
    """One kept-alive socket per target: the daemon takes all the open files it is allowed."""
    resource = pytest.importorskip("resource")
    from exporter.commands.serve import raise_open_files_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft == hard and hard > 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))     # a lowered soft limit
    got = raise_open_files_limit()
    assert got is not None and got[0] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if hard != resource.RLIM_INFINITY:
        assert got == (hard, hard)
