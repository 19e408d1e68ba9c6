"""A small client for the Prometheus HTTP query API (`/api/v1/query`), as Prometheus, Thanos and
Mimir serve it.

Why not a library: one endpoint is used, and errors must land in a fixed set of reasons (the
`reason` label of `vllm_drift_scrape_errors_total`), with a deadline on every request so a slow
store cannot hold a cycle. Uses the same kind of shared keep-alive `httpx.AsyncClient` as the
scraper; POST with a form body, so long selectors never hit URL length limits.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import httpx

from exporter import __version__

# Fixed failure reasons of query mode.
QUERY_REASONS = ("query_connect", "query_timeout", "query_http_status", "query_bad_response", "query_error",
                 "target_down", "no_series")


class QueryError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        assert reason in QUERY_REASONS, reason
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict[str, str]        # including __name__ when the expression keeps it
    value: float
    timestamp: float              # evaluation time of the instant query


class PromAPI:
    def __init__(self, base_url: str, *, timeout: float = 10.0, concurrency: int = 8,
                 headers: dict[str, str] | None = None, bearer_token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.semaphore = asyncio.Semaphore(concurrency)
        hdrs = {"User-Agent": f"vllm-drift/{__version__}", **(headers or {})}
        if bearer_token:
            hdrs["Authorization"] = f"Bearer {bearer_token}"
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            headers=hdrs, trust_env=False, follow_redirects=False)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def instant(self, query: str, at: float | None = None) -> list[Series]:
        """Evaluate an instant query (at unix time `at`, default now) -> its vector."""
        form = {"query": query}
        if at is not None:
            form["time"] = f"{at:.3f}"
        result = await self._call("/api/v1/query", form, "vector")
        out: list[Series] = []
        for item in result:
            ts, value = self._point(item.get("value"))
            out.append(Series(dict(item.get("metric") or {}), value, ts))
        return out

    async def instant_items(self, encoded_query: str, at: float) -> list[dict]:
        """`instant` for a query already form-encoded (`query=...`), returning the raw result
        items (`{"metric": {...}, "value": [t, "v"]}`): the daemon's per-target hot path."""
        return await self._call("/api/v1/query", f"{encoded_query}&time={at:.3f}", "vector")

    async def federate(self, encoded_matches: str) -> bytes:
        """`/federate?match[]=...` (already encoded): the latest samples of the matched series as
        exposition text, with their scrape timestamps. Prometheus only (not Thanos or Mimir)."""
        url = f"{self.base_url}/federate?{encoded_matches}"
        resp = await self._send("GET", url, f"{self.base_url}/federate",
                                headers={"Accept": "text/plain;version=0.0.4"})
        if resp.status_code != 200:
            raise QueryError("query_http_status", f"HTTP {resp.status_code} from {self.base_url}/federate")
        return resp.content

    async def _send(self, method: str, url: str, where: str, **kw) -> httpx.Response:
        """One request within the deadline and the concurrency bound; transport failures become
        `QueryError`s naming `where`."""
        async with self.semaphore:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self.client.request(method, url, **kw)
            except (TimeoutError, httpx.TimeoutException):
                raise QueryError("query_timeout", f"{where}: no answer within {self.timeout:g}s") from None
            except httpx.ConnectError as exc:
                raise QueryError("query_connect", f"cannot connect to {where}: {exc or type(exc).__name__}") from None
            except httpx.HTTPError as exc:
                raise QueryError("query_connect", f"request to {where} failed: {exc or type(exc).__name__}") from None

    async def range(self, query: str, start: float, end: float, step: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """Evaluate a range query -> [(labels, [(t, value), ...]), ...]."""
        form = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):.3f}"}
        result = await self._call("/api/v1/query_range", form, "matrix")
        out = []
        for item in result:
            points = [self._point(v) for v in item.get("values") or ()]
            out.append((dict(item.get("metric") or {}), points))
        return out

    def _point(self, pair: object) -> tuple[float, float]:
        try:
            ts, raw = pair  # type: ignore[misc]
            return float(ts), float(raw)     # "NaN", "+Inf" parse as floats
        except (TypeError, ValueError):
            raise QueryError("query_bad_response", f"{self.base_url}: malformed sample {str(pair)[:120]}") from None

    async def _call(self, path: str, form: dict[str, str] | str, result_type: str) -> list[dict]:
        url = self.base_url + path
        if isinstance(form, str):
            kw = {"content": form.encode(), "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
        else:
            kw = {"data": form}
        resp = await self._send("POST", url, url, **kw)
        try:
            doc = json.loads(resp.content)
        except (ValueError, UnicodeDecodeError, RecursionError):   # RecursionError: nested too deep
            doc = None
        if not isinstance(doc, dict):
            if resp.status_code != 200:
                raise QueryError("query_http_status", f"HTTP {resp.status_code} from {url}")
            raise QueryError("query_bad_response", f"{url}: answer is not JSON")
        if doc.get("status") != "success":
            kind = doc.get("errorType") or f"HTTP {resp.status_code}"
            reason = "query_error" if resp.status_code in (200, 400, 422) else "query_http_status"
            raise QueryError(reason, f"{url}: {kind}: {doc.get('error') or 'query failed'}")
        data = doc.get("data") or {}
        if data.get("resultType") != result_type or not isinstance(data.get("result"), list):
            raise QueryError("query_bad_response", f"{url}: expected a {result_type}, got {data.get('resultType')!r}")
        return [item for item in data["result"] if isinstance(item, dict)]
