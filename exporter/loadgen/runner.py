"""Running a sweep: levels one after the other, each bounded in requests, time and concurrency.

Closed loop (`concurrency` levels): that many clients each send their next request as soon as the
last one finished. Open loop (`rate` levels): Poisson arrivals at the rate, at most
`max_concurrency` in flight. Per level: a warm-up phase (by default one request per client, or one
second of arrivals, not measured) that ends when its last request has finished, then the server's
baseline /metrics read, then up to `max_requests` measured requests, then the closing read — so
the server's histogram deltas cover the measured requests and nothing else (on an otherwise idle
server). Sending stops at `max_duration` seconds into the level and requests in flight finish. Between levels a settle pause
lets the server drain. A level with a failed request stops the sweep; so does the knee when the
levels are the automatic doubling ones; `stop` (Ctrl-C) ends the level at once, abandoning the
requests in flight and keeping what completed.
"""
from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx

from exporter.loadgen.client import Api, RequestResult, send
from exporter.loadgen.metrics import MetricsWatch
from exporter.loadgen.stats import find_knee, summarize

HARD_MAX_CONCURRENCY = 1024

# progress(level_label, measured_done, measured_total, level_finished)
Progress = Callable[[str, int, int, bool], None]


@dataclass
class SweepConfig:
    api: Api
    prompt_tokens: int = 256
    output_tokens: int = 128
    range_ratio: float = 0.0            # lengths uniform in [N(1-r), N(1+r)], like bench's --random-range-ratio
    concurrency: list[int] | None = None   # explicit levels; None (and no rates) = auto doubling
    rates: list[float] | None = None
    max_concurrency: int = 256
    max_requests: int = 100
    max_duration: float = 60.0
    warmup: int | None = None           # warm-up requests per level (None: auto)
    settle_s: float = 1.0
    timeout_s: float = 300.0
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    seed: int = 0
    metrics_interval: float = 0.5
    # called after each level with (level, /metrics text at the measured start, at the end)
    on_metrics: Callable[[float, str | None, str | None], None] | None = None

    @property
    def key(self) -> str:
        return "rate" if self.rates else "concurrency"

    @property
    def auto(self) -> bool:
        return not self.rates and not self.concurrency

    def levels(self) -> list[float]:
        if self.rates:
            return list(self.rates)
        if self.concurrency:
            return list(self.concurrency)
        out, c = [], 1
        while c <= self.max_concurrency:
            out.append(c)
            c *= 2
        if out[-1] != self.max_concurrency:
            out.append(self.max_concurrency)
        return out


@dataclass
class SweepResult:
    levels: list[dict[str, Any]] = field(default_factory=list)
    knee: Any = None
    stopped: str = ""                   # why the sweep ended early ("" = all levels ran)
    interrupted: bool = False


def _length(n: int, r: float, rng: random.Random) -> int:
    if r <= 0:
        return n
    return max(1, int(round(rng.uniform(n * (1 - r), n * (1 + r)))))


