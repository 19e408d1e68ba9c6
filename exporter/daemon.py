"""The `serve` daemon: discover -> scrape -> parse -> pipelines -> publish.

The daemon schedules, discovers, keeps per-target state (scrape health, metadata, one
`TargetPipeline` per served model) and publishes; turning a target's snapshots into a report is
`exporter.pipeline`'s job, and its state (stable findings, windows) is saved through it.

One asyncio loop runs two APScheduler jobs that never overlap themselves (`max_instances=1`):
the scrape cycle (every `scrape.interval`, with jitter) and the evaluation (every
`evaluation.interval`). The HTTP endpoints run in their own thread and only ever read the last
published, immutable state. Bad input never stops the daemon: a bad target is counted by reason,
a bad config reload keeps the config in force.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gc
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from exporter.config import Config, TargetSpec, build_config
from exporter.model.gpus import install_gpus
from exporter.drift.state import StateStore
from exporter.discovery import Discovery, build_discovery
from exporter.errors import InputError, ParseError, ScrapeError
from exporter.events import Narrator
from exporter.export.cache import CachedExposition, CapsCollector
from exporter.export.collector import FleetView, TargetView
from exporter.export.findings import Entry, FindingsIndex, ReportCache, TargetsIndex
from exporter.export.server import HTTPServer, Published
from exporter.parse import parse_vllm
from exporter.parse.canonical import READER
from exporter.parse.metadata import Metadata
from exporter.parse.snapshot import Snapshot
from exporter.pipeline import Pipelines, TargetPipeline
from exporter.query.client import QueryError
from exporter.query.reader import PrometheusReader
from exporter.report import ModelReport
from exporter.scrape import Scraper
from exporter.telemetry.collector import GpuCollector
from exporter.telemetry.dcgm import DCGMSource, TargetGpus

log = structlog.get_logger("vllm_drift")

# A vLLM server serves one model (a few with several engines). A target whose exposition names
# more is not one server, and each name would cost a window, an evaluation and its own series:
# 20,000 names in 2 MiB slowed /metrics from 3 ms to 700 ms before this cap.
MAX_MODELS_PER_TARGET = 64


def _too_many_models(n: int) -> str:
    return f"{n} served models in one exposition (at most {MAX_MODELS_PER_TARGET}): not a single vLLM server"


@dataclass
class TargetState:
    """Everything the daemon keeps about one target between cycles."""

    spec: TargetSpec
    up: bool | None = None
    duration_s: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    last_reason: str | None = None
    errors: dict[str, float] = field(default_factory=dict)
    metadata: Metadata | None = None
    pipelines: dict[str, TargetPipeline] = field(default_factory=dict)   # served model -> its pipeline
    reports: dict[str, ModelReport] = field(default_factory=dict)
    start_time: float | None = None
    served: tuple[tuple[str, str], ...] | None = None   # (model_name, engine_era) of the last scrape
    gpus: TargetGpus | None = None    # when DCGM is configured
    # model -> (its window's snapshot count, when) at its last evaluation: a count, not the
    # snapshot, which the window has thinned since (holding it kept a second whole one per target)
    evaluated: dict[str, tuple[int, float]] = field(default_factory=dict)

    def fail(self, reason: str, message: str, now: float) -> None:
        self.up = False
        self.errors[reason] = self.errors.get(reason, 0.0) + 1.0
        if message != self.last_error:
            log.warning("scrape failed", target=self.spec.url, reason=reason, error=message)
        self.last_error, self.last_reason = message, reason


class Daemon:
    def __init__(self, cfg: Config, *, config_path: str | None = None,
                 cli_targets: list[str] | None = None, cli_listen: str | None = None) -> None:
        self.cfg = cfg
        install_gpus(cfg.gpus)         # the config's `gpus:` rows join the GPU catalog
        self.config_path = config_path
        self.cli_targets, self.cli_listen = cli_targets, cli_listen
        self.config_stamp = self._stamp()
        self.config_loaded_at = time.time()
        self.reload_failures = 0.0
        self.reloads = 0.0
        self.discovery_errors: dict[str, float] = {}
        self.reader = None             # PrometheusReader in query mode
        self.discovery: Discovery = self._make_discovery(cfg)
        self.scraper = self._make_scraper(cfg)
        self.state_store: StateStore | None = StateStore(cfg.state_dir) if cfg.state_dir else None
        self._saving = False           # a spread save is under way (save_state_spread)
        self.pipelines = Pipelines(cfg)
        self.pipelines.on_state_error = self._state_error
        self.targets: dict[str, TargetState] = {}
        self.narrator = Narrator(log)   # what the operator reads: discoveries, windows, findings
        self.exposition = CachedExposition()
        self.exposition.registry.register(CapsCollector(self._caps))
        self.published = Published(self.exposition.render_parts, self.exposition.render_gzip_parts)
        self.report_json = ReportCache()
        self.published.reload = self._reload_from_http
        self.dcgm = self.gpu_collector = None
        self._setup_dcgm(cfg)
        self.http: HTTPServer | None = None
        self.last_evaluation: float | None = None
        self.evaluation_duration: float | None = None
        self.cycle_duration: float | None = None
        self.cycles = 0.0
        self.evaluations = 0
        self.skipped_cycles = 0.0
        self.ready = False
        self.scheduler: AsyncIOScheduler | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._waiting: set[asyncio.Task] = set()
        self._gc_full_at = time.monotonic()
        # connections or targets that went away since the last full collection (the only source
        # of reference cycles in long-lived state: see _gc_maintenance)
        self._churn = 0
        self._reload_requested = False
        self._foreign_tasks: set[asyncio.Task] = set()

    # ----------------------------------------------------------------- setup
    @staticmethod
    def _make_scraper(cfg: Config) -> Scraper:
        return Scraper(timeout=cfg.scrape.timeout, max_body_bytes=cfg.scrape.max_body_bytes,
                       concurrency=cfg.scrape.concurrency)

    def _stamp(self) -> tuple[float, int] | None:
        if not self.config_path:
            return None
        try:
            st = os.stat(self.config_path)
            return (st.st_mtime, st.st_size)
        except OSError:
            return None

    def _make_discovery(self, cfg: Config) -> Discovery:
        """Scrape mode: the configured sources. Query mode (`prometheus:`): the targets the store
        knows, read through its API (sharding applies to them the same way)."""
        if cfg.prometheus is None:
            self.reader = None
            return build_discovery(cfg, on_error=self._discovery_error)
        if cfg.targets or cfg.file_sd or cfg.kubernetes:
            log.warning("query mode: targets come from Prometheus; targets, file_sd and kubernetes are not used",
                        prometheus=cfg.prometheus.url)
        self.reader = PrometheusReader(cfg.prometheus, on_error=self._discovery_error)
        return Discovery([self.reader], defaults=cfg.defaults, shard_index=cfg.shard.index,
                         shard_count=cfg.shard.count)

    def _setup_dcgm(self, cfg: Config) -> None:
        """GPU telemetry (optional): DCGM readings joined to targets, exported by its own collector."""
        if cfg.dcgm is None:
            self.dcgm = None
            if self.gpu_collector is not None:
                self.gpu_collector.view = {}
            return
        self.dcgm = DCGMSource(cfg.dcgm, on_error=self._discovery_error)
        if self.gpu_collector is None:
            self.gpu_collector = GpuCollector()
            self.exposition.registry.register(self.gpu_collector)

    async def _join_gpus(self, wanted: dict[str, TargetSpec]
                         ) -> tuple[dict[str, TargetSpec], dict[str, TargetGpus | None]]:
        """Refresh DCGM when due; a target without a `gpu` hint takes the GPU DCGM names."""
        if self.dcgm.due(time.time()):
            await self.dcgm.refresh(self.scraper, self.reader.api if self.reader is not None else None)
        out, joined = {}, {}
        for url, spec in wanted.items():
            gpus = joined[url] = self.dcgm.index.join(spec)
            if gpus is not None and spec.gpu is None and gpus.catalog_gpu:
                spec = spec.model_copy(update={"gpu": gpus.catalog_gpu})
            out[url] = spec
        return out, joined

    def _discovery_error(self, source: str, message: str) -> None:
        self.discovery_errors[source] = self.discovery_errors.get(source, 0.0) + 1.0
        log.error("discovery failed", source=source, error=message)

    # ----------------------------------------------------------------- scrape
    async def scrape_cycle(self) -> None:
        start = time.perf_counter()
        if self.reader is not None:
            await self.reader.refresh()
        try:
            wanted = self.discovery.targets()
        except Exception as exc:  # a discovery source must never stop scraping
            self._discovery_error("discovery", f"{type(exc).__name__}: {exc}")
            wanted = {url: st.spec for url, st in self.targets.items()}
        for url in list(self.targets):
            if url not in wanted:
                self.narrator.removed(url)
                for model_name in self.targets[url].pipelines:
                    self.pipelines.calibration.forget(url, model_name)
                del self.targets[url]
                self._churn += 1
        gpus = None
        if self.dcgm is not None:
            wanted, gpus = await self._join_gpus(wanted)
        for url, spec in wanted.items():
            state = self.targets.get(url)
            if state is None:
                self.targets[url] = TargetState(spec)
                self.narrator.discovered(url, spec.source)
            elif state.spec != spec:
                state.spec = spec
            if gpus is not None:
                self.targets[url].gpus = gpus.get(url)
        states = list(self.targets.values())
        spread = self._scrape_spread(len(states))
        if spread > 0:
            results = await asyncio.gather(*(self._scrape_at(st, spread * _phase(st.spec.url)) for st in states),
                                           return_exceptions=True)
        else:
            results = await asyncio.gather(*(self.scrape_one(st) for st in states), return_exceptions=True)
        for st, res in zip(states, results):   # a bug hit by one target must not void the cycle
            if isinstance(res, Exception):
                log.error("scrape of a target raised", target=st.spec.url, error=f"{type(res).__name__}: {res}"[:300])
        self.cycle_duration = time.perf_counter() - start
        self.cycles += 1
        if self.last_evaluation is None and any(p.latest is not None for st in self.targets.values()
                                                for p in st.pipelines.values()):
            # the first evaluation right after the first good scrape: instant verdicts (and the
            # operator's first report) do not wait a whole evaluation interval
            self.evaluate()
        else:
            self.publish()
        self._gc_maintenance()

    # Fleets larger than this many scrape slots have their target scrapes staggered.
    STAGGER_ABOVE = 4

    def _scrape_spread(self, n: int) -> float:
        """Seconds over which one cycle's target scrapes are staggered: 0 for a fleet that fits
        in a few rounds of the concurrency limit; else half the interval, or less when the
        scrape timeout leaves less room. Each target keeps its
        phase (a hash of its URL) from cycle to cycle, so its scrapes stay `interval` apart, the
        first cycle after start-up reaches every target within the first interval, and the
        fetch, parse and GIL load is spread instead of arriving as one herd."""
        sc = self.cfg.scrape
        if self.reader is not None or n <= sc.concurrency * self.STAGGER_ABOVE:
            return 0.0
        # a hanging target holds its scrape for the whole timeout: the last-started scrape must
        # still end before the next cycle is due, or that cycle is skipped
        return max(0.0, min(sc.interval / 2, (sc.interval - sc.timeout) * 0.8))

    async def _scrape_at(self, st: TargetState, delay: float) -> None:
        task = asyncio.current_task()
        self._waiting.add(task)          # shutdown cancels scrapes that have not started
        try:
            await asyncio.sleep(delay)
        finally:
            self._waiting.discard(task)
        if self.targets.get(st.spec.url) is st:      # still wanted (a reload may have dropped it)
            await self.scrape_one(st)

    async def scrape_one(self, st: TargetState) -> None:
        if self.reader is not None:
            return await self.query_one(st)
        url = st.spec.url
        now = time.time()
        start = time.perf_counter()
        try:
            fetched = await self.scraper.fetch(url + "/metrics")
        except ScrapeError as exc:
            self._churn += 1      # its connection, if any, was dropped
            st.duration_s = time.perf_counter() - start   # how long it took to fail, as blackbox does
            st.fail(exc.reason, str(exc), now)
            return
        try:
            snaps = parse_vllm(fetched.body, target=url, timestamp=now)
            if len(snaps) > MAX_MODELS_PER_TARGET:
                raise ParseError(_too_many_models(len(snaps)))
        except ParseError as exc:
            st.duration_s = fetched.duration_s
            st.fail(exc.reason, str(exc), now)
            return
        st.duration_s = fetched.duration_s
        # the body (~50 KB) must not live on across the metadata await below: when a wave of
        # refreshes queued on the fetch semaphore, a thousand of them stayed alive at once
        fetched = None
        restarted = self._restarted(st, snaps)
        self._churn += restarted
        if st.metadata is None or restarted or now - st.metadata.fetched_at > self._metadata_refresh(url):
            st.metadata = await self.scraper.metadata(url)
        self._observe(st, snaps, now)

    def _metadata_refresh(self, url: str) -> float:
        """Seconds after which a target's /v1/models and /version are read again: the configured
        interval, shifted per target by up to +-25 % (its stable phase), so that a fleet
        discovered at once does not refresh all at once every interval."""
        return self.cfg.scrape.metadata_refresh * (0.75 + 0.5 * _phase(url))

    async def query_one(self, st: TargetState) -> None:
        """Query mode: the target's Snapshots from the store. A failing store is counted by
        reason and leaves the target's state as it was; the store's `up == 0` marks it down."""
        url, now = st.spec.url, time.time()
        start = time.perf_counter()
        try:
            if not st.pipelines and self.cfg.prometheus.backfill:
                step = max(self.cfg.scrape.interval, self.cfg.evaluation.window / 60)
                for snaps in await self.reader.history(st.spec, now - self.cfg.evaluation.window, now, step):
                    self._observe(st, snaps, snaps[0].timestamp if snaps else now, quiet=True)
            snaps = await self.reader.read(st.spec, now)
            if len(snaps) > MAX_MODELS_PER_TARGET:
                st.duration_s = None
                st.fail("parse", _too_many_models(len(snaps)), now)
                return
        except QueryError as exc:
            if exc.reason in ("target_down", "no_series"):
                st.duration_s = None
                st.fail(exc.reason, str(exc), now)
            else:                      # the store failed, not the target: keep what we know
                st.errors[exc.reason] = st.errors.get(exc.reason, 0.0) + 1.0
                if str(exc) != st.last_error:
                    log.warning("query failed; keeping the last state", target=url, reason=exc.reason, error=str(exc))
                st.last_error, st.last_reason = str(exc), exc.reason
            return
        st.duration_s = time.perf_counter() - start
        restarted = self._restarted(st, snaps)
        if self.cfg.prometheus.target_metadata and (
                st.metadata is None or restarted or now - st.metadata.fetched_at > self._metadata_refresh(url)):
            st.metadata = await self.scraper.metadata(url)
        self._observe(st, snaps, max((s.timestamp for s in snaps), default=now))

    def _observe(self, st: TargetState, snaps: list[Snapshot], now: float, *, quiet: bool = False) -> None:
        url = st.spec.url
        if not quiet:
            st.up, st.last_success = True, now
            if st.last_error is not None:
                log.info("scrape recovered", target=url)
                st.last_error = st.last_reason = None
        seen = set()
        for snap in snaps:
            seen.add(snap.model_name)
            pipe = st.pipelines.get(snap.model_name)
            if pipe is None:
                pipe = st.pipelines[snap.model_name] = self.pipelines.pipeline(st.spec, snap.model_name)
            pipe.spec = st.spec
            pipe.observe(snap)
        if not quiet:   # a restored model this target no longer serves
            self.pipelines.forget_restored(url, seen)
            self.narrator.scraped(url, ((s.model_name, s.engine_era) for s in snaps),
                                  st.metadata.vllm_version if st.metadata else None)
        for gone in set(st.pipelines) - seen:
            st.pipelines.pop(gone, None)
            st.reports.pop(gone, None)
            st.evaluated.pop(gone, None)
            self.narrator.forget(url, gone)
            self.pipelines.calibration.forget(url, gone)

    @staticmethod
    def _restarted(st: TargetState, snaps: list[Snapshot]) -> bool:
        """A new process behind the URL: its start time moved (or vanished), or it serves other
        models or another engine era (an upgrade or rollback whose exposition has no start time);
        /version and /v1/models are then re-read at once rather than at the next refresh."""
        starts = [s.start_time for s in snaps if s.start_time is not None]
        start = min(starts) if starts else None
        served = tuple(sorted((s.model_name, s.engine_era) for s in snaps))
        changed = (st.start_time is not None and start != st.start_time) or \
            (st.served is not None and served != st.served)
        st.start_time, st.served = start, served
        return changed

    # ----------------------------------------------------------------- evaluate
    # A target whose window has not changed since its last evaluation is evaluated again only
    # after this share of the window (so a down target's findings still age out).
    REEVALUATE_UNCHANGED = 0.25
    EVALUATION_CHUNK = 64     # targets evaluated between two yields to the event loop

    def _due(self, now: float) -> list[tuple[TargetState, str, TargetPipeline]]:
        """(target, model, pipeline) whose window changed since its last evaluation, or whose
        last evaluation is older than REEVALUATE_UNCHANGED x window."""
        stale = self.cfg.evaluation.window * self.REEVALUATE_UNCHANGED
        due = []
        for st in self.targets.values():
            for model, pipe in st.pipelines.items():
                if pipe.latest is None:
                    continue
                last = st.evaluated.get(model)
                if last is None or last[0] != pipe.window.seq or now - last[1] >= stale or model not in st.reports:
                    due.append((st, model, pipe))
        return due

    def _evaluate_one(self, st: TargetState, model: str, pipe: TargetPipeline, now: float) -> None:
        try:
            pipe.spec = st.spec
            st.reports[model] = pipe.evaluate(st.metadata, now)
            st.evaluated[model] = (pipe.window.seq, now)
        except Exception:  # one target's bad data must not stop the others
            log.exception("evaluation failed", target=st.spec.url, model_name=model)
            return
        try:
            self.narrator.evaluated(st.spec.url, model, st.reports[model], pipe.window.duration,
                                    slack_s=self.cfg.scrape.interval)
        except Exception:  # telling must never stop judging
            log.exception("event logging failed", target=st.spec.url, model_name=model)

    def evaluate(self) -> None:
        """Evaluate every due target at once (the spread form is `evaluate_spread`)."""
        start = time.perf_counter()
        now = time.time()
        for st, model, pipe in self._due(now):
            self._evaluate_one(st, model, pipe, now)
        self._evaluated(start)

    async def evaluate_spread(self, spread: float) -> None:
        """Evaluate the due targets in chunks spread over up to `spread` seconds, yielding to
        the event loop between chunks: scrapes go on meanwhile, and the HTTP thread never waits
        behind a whole fleet's evaluation."""
        start = time.perf_counter()
        due = self._due(time.time())
        chunks = max(1, -(-len(due) // self.EVALUATION_CHUNK))
        pause = spread / chunks if chunks > 1 else 0.0
        for i in range(0, len(due), self.EVALUATION_CHUNK):
            t0 = time.perf_counter()
            now = time.time()
            done: dict[str, TargetState] = {}
            for st, model, pipe in due[i:i + self.EVALUATION_CHUNK]:
                if self.targets.get(st.spec.url) is st and st.pipelines.get(model) is pipe:
                    self._evaluate_one(st, model, pipe, now)
                    done[st.spec.url] = st
            for url, st in done.items():     # its /metrics block now, not all at the next publish
                self.exposition.prerender(self._view(url, st))
            # a chunk's reports are long-lived: out of the automatic full scans. No collection
            # first: the automatic young ones during the chunk caught its short-lived cycles, and
            # an explicit one per chunk scanned every survivor again (~4 % of a core at 10,000
            # targets); what a freeze keeps the periodic full collection frees
            gc.freeze()
            wait = max(0.0, pause - (time.perf_counter() - t0))
            if wait > 0 and not self._stop.is_set():
                try:                     # a pause that ends at once when the daemon stops
                    await asyncio.wait_for(self._stop.wait(), wait)
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(0)
            if self._stop.is_set():
                pause = 0.0      # stopping: finish the pass without pauses
        self._evaluated(start, save=False)
        await self.save_state_spread()

    def _evaluated(self, start: float, *, save: bool = True) -> None:
        self.evaluations += 1
        self.last_evaluation = time.time()
        self.evaluation_duration = time.perf_counter() - start
        self.narrator.summary((r for st in self.targets.values() for r in st.reports.values()),
                              len(self.targets), self.evaluation_duration)
        self.ready = True
        if save:
            self.save_state()
        self.publish()

    # ----------------------------------------------------------------- publish
    def publish(self) -> None:
        """Swap in what the endpoints serve. Cheap per target: `/metrics` re-renders only the
        report families of targets evaluated since the last publish (exporter/export/cache.py),
        and the JSON documents are built when requested (exporter/export/findings.py)."""
        views, entries, rows, current = [], [], [], []
        for url, st in sorted(self.targets.items()):
            tv = self._view(url, st)
            views.append(tv)
            version, models, reports, errors = tv.vllm_version, tv.models, tv.reports, tv.errors
            if reports:
                entries.extend(Entry(url, r, None) for r in reports)
                current.extend(reports)
            else:
                entries.append(Entry(url, None, {
                    "target": url, "vllm_version": version, "model_name": None,
                    "status": "down" if st.up is False else "pending",
                    "error": st.last_error, "observed": {}, "findings": []}))
            rows.append((url, st.spec, st.up, st.duration_s, st.last_success, st.last_error, st.last_reason,
                         errors, version, models, st.gpus))
        view = FleetView(tuple(views), self.last_evaluation, self.evaluation_duration, self.reload_failures,
                         self.reloads, self.config_loaded_at, dict(self.discovery_errors), self.cycle_duration,
                         self.cycles, self._state_errors(), self.ready)
        if self.gpu_collector is not None:
            self.gpu_collector.view = {url: st.gpus for url, st in self.targets.items() if st.gpus is not None}
        self.exposition.publish(view)
        self.report_json.retain(current)
        self.published.findings_index = FindingsIndex(time.time(), entries, self.report_json)
        self.published.targets_index = TargetsIndex(rows, _target_json)
        self.published.ready = self.ready

    @staticmethod
    def _view(url: str, st: TargetState) -> TargetView:
        version = st.metadata.vllm_version if st.metadata else None
        models = {m: p.latest.engine_era for m, p in st.pipelines.items() if p.latest is not None}
        reports = tuple(st.reports[m] for m in sorted(st.reports) if m in models)
        return TargetView(url, st.spec.source, st.up, st.duration_s, st.last_success,
                          dict(st.errors), version, models, reports)

    def _caps(self) -> dict[str, tuple[float, float | None]]:
        """The memory caps (docs/scaling.md "Memory caps") and how full each is."""
        sc = self.cfg.scrape
        parser = READER.cache_sizes()
        return {
            "scrape_body_bytes": (sc.max_body_bytes, None),
            "scrape_bodies_in_flight": (sc.concurrency, None),
            "models_per_target": (MAX_MODELS_PER_TARGET, None),
            "parser_sample_heads": (READER.max_heads, parser["heads"]),
            "parser_label_sets": (READER.max_labelsets, parser["labelsets"]),
            "parser_shapes": (READER.max_shapes, parser["shapes"]),
            "parser_values": (READER.max_values, parser["values"]),
            "render_sample_heads": self.exposition.head_cache(),
        }

    # ----------------------------------------------------------------- reload
    def reload(self) -> str:
        """Re-read the config file; an invalid one is logged and counted, the old one stays."""
        try:
            new = build_config(self.config_path, targets=self.cli_targets, listen=self.cli_listen)
        except InputError as exc:
            self.reload_failures += 1
            log.error("config reload failed; keeping the config in force", error=str(exc))
            self.publish()
            return str(exc)
        old, self.cfg = self.cfg, new
        install_gpus(new.gpus)
        self.config_loaded_at = time.time()
        self.reloads += 1
        self.discovery.close()
        self.discovery = self._make_discovery(new)
        self.pipelines.reconfigure(new)
        for st in self.targets.values():
            st.evaluated.clear()
        self._setup_dcgm(new)
        if new.state_dir != old.state_dir:
            self.state_store = StateStore(new.state_dir) if new.state_dir else None
        if new.scrape != old.scrape:
            old_scraper, self.scraper = self.scraper, self._make_scraper(new)
            asyncio.get_running_loop().create_task(old_scraper.aclose())
        if self.scheduler is not None and (new.scrape.interval != old.scrape.interval
                                           or new.evaluation.interval != old.evaluation.interval):
            self.scheduler.reschedule_job("scrape", trigger="interval", seconds=new.scrape.interval,
                                          jitter=min(new.scrape.jitter, new.scrape.interval / 4))
            self.scheduler.reschedule_job("evaluate", trigger="interval", seconds=new.evaluation.interval)
        if new.listen != old.listen:
            log.warning("listen address changes take effect on restart", listen=new.listen)
        if new.evaluation.window != old.evaluation.window:
            for st in self.targets.values():
                for pipe in st.pipelines.values():
                    pipe.window.resize(new.evaluation.window)
        log.info("config reloaded", path=self.config_path)
        self.publish()
        return "ok"

    def _reload_from_http(self) -> str:
        loop = self.loop
        if loop is None:
            return "not running"
        fut = asyncio.run_coroutine_threadsafe(self._async_reload(), loop)
        return fut.result(timeout=30)

    async def _async_reload(self) -> str:
        return self.reload()

    async def watch_config(self) -> None:
        stamp = self._stamp()
        if self._reload_requested or (stamp is not None and stamp != self.config_stamp):
            self._reload_requested = False
            self.config_stamp = stamp
            self.reload()

    # ----------------------------------------------------------------- run
    async def run(self, *, duration: float | None = None, on_listen=None) -> None:
        self.loop = asyncio.get_running_loop()
        # tasks already there (an embedding program's own, e.g. `demo` awaiting this one): not
        # ours to drain at shutdown, which would wait out the whole grace period for them
        self._foreign_tasks = set(asyncio.all_tasks())
        # The HTTP thread waits for the GIL whenever the loop thread parses or evaluates; a 1 ms
        # switch interval (default 5 ms) keeps /metrics answers fast during those bursts.
        sys.setswitchinterval(0.001)
        self.http = HTTPServer(self.cfg.listen, self.published, self.cfg.web)
        self.http.start()
        log.info("listening", address=self.cfg.listen, port=self.http.port, targets=len(self.discovery.targets()))
        if on_listen:
            on_listen(self.http.port)
        self.load_state()
        self.publish()
        loop = self.loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            loop.add_signal_handler(signal.SIGHUP, self._request_reload)
        except (NotImplementedError, RuntimeError, AttributeError):
            pass
        sched = self.scheduler = AsyncIOScheduler(event_loop=loop)
        sched.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        now = datetime.datetime.now()
        sc, ev = self.cfg.scrape, self.cfg.evaluation
        sched.add_job(self.scrape_cycle, "interval", seconds=sc.interval, jitter=min(sc.jitter, sc.interval / 4),
                      id="scrape", max_instances=1, coalesce=True, next_run_time=now, misfire_grace_time=None)
        sched.add_job(self._evaluate_job, "interval", seconds=ev.interval, id="evaluate", max_instances=1,
                      coalesce=True, misfire_grace_time=None)
        sched.add_job(self.watch_config, "interval", seconds=2, id="config", max_instances=1, coalesce=True)
        sched.add_job(self._gc_tick, "interval", seconds=1, id="gc", max_instances=1, coalesce=True)
        # process metrics read on the loop, not in the thread answering /metrics (cache.py)
        sched.add_job(self.exposition.refresh_live, "interval", seconds=self.exposition.LIVE_TTL, id="live",
                      max_instances=1, coalesce=True)
        sched.start()
        try:
            if duration is None:
                await self._stop.wait()
            else:
                try:
                    await asyncio.wait_for(self._stop.wait(), duration)
                except TimeoutError:
                    pass
        finally:
            await self.shutdown()

    async def _evaluate_job(self) -> None:
        # spread over half the interval (the next pass never waits for this one); the first
        # pass as fast as it goes (readiness waits for it), still yielding between chunks
        await self.evaluate_spread(self.cfg.evaluation.interval / 2 if self.ready else 0.0)
        self._gc_maintenance()
        _release_free_heap()

    # least time between full collections of the frozen long-lived state, in evaluation intervals
    # (300 s at the default 30 s): the garbage churn leaves waits at most this long, so the heap's
    # high-water mark is reached within the first GC_FULL_EVALUATIONS cycles whatever the cadence
    GC_FULL_EVALUATIONS = 10

    @property
    def gc_full_every(self) -> float:
        return self.GC_FULL_EVALUATIONS * self.cfg.evaluation.interval

    def _gc_maintenance(self, full_every: float | None = None) -> None:
        """Keep the long-lived state out of the cyclic collector's scans.

        At 3,000 targets the heap holds ~1M tracked objects (windows, reports, views), and
        CPython's automatic full collections scanned them all: pauses of up to 370 ms holding
        the GIL, which stalled /metrics answers. That state is freed by reference counting when
        windows slide, so every second (`_gc_tick`) and after each cycle the young generations
        are collected (cycles die young: exceptions, futures) and the survivors frozen
        (`gc.freeze`, O(1)); automatic collections then only scan what is newer than a second.

        The pipeline's own state forms no reference cycles, not even when a target leaves
        (measured: a steady fleet and 100 departures leave nothing for the collector); the
        network layer's does when a connection goes away (transport and protocol point at each
        other). So the frozen state is unfrozen and collected once - a pause of ~100 ms per
        1,000 targets (~1 s at 10,000) - at most every `GC_FULL_EVALUATIONS` evaluation intervals
        and only when connections or targets went away since the last time (`_churn`): a steady
        fleet never pauses, a churning one is swept every 5 minutes at the default cadence.
        Counted in evaluations, not seconds: the cyclic garbage of departed connections (the
        hanging and dropped targets of every scrape) piles up between sweeps, so the resident
        size only settles after the first sweep; a wall-clock period let a faster cadence (the
        compressed soak, x3) keep growing after its first ten simulated minutes."""
        full_every = self.gc_full_every if full_every is None else full_every
        now = time.monotonic()
        if now - self._gc_full_at >= full_every and self._churn:
            gc.unfreeze()
            gc.collect()
            self._gc_full_at = now
            self._churn = 0
        else:
            gc.collect(1)
        gc.freeze()

    async def _gc_tick(self) -> None:
        self._gc_maintenance()

    def _request_reload(self) -> None:
        log.info("SIGHUP: reloading config")
        self._reload_requested = True
        asyncio.get_running_loop().create_task(self.watch_config())

    def _skipped(self, event: Any) -> None:
        if event.job_id == "scrape":
            self.skipped_cycles += 1
            log.warning("scrape cycle still running; skipping this one", skipped=self.skipped_cycles)

    def stop(self) -> None:
        self._stop.set()

    async def shutdown(self, grace: float = 10.0) -> None:
        # Let an in-flight cycle finish (bounded), then close the client and the server. The
        # scheduler is only paused here: APScheduler's asyncio executor *cancels* running jobs
        # on shutdown, which would throw away the cycle instead of draining it.
        if self.scheduler is not None:
            self.scheduler.pause()
        for task in list(self._waiting):      # staggered scrapes not yet started
            task.cancel()
        pending = [t for t in asyncio.all_tasks()
                   if t is not asyncio.current_task() and not t.done() and t not in self._foreign_tasks]
        if pending:
            await asyncio.wait(pending, timeout=grace)
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        self.save_state(force=True)
        await self.scraper.aclose()
        if self.reader is not None:
            await self.reader.aclose()
        self.discovery.close()
        if self.http is not None:
            self.http.stop()
        log.info("stopped")

    # ----------------------------------------------------------------- state (exporter.drift.state)
    STATE_SAVE_MIN_INTERVAL = 30.0   # seconds between routine saves (shutdown always saves)

    def load_state(self) -> None:
        """Restore the stable findings and windows saved by a previous run (never fatal)."""
        if self.state_store is None:
            return
        doc = self.state_store.load()
        if not doc:
            return
        try:
            n, windows = self.pipelines.restore(doc)
            log.info("state restored", findings_trackers=n, windows=windows,
                     calibration_pools=len(self.pipelines.calibration.pools))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            self.state_store.error("load", f"unusable state: {exc}")
            self.state_store.set_aside()
            self.pipelines.restored_windows.clear()

    def save_state(self, force: bool = False) -> None:
        """Save now (`force`: whatever the interval; shutdown does)."""
        steps = self._save_steps(force)
        if steps is not None:
            for _ in steps:
                pass

    async def save_state_spread(self) -> None:
        """A routine save in steps of 200 windows, yielding to the event loop between them:
        scrapes and `/metrics` answers go on while 10,000 windows are written (~1 s of
        encoding in all)."""
        steps = self._save_steps(False)
        if steps is None:
            return
        self._saving = True
        try:
            for _ in steps:
                await asyncio.sleep(0)
        finally:
            steps.close()          # a cancelled save removes its temp file
            self._saving = False

    def _save_steps(self, force: bool):
        store = self.state_store
        if store is None or (self._saving and not force):
            return None
        # encoding costs ~0.1 s per 1,000 targets with full windows (spread, not one pause):
        # at scale, save less often, at most ~1 % of a core
        every = max(self.STATE_SAVE_MIN_INTERVAL, 0.01 * len(self.targets))
        if not force and store.last_save is not None and time.time() - store.last_save < every:
            return None
        # Windows restored at start-up wait for their target's first good scrape; a save before
        # then (a slow first cycle, a target still down) must carry them over, not drop them.
        return store.saving(self.pipelines.to_state(
            [p for st in self.targets.values() for p in st.pipelines.values()],
            keep_restored=lambda url: self.cycles == 0 or url in self.targets, streamed=True))

    def _state_error(self, operation: str, message: str) -> None:
        if self.state_store is not None:
            self.state_store.error(operation, message)

    def _state_errors(self) -> dict[str, float]:
        return dict(self.state_store.errors) if self.state_store is not None else {}


def _load_malloc_trim():
    """glibc's `malloc_trim`, or None (musl, macOS: nothing to call)."""
    try:
        import ctypes
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()


def _release_free_heap() -> None:
    """Give the C heap's free pages back to the system, once per evaluation pass (~1 ms at a
    200 MB heap). Every scrape body (~50 KB, over pymalloc's limit) and rendered block is a
    malloc of its own, freed a cycle later, and glibc keeps freed pages inside its arenas. In
    the 620 s soak the resident size at the end was 203.7 MiB with it against 207.6 without
    (same fleet and churn): a real saving of ~2 %, not the cause of the soak's growth after its
    first window (that grew alike with and without; docs/scaling.md)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _phase(url: str) -> float:
    """A target's stable place in [0, 1) within a staggered scrape cycle."""
    return (zlib.crc32(url.encode()) % 10007) / 10007


def _target_json(row: tuple) -> dict[str, Any]:
    """One `/api/v1/targets` object from the tuple `Daemon.publish` recorded."""
    url, spec, up, duration, last_success, last_error, last_reason, errors, version, models, gpus = row
    return {"target": url, "source": spec.source, "up": up, "scrape_duration_seconds": duration,
            "last_success": last_success, "last_error": last_error, "last_error_reason": last_reason,
            "errors": errors, "vllm_version": version, "models": models,
            "hints": spec.model_dump(exclude={"url", "source"}, exclude_none=True),
            "gpus": None if gpus is None else dataclasses.asdict(gpus)}
