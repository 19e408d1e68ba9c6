"""Query mode against a real Prometheus (the Debian `prometheus` binary) scraping loopback vLLM
targets: the daemon reading the store reports what the daemon scraping the targets reports;
a failing store is counted by reason and the last state kept; a target the store sees down is
reported down."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

import loopback
from conftest import dead_url, shared_path
from daemons import PROMETHEUS, Daemon, Prometheus, get, samples, wait_evaluations, wait_for

from exporter.config import PrometheusConfig
from exporter.parse.canonical import parse_vllm
from exporter.query.client import PromAPI, QueryError
from exporter.query.reader import PrometheusReader

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary (Debian package `prometheus`)")

VERSION = {"vllm-0.10.1": b'{"version":"0.10.1"}', "vllm-0.11.0": b'{"version":"0.11.0"}',
           "vllm-0.7.0": b'{"version":"0.7.0"}'}
MODELS = b'{"object":"list","data":[{"id":"m","object":"model","max_model_len":8192}]}'


def _serve_captures(captures: dict[str, bytes]):
    sites = []
    try:
        for name, body in captures.items():
            version = next((v for k, v in VERSION.items() if name.startswith(k)), b'{"version":"unknown"}')
            site = loopback.Site(loopback.static({"/metrics": body, "/version": version, "/v1/models": MODELS}))
            site.__enter__()
            site.capture, site.body = name, body
            sites.append(site)
        yield sites
    finally:
        for s in sites:
            if not getattr(s, "closed", False):
                s.__exit__(None, None, None)


def _store(tmp, sites):
    prom = Prometheus(tmp, [s.url for s in sites])
    try:
        wait_for(lambda: len(prom.up()) == len(sites) and all(v == 1 for v in prom.up().values()), timeout=60)
        yield prom
    finally:
        prom.stop()


@pytest.fixture
def fleet(captures):
    """Loopback targets serving the real captures (a test may stop one)."""
    yield from _serve_captures(captures)


@pytest.fixture
def prometheus(tmp_path, fleet):
    """A Prometheus of the test's own (a test may stop it)."""
    yield from _store(tmp_path, fleet)


@pytest.fixture(scope="module")
def shared_fleet():
    """The same targets, shared by the reader tests (a Prometheus start costs seconds)."""
    folder = shared_path("fixtures", "prom")
    yield from _serve_captures({p.name: p.read_bytes() for p in sorted(folder.glob("*.prom"))})


@pytest.fixture(scope="module")
def shared_prometheus(tmp_path_factory, shared_fleet):
    yield from _store(tmp_path_factory.mktemp("prometheus"), shared_fleet)


def by_target(daemon: Daemon) -> dict:
    return {t["target"]: t for t in json.loads(get(daemon.url + "/api/v1/findings")[1])["targets"]}


@pytest.mark.parametrize("federate", [False, True], ids=["query-api", "federate"])
def test_reader_rebuilds_the_same_snapshots_as_parsing_the_capture(shared_fleet, shared_prometheus, federate):
    fleet, prometheus = shared_fleet, shared_prometheus
    async def main():
        reader = PrometheusReader(PrometheusConfig(url=prometheus.url, federate=federate))
        try:
            assert await reader.refresh()
            assert sorted(t.url for t in reader.targets()) == sorted(s.url for s in fleet)
            for site in fleet:
                spec = next(t for t in reader.targets() if t.url == site.url)
                got = await reader.read(spec, time.time())
                want = parse_vllm(site.body, target=site.url, timestamp=0.0)
                assert len(got) == len(want), site.capture
                for a, b in zip(sorted(got, key=lambda s: s.model_name), sorted(want, key=lambda s: s.model_name)):
                    for field in ("model_name", "engine_era", "engines", "gauges", "counters", "finished_by_reason",
                                  "histograms", "cache_config", "spec_accepted_per_pos", "start_time", "families",
                                  "version_guess"):
                        assert getattr(a, field) == getattr(b, field), (site.capture, field)
                    assert abs(a.timestamp - time.time()) < 10     # Prometheus' scrape time, not ours
                for _ in range(50):      # Prometheus scrapes every second: wait for a few scrapes
                    history = await reader.history(spec, time.time() - 5, time.time(), 0.5)
                    stamps = [snaps[0].timestamp for snaps in history]
                    if len(stamps) >= 3:
                        break
                    await asyncio.sleep(0.2)
                # one snapshot per scrape, oldest first, though the steps are twice as dense
                assert len(stamps) >= 3 and stamps == sorted(set(stamps))
                assert all(1.5 > b - a > 0.5 for a, b in zip(stamps, stamps[1:]))
            # reads issued together share one batched query; each still gets only its own series
            specs = reader.targets()
            together = await asyncio.gather(*(reader.read(t, time.time()) for t in specs))
            for spec, got in zip(specs, together):
                site = next(s for s in fleet if s.url == spec.url)
                want = parse_vllm(site.body, target=site.url, timestamp=0.0)
                assert [(a.model_name, a.gauges, a.counters, a.histograms, a.cache_config) for a in got] == \
                    [(b.model_name, b.gauges, b.counters, b.histograms, b.cache_config) for b in want], site.capture
        finally:
            await reader.aclose()
    asyncio.run(main())