async def _level(client: httpx.AsyncClient, cfg: SweepConfig, value: float, stop: asyncio.Event,
                 progress: Progress | None, rng: random.Random,
                 on_measure: Callable[[], Awaitable[None]] | None = None) -> tuple[list[RequestResult], bool]:
    """Run one level: the warm-up phase to its end (every warm-up request finished), then
    `on_measure()` (the server's baseline /metrics read), then the measured phase; returns
    (measured results, interrupted)."""
    closed = cfg.key == "concurrency"
    conc = int(value) if closed else cfg.max_concurrency
    warm = cfg.warmup if cfg.warmup is not None else (conc if closed else max(1, math.ceil(value)))
    label = f"{cfg.key} {value:g}"
    t_end = time.monotonic() + cfg.max_duration
    measured: list[RequestResult] = []

    async def phase(kind: str, budget: int) -> None:
        left = [budget]

        def take() -> bool:
            if stop.is_set() or time.monotonic() >= t_end or left[0] <= 0:
                return False
            left[0] -= 1
            return True

        async def one() -> None:
            res = await send(client, cfg.api, _length(cfg.prompt_tokens, cfg.range_ratio, rng),
                             _length(cfg.output_tokens, cfg.range_ratio, rng), rng)
            if kind == "measure":
                measured.append(res)
                if progress:
                    progress(label, len(measured), cfg.max_requests, False)

        tasks: set[asyncio.Task] = set()
        if closed:
            async def worker() -> None:
                while take():
                    await one()
            tasks = {asyncio.create_task(worker()) for _ in range(conc)}
        else:
            sem = asyncio.Semaphore(conc)

            async def limited() -> None:
                async with sem:
                    await one()

            while take():
                t = asyncio.create_task(limited())
                tasks.add(t)
                try:
                    await asyncio.wait_for(stop.wait(), rng.expovariate(value))
                    break
                except asyncio.TimeoutError:
                    pass
        stopper = asyncio.create_task(stop.wait())
        pending = set(tasks)
        while pending and not stop.is_set():
            _, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
        stopper.cancel()
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    if progress:
        progress(label, 0, cfg.max_requests, False)
    if warm > 0:
        await phase("warm", warm)
    if not stop.is_set():
        if on_measure is not None:
            await on_measure()
        await phase("measure", cfg.max_requests)
    if progress:
        progress(label, len(measured), cfg.max_requests, True)
    return measured, stop.is_set()


async def run_sweep(cfg: SweepConfig, *, stop: asyncio.Event | None = None,
                    progress: Progress | None = None,
                    on_level: Callable[[dict[str, Any]], None] | None = None) -> SweepResult:
    stop = stop or asyncio.Event()
    rng = random.Random(cfg.seed)
    out = SweepResult()
    key = cfg.key
    levels = cfg.levels()
    limits = httpx.Limits(max_connections=HARD_MAX_CONCURRENCY + 8, max_keepalive_connections=HARD_MAX_CONCURRENCY + 8)
    timeout = httpx.Timeout(cfg.timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        watch = MetricsWatch(client, cfg.api.base_url, cfg.api.model, interval=cfg.metrics_interval)
        for i, value in enumerate(levels):
            if i and cfg.settle_s > 0:
                try:
                    await asyncio.wait_for(stop.wait(), cfg.settle_s)
                except asyncio.TimeoutError:
                    pass
            if stop.is_set():
                out.interrupted = True
                out.stopped = "interrupted"
                break
            t0 = time.time()
            results, interrupted = await _level(client, cfg, value, stop, progress, rng, on_measure=watch.start)
            server = await watch.stop(sum(1 for r in results if r.ok))
            if cfg.on_metrics is not None:
                cfg.on_metrics(value, watch.first_text, watch.last_text)
            doc: dict[str, Any] = {key: value, "started_at": t0}
            doc.update(summarize(results))
            doc.update(server)
            # what the client saw that vLLM's request clock did not (HTTP, request parsing and
            # validation before vLLM stamps `arrival_time`, and the last chunk's delivery)
            doc["frontend_mean_s"] = (doc["e2e_mean_s"] - doc["server_e2e_mean_s"]
                                      if doc.get("e2e_mean_s") is not None
                                      and doc.get("server_e2e_mean_s") is not None else None)
            doc["partial"] = interrupted
            if doc["completed"] or not interrupted:
                out.levels.append(doc)
                if on_level:
                    on_level(doc)
            if interrupted:
                out.interrupted = True
                out.stopped = "interrupted"
                break
            if doc["failed"]:
                out.stopped = (f"{doc['failed']} of {doc['requests']} requests failed at {key} {value:g}"
                               + (f" ({doc['errors'][0]})" if doc["errors"] else ""))
                break
            if not doc["completed"]:
                out.stopped = f"no request completed at {key} {value:g}"
                break
            if cfg.auto and find_knee(out.levels, key, ttft_slo=cfg.ttft_slo, tpot_slo=cfg.tpot_slo):
                out.stopped = "knee found"
                break
    ok = [lv for lv in out.levels if lv.get("completed")]
    out.knee = find_knee(ok, key, ttft_slo=cfg.ttft_slo, tpot_slo=cfg.tpot_slo)
    return out
