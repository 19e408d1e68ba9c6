"""The server's own view of a level: `/metrics` read when the level's measured phase starts, every
`interval` seconds while it runs and once when it is over, canonicalised with `exporter.parse`
(any vLLM era). Reports KV usage mean/max, running and waiting requests mean/max, preemptions
during the level, and the server's TTFT/TPOT/ITL histogram means and request counts between the
first and last read (what the sweep's client-side figures are checked against; docs/sweep.md
says how vLLM's definitions differ from the client's)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from exporter.errors import ParseError
from exporter.parse import parse_vllm
from exporter.parse.snapshot import Snapshot


SETTLE_WAIT_S = 3.0      # longest wait for the histograms to cover the finished requests


class MetricsWatch:
    """Read `/metrics` once when a level's measured phase starts (`start()`, after the warm-up has
    finished), every `interval` seconds while it runs, and once more when it is over (`stop()`).
    The first and last reads bound every server-side delta, so with no other traffic the server's
    histograms cover exactly the level's measured requests; their raw texts are kept
    (`first_text`, `last_text`) for `--save-metrics`."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str | None, *,
                 interval: float = 0.5):
        self.client = client
        self.url = base_url + "/metrics"
        self.model = model
        self.interval = interval
        self.snaps: list[Snapshot] = []
        self.first_text: str | None = None
        self.last_text: str | None = None
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def scrape_text(self) -> tuple[Snapshot | None, str | None]:
        try:
            resp = await self.client.get(self.url, timeout=5.0)
            if resp.status_code != 200:
                self.error = f"/metrics answered HTTP {resp.status_code}"
                return None, None
            snaps = parse_vllm(resp.content, target=self.url, timestamp=time.time())
        except (httpx.HTTPError, ParseError) as exc:
            self.error = f"/metrics: {exc}"
            return None, None
        if not snaps:
            return None, resp.text
        for s in snaps:
            if s.model_name == self.model:
                return s, resp.text
        return snaps[0], resp.text

    async def scrape(self) -> Snapshot | None:
        return (await self.scrape_text())[0]

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            snap = await self.scrape()
            if snap is not None:
                self.snaps.append(snap)

    async def start(self) -> None:
        """The baseline read (awaited, so it precedes the first measured request), then polling."""
        self.snaps, self.first_text, self.last_text = [], None, None
        snap, self.first_text = await self.scrape_text()
        if snap is not None:
            self.snaps.append(snap)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, finished: int = 0, *, wait_s: float = SETTLE_WAIT_S) -> dict[str, Any]:
        """The closing read. vLLM records a request's histograms right after handing its last
        output to the API server, so they are normally in place before the client sees the end of
        its stream; the read is repeated (every 0.1 s, at most `wait_s`) until the TTFT and TPOT
        histograms have grown by at least the `finished` requests the client saw complete."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        deadline = time.monotonic() + wait_s
        while True:
            snap, text = await self.scrape_text()
            if snap is None or not self.snaps or _covered(self.snaps[0], snap) >= finished \
                    or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        if snap is not None:
            self.snaps.append(snap)
            self.last_text = text
        return summarize(self.snaps)


def _count_delta(first: Snapshot, last: Snapshot, key: str) -> float | None:
    a, b = first.histograms.get(key), last.histograms.get(key)
    if a is None or b is None:
        return None
    d = b.delta(a)
    return d.count if d is not None else None


def _covered(first: Snapshot, last: Snapshot) -> float:
    """Requests both the TTFT and the TPOT histogram gained between two reads (inf if the server
    has neither, so nothing is waited for)."""
    counts = [c for c in (_count_delta(first, last, "ttft_seconds"), _count_delta(first, last, "tpot_seconds"))
              if c is not None]
    return min(counts) if counts else float("inf")


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
        "server_itl_mean_s": None, "server_e2e_mean_s": None,
        "server_ttft_count": None, "server_tpot_count": None,
    }
    if len(snaps) >= 2:
        first, last = snaps[0], snaps[-1]
        if "num_preemptions_total" in first.counters and "num_preemptions_total" in last.counters:
            doc["preemptions"] = max(0.0, last.counters["num_preemptions_total"]
                                     - first.counters["num_preemptions_total"])
        doc["server_ttft_mean_s"] = _delta_mean(first, last, "ttft_seconds")
        doc["server_tpot_mean_s"] = _delta_mean(first, last, "tpot_seconds")
        doc["server_itl_mean_s"] = _delta_mean(first, last, "itl_seconds")
        doc["server_e2e_mean_s"] = _delta_mean(first, last, "e2e_seconds")
        doc["server_ttft_count"] = _count_delta(first, last, "ttft_seconds")
        doc["server_tpot_count"] = _count_delta(first, last, "tpot_seconds")
    return doc
