"""The server's own view of a level: `/metrics` read every `interval` seconds while the level runs
and canonicalised with `exporter.parse` (any vLLM era). Reports KV usage mean/max, running and
waiting requests mean/max, preemptions during the level, and the server's TTFT/TPOT histogram
means over the level (what the sweep's client-side figures can be checked against)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from exporter.errors import ParseError
from exporter.parse import parse_vllm
from exporter.parse.snapshot import Snapshot


class MetricsWatch:
    """Poll `/metrics` in the background between `start()` and `stop()`."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str | None, *,
                 interval: float = 0.5):
        self.client = client
        self.url = base_url + "/metrics"
        self.model = model
        self.interval = interval
        self.snaps: list[Snapshot] = []
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def scrape(self) -> Snapshot | None:
        try:
            resp = await self.client.get(self.url, timeout=5.0)
            if resp.status_code != 200:
                self.error = f"/metrics answered HTTP {resp.status_code}"
                return None
            snaps = parse_vllm(resp.content, target=self.url, timestamp=time.time())
        except (httpx.HTTPError, ParseError) as exc:
            self.error = f"/metrics: {exc}"
            return None
        if not snaps:
            return None
        for s in snaps:
            if s.model_name == self.model:
                return s
        return snaps[0]

    async def _loop(self) -> None:
        while True:
            snap = await self.scrape()
            if snap is not None:
                self.snaps.append(snap)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self.snaps = []
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        snap = await self.scrape()          # one at the end, so the deltas cover the whole level
        if snap is not None:
            self.snaps.append(snap)
        return summarize(self.snaps)


def _gauge(snaps: list[Snapshot], key: str) -> tuple[float | None, float | None]:
    vals = [s.gauges[key] for s in snaps if key in s.gauges]
    if not vals:
        return None, None
    return sum(vals) / len(vals), max(vals)


def _delta_mean(first: Snapshot, last: Snapshot, key: str) -> float | None:
    a, b = first.histograms.get(key), last.histograms.get(key)
    if a is None or b is None:
        return None
    d = b.delta(a)
    return d.mean() if d is not None else None


def summarize(snaps: list[Snapshot]) -> dict[str, Any]:
    kv_mean, kv_max = _gauge(snaps, "kv_cache_usage")
    run_mean, run_max = _gauge(snaps, "num_requests_running")
    wait_mean, wait_max = _gauge(snaps, "num_requests_waiting")
    doc: dict[str, Any] = {
        "server_scrapes": len(snaps),
        "kv_usage_mean": kv_mean, "kv_usage_max": kv_max,
        "running_mean": run_mean, "running_max": run_max,
        "waiting_mean": wait_mean, "waiting_max": wait_max,
        "preemptions": None, "server_ttft_mean_s": None, "server_tpot_mean_s": None,
    }
    if len(snaps) >= 2:
        first, last = snaps[0], snaps[-1]
        if "num_preemptions_total" in first.counters and "num_preemptions_total" in last.counters:
            doc["preemptions"] = max(0.0, last.counters["num_preemptions_total"]
                                     - first.counters["num_preemptions_total"])
        doc["server_ttft_mean_s"] = _delta_mean(first, last, "ttft_seconds")
        doc["server_tpot_mean_s"] = _delta_mean(first, last, "tpot_seconds")
    return doc
