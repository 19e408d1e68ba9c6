"""The daemon's scheduling at scale, on a real daemon scraping real captures over loopback HTTP:
scrapes are staggered over half the interval once the fleet outgrows the concurrency, a target
is evaluated again only when its window changed (or has aged a quarter window), an evaluation
pass yields to the event loop, and the memory caps are exported."""
from __future__ import annotations

import asyncio
import gc
import re
import types

import loopback

from exporter.config import Config, EvaluationConfig, ScrapeConfig, TargetSpec
from exporter.daemon import Daemon, _phase
from exporter.parse.snapshot import Snapshot
from exporter.window.window import PackedHistograms


def daemon_for(urls, **scrape) -> Daemon:
    return Daemon(Config(listen="127.0.0.1:0", scrape=ScrapeConfig(interval=1.0, timeout=1.0, jitter=0.01, **scrape),
                         evaluation=EvaluationConfig(interval=1.0, window=60.0),
                         targets=[TargetSpec(url=u, gpu="L4") for u in urls]))


def whole_snapshots(root) -> list[Snapshot]:
    """The Snapshots reachable from `root` that carry their histograms as objects (not a
    window's packed baselines)."""
    seen, out, stack = set(), [], [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        if isinstance(o, Snapshot) and not isinstance(o.histograms, PackedHistograms):
            out.append(o)
        stack.extend(gc.get_referents(o))
    return out


def test_phases_are_stable_and_spread():
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(2000)]
    phases = [_phase(u) for u in urls]
    assert phases == [_phase(u) for u in urls] and all(0 <= p < 1 for p in phases)
    deciles = [sum(1 for p in phases if k / 10 <= p < (k + 1) / 10) for k in range(10)]
    assert min(deciles) > 150                     # no herd: every tenth of the spread gets its share
    d = daemon_for(["http://a:1"], concurrency=2)
    assert d._scrape_spread(8) == 0.0 and d._scrape_spread(9) == 0.0   # above 4 x concurrency, but timeout = interval
    d.cfg = d.cfg.model_copy(update={"scrape": d.cfg.scrape.model_copy(update={"interval": 15.0, "timeout": 4.0})})
    assert d._scrape_spread(9) == 7.5 and d._scrape_spread(8) == 0.0
    # metadata refreshes: the configured interval +-25 %, by the same stable phase
    d.cfg = d.cfg.model_copy(update={"scrape": d.cfg.scrape.model_copy(update={"metadata_refresh": 300.0})})
    refresh = [d._metadata_refresh(u) for u in urls]
    assert all(225.0 <= r <= 375.0 for r in refresh) and max(refresh) - min(refresh) > 140.0
    assert refresh == [d._metadata_refresh(u) for u in urls]


def test_only_changed_windows_are_evaluated_and_caps_are_exported(captures):
    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    with loopback.Site(loopback.static({"/metrics": body, "/version": b'{"version":"0.10.1"}',
                                        "/v1/models": b'{"data":[]}'})) as site:
        d = daemon_for([site.url])

        async def go():
            await d.scrape_cycle()
            d.evaluate()
            [st] = d.targets.values()
            first = dict(st.reports)
            d.evaluate()                          # nothing new scraped: the same report objects
            assert all(st.reports[m] is r for m, r in first.items())
            await d.scrape_cycle()                # a new snapshot: evaluated anew
            # ... while the target holds one whole snapshot per model (its window's newest; the
            # one evaluated before is thinned, not kept whole beside it)
            assert len(whole_snapshots(st)) == len(st.pipelines)
            await d.evaluate_spread(0.5)
            assert all(st.reports[m] is not r for m, r in first.items())
            await d.scraper.aclose()
        asyncio.run(go())
        text = d.exposition.render().decode()
    assert 'vllm_drift_memory_cap{cap="models_per_target"} 64.0' in text
    assert 'vllm_drift_memory_cap_used{cap="parser_sample_heads"}' in text
    assert 'vllm_drift_memory_cap{cap="parser_shapes"} 128.0' in text
    used = re.search(r'vllm_drift_memory_cap_used\{cap="parser_shapes"\} (\S+)', text)
    assert used and 1 <= float(used.group(1)) <= 128          # this body's shape at least (the reader is shared)
    assert f'vllm_drift_finding_score{{target="{site.url}"' in text or "vllm_drift_evaluation_status{" in text


def test_full_collection_only_after_churn(captures):
    """The frozen long-lived state is collected in full (a pause proportional to the fleet) only
    when a connection or a target went away since the last time: a steady fleet never pauses."""
    import gc
    import socket

    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()                                 # nothing listens there: connection refused
    with loopback.Site(loopback.static({"/metrics": body, "/version": b'{"version":"0.10.1"}',
                                        "/v1/models": b'{"data":[]}'})) as site:
        d = daemon_for([site.url])

        def full_collections() -> int:
            return gc.get_stats()[2]["collections"]

        async def go():
            await d.scrape_cycle()
            assert d._churn == 0
            d._gc_full_at -= 10 * d.gc_full_every        # long overdue, but nothing went away
            before = full_collections()
            d._gc_maintenance()
            assert full_collections() == before
            d.targets[dead] = type(d.targets[site.url])(TargetSpec(url=dead, gpu="L4"))
            await d.scrape_one(d.targets[dead])      # a failed scrape counts as churn
            assert d._churn == 1
            d._gc_maintenance()
            assert full_collections() == before + 1 and d._churn == 0
            d._gc_maintenance()                       # swept: not again until the next interval
            assert full_collections() == before + 1
            await d.scraper.aclose()
        gc.disable()          # only the daemon's own collections are counted
        try:
            asyncio.run(go())
        finally:
            gc.enable()
            gc.unfreeze()


def test_free_heap_pages_go_back_to_the_system():
    """What each evaluation pass does after its collection: the pages of freed mallocs (scrape
    bodies of ~50 KB are each one, below glibc's mmap threshold) are returned, so the resident
    size follows what is live. 100 MB of such buffers freed around kept ones stay resident
    until then."""
    import pytest

    from exporter import daemon

    if daemon._MALLOC_TRIM is None:
        pytest.skip("no glibc malloc_trim on this system (musl, macOS): nothing to release")

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    chunks = [bytearray(60_000) for _ in range(2000)]
    kept = chunks[::10]                # every tenth survives, pinning the heap's top
    del chunks
    before = rss_mib()
    daemon._release_free_heap()
    after = rss_mib()
    assert before - after > 40, (before, after)
    assert len(kept) == 200