@pytest.mark.parametrize("federate", ["false", "true"], ids=["query-api", "federate"])
def test_query_mode_reports_what_scrape_mode_reports(fleet, prometheus, tmp_path, cli_env, federate):
    # a fresh store: its history (backfilled into the query-mode window) is as short as the
    # direct daemon's window, so both judge from the same amount of data
    common = "scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 30s}\n"
    direct_cfg = tmp_path / "direct.yaml"
    direct_cfg.write_text(common + "targets:\n" + "".join(f"  - url: {s.url}\n" for s in fleet))
    query_cfg = tmp_path / "query.yaml"
    query_cfg.write_text(common + f"prometheus: {{url: '{prometheus.url}', selector: '{{job=\"vllm\"}}', "
                         f"target_metadata: true, federate: {federate}}}\n")
    direct, query = Daemon(direct_cfg, cli_env), Daemon(query_cfg, cli_env)
    try:
        for d in (direct, query):
            wait_for(lambda d=d: get(d.url + "/-/ready")[0] == 200, timeout=60)
        # two evaluations after ready, so both windows hold several snapshots
        for d in (direct, query):
            wait_evaluations(d.metrics, 2)
        a, b = by_target(direct), by_target(query)
        assert set(a) == set(b) == {s.url for s in fleet}
        for url in a:
            ra, rb = a[url], b[url]
            assert ra["model_name"] == rb["model_name"]
            assert ra["vllm_version"] == rb["vllm_version"]
            assert ra["engine_era"] == rb["engine_era"]
            # every observed signal matches; only the window's own bookkeeping differs (query
            # mode backfills the window from the store's history, so it holds more snapshots)
            window_keys = {"window_samples", "window_seconds"}
            oa = {k: v for k, v in ra["observed"].items() if k not in window_keys}
            ob = {k: v for k, v in rb["observed"].items() if k not in window_keys}
            assert oa == ob, url
            assert len(oa) > 20 and oa.get("kv_cache_usage") is not None, url
            assert rb["observed"]["window_samples"] >= 2
            assert sorted((f["finding"], f["severity"]) for f in ra["findings"]) == \
                sorted((f["finding"], f["severity"]) for f in rb["findings"])
        up = samples(query.metrics(), "vllm_drift_target_up")
        assert {k.split('"')[1] for k in up} == set(a) and all(v == 1.0 for v in up.values())
    finally:
        direct.stop()
        query.stop()


def test_store_down_keeps_last_state_and_counts_reasons(fleet, prometheus, tmp_path, cli_env):
    cfg = tmp_path / "query.yaml"
    cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 30s}\n"
                   f"prometheus: {{url: '{prometheus.url}', timeout: 1s}}\n")
    d = Daemon(cfg, cli_env)
    try:
        wait_for(lambda: get(d.url + "/-/ready")[0] == 200, timeout=60)
        # the first evaluation runs right after the first read (one snapshot, no rates yet): wait
        # for one whose window has rates, so the state kept below is a settled one
        before = wait_for(lambda: (lambda b: b if all(t["observed"].get("requests_per_s") is not None
                                                     for t in b.values()) else None)(by_target(d)), timeout=30)
        victim = fleet[0].url
        # a target that dies is seen down through the store's `up`
        fleet[0].__exit__(None, None, None)
        fleet[0].closed = True
        wait_for(lambda: samples(d.metrics(), "vllm_drift_target_up").get(f'{{target="{victim}"}}') == 0.0, timeout=30)
        assert samples(d.metrics(), "vllm_drift_scrape_errors_total").get(f'{{reason="target_down",target="{victim}"}}', 0) >= 1
        # the store itself goes away: errors by reason, last state kept
        prometheus.stop()
        other = fleet[1].url
        wait_for(lambda: samples(d.metrics(), "vllm_drift_scrape_errors_total").get(
            f'{{reason="query_connect",target="{other}"}}', 0) >= 2, timeout=30)
        body = d.metrics()
        assert samples(body, "vllm_drift_target_up")[f'{{target="{other}"}}'] == 1.0
        assert samples(body, "vllm_drift_discovery_errors_total").get('{source="prometheus"}', 0) >= 1
        after = by_target(d)
        drop = {"window_samples", "window_seconds"}
        assert {k: v for k, v in after[other]["observed"].items() if k not in drop} == \
            {k: v for k, v in before[other]["observed"].items() if k not in drop}
    finally:
        d.stop()


def test_client_error_reasons(tmp_path):
    """Slow, erroring, non-JSON and unreachable stores each give their reason."""
    slow = loopback.Site(loopback.hang())
    bad_query = loopback.Site(loopback.static({"/api/v1/query": json.dumps(
        {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).encode()}, ctype="application/json"))
    html = loopback.Site(loopback.status("502 Bad Gateway", b"<html>bad gateway</html>"))

    async def reason(url: str) -> str:
        api = PromAPI(url, timeout=0.5)
        try:
            await api.instant("up")
        except QueryError as exc:
            return exc.reason
        finally:
            await api.aclose()
        return "none"

    async def main() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(
            reason(slow.url), reason(bad_query.url), reason(html.url), reason(dead_url())), 20)

    with slow, bad_query, html:
        got = asyncio.run(main())
    assert got == ["query_timeout", "query_error", "query_http_status", "query_connect"]
