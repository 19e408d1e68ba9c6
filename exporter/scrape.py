"""Fetching a vLLM server's `/metrics`, `/version` and `/v1/models` over keep-alive HTTP clients.

One small `httpx.AsyncClient` pool per target origin (see `Scraper`); a semaphore bounds concurrency;
every fetch has a total deadline (a server that trickles its body cannot hold a slot past it);
bodies are read raw and decompressed here with a cap on the *decoded* size, so neither a huge body
nor a gzip bomb can take memory past `max_body_bytes`. Failures are `ScrapeError`s with a reason
from a fixed set, which becomes the `reason` label of `vllm_drift_scrape_errors_total`.
"""
from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from dataclasses import dataclass
import httpx

from exporter import __version__
from exporter.errors import REASONS, ScrapeError
from exporter.parse.metadata import Metadata, read_metadata

USER_AGENT = f"vllm-drift/{__version__}"
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

__all__ = ["ACCEPT", "REASONS", "Fetched", "ScrapeError", "Scraper", "USER_AGENT"]


@dataclass(frozen=True, slots=True)
class Fetched:
    body: bytes
    status: int
    duration_s: float


class _Decoder:
    """Incremental gzip/deflate/identity decoding with a cap on the output."""

    def __init__(self, encoding: str, cap: int) -> None:
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
        else:
            raise ScrapeError("decode", f"unsupported Content-Encoding {encoding!r}")
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0

    def _add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.cap:
            raise ScrapeError("body_too_large", f"body larger than max_body_bytes ({self.cap} bytes)")
        self.parts.append(data)

    def feed(self, chunk: bytes) -> None:
        if self._z is None:
            self._add(chunk)
            return
        try:
            data = self._z.decompress(chunk, self.cap - self.size + 1)
            self._add(data)
            while self._z.unconsumed_tail:
                data = self._z.decompress(self._z.unconsumed_tail, self.cap - self.size + 1)
                if not data:
                    break
                self._add(data)
        except zlib.error as exc:
            raise ScrapeError("decode", f"bad {('gzip' if self._z else '')} body: {exc}") from None

    def finish(self) -> bytes:
        if self._z is not None:
            try:
                self._add(self._z.flush())
            except zlib.error as exc:
                raise ScrapeError("decode", f"truncated compressed body: {exc}") from None
        return b"".join(self.parts)


class Scraper:
    """HTTP clients for every target; call `aclose()` when done.

    One small keep-alive pool per target origin, not one pool for the fleet: httpcore scans its
    whole pool on every request (checking each connection's expiry with a socket poll), and a
    shared pool smaller than the fleet closes and reopens connections all the time, so at 1,000
    targets both the scan and the reconnects dominated the daemon's CPU. The TLS context is
    built once and shared; the semaphore bounds concurrency over all targets; pools of origins
    not fetched for `idle_close` seconds are closed.
    """

    def __init__(self, *, timeout: float = 5.0, max_body_bytes: int = 16 * 2**20,
                 concurrency: int = 64, verify: bool | str = True, idle_close: float = 900.0) -> None:
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.semaphore = asyncio.Semaphore(concurrency)
        self.idle_close = idle_close
        if verify is False:
            self._verify: ssl.SSLContext = ssl.create_default_context()
            self._verify.check_hostname = False
            self._verify.verify_mode = ssl.CERT_NONE
        elif isinstance(verify, str):
            self._verify = ssl.create_default_context(cafile=verify)
        else:
            self._verify = ssl.create_default_context()
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._last_used: dict[str, float] = {}
        self._fetches = 0

    def _client(self, url: str) -> httpx.AsyncClient:
        origin = url[: url.find("/", url.find("//") + 2)] if url.count("/") >= 3 else url
        client = self._clients.get(origin)
        if client is None:
            client = self._clients[origin] = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout),
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=2, keepalive_expiry=120),
                headers={"User-Agent": USER_AGENT},
                follow_redirects=False,
                verify=self._verify,
                trust_env=False,
            )
        now = time.monotonic()
        self._last_used[origin] = now
        self._fetches += 1
        if self._fetches % 4096 == 0:
            self._close_idle(now)
        return client

    def _close_idle(self, now: float) -> None:
        for origin, used in list(self._last_used.items()):
            if now - used > self.idle_close:
                del self._last_used[origin]
                asyncio.get_running_loop().create_task(self._clients.pop(origin).aclose())

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        self._last_used.clear()
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    async def fetch(self, url: str, *, accept: str = ACCEPT, cap: int | None = None) -> Fetched:
        """GET `url`; the whole exchange must finish within the scrape timeout."""
        cap = self.max_body_bytes if cap is None else cap
        start = time.perf_counter()
        async with self.semaphore:
            try:
                async with asyncio.timeout(self.timeout):
                    async with self._client(url).stream("GET", url, headers={"Accept": accept,
                                                                       "Accept-Encoding": "gzip"}) as resp:
                        if resp.status_code != 200:
                            raise ScrapeError("http_status", f"HTTP {resp.status_code} from {url}")
                        length = resp.headers.get("content-length")
                        if length and length.isdigit() and int(length) > cap and \
                                not resp.headers.get("content-encoding"):
                            raise ScrapeError("body_too_large",
                                              f"Content-Length {length} exceeds max_body_bytes ({cap} bytes)")
                        decoder = _Decoder(resp.headers.get("content-encoding", ""), cap)
                        async for chunk in resp.aiter_raw():
                            decoder.feed(chunk)
                        body = decoder.finish()
                        status = resp.status_code
            except TimeoutError:
                raise ScrapeError("timeout", f"no complete answer from {url} within {self.timeout:g}s") from None
            except httpx.ConnectError as exc:
                raise ScrapeError("connect", f"cannot connect to {url}: {exc or type(exc).__name__}") from None
            except httpx.TimeoutException:
                raise ScrapeError("timeout", f"no complete answer from {url} within {self.timeout:g}s") from None
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                raise ScrapeError("read", f"connection to {url} broke: {exc or type(exc).__name__}") from None
            except httpx.HTTPError as exc:
                raise ScrapeError("read", f"request to {url} failed: {exc or type(exc).__name__}") from None
        return Fetched(body, status, time.perf_counter() - start)

    async def metadata(self, base_url: str) -> Metadata:
        """`/version` and `/v1/models`; failures leave fields unknown (they are optional)."""
        ver, models = await asyncio.gather(
            self.fetch(base_url + "/version", accept="application/json", cap=64 * 1024),
            self.fetch(base_url + "/v1/models", accept="application/json", cap=1024 * 1024),
            return_exceptions=True,
        )
        return read_metadata(ver.body if isinstance(ver, Fetched) else None,
                             models.body if isinstance(models, Fetched) else None, time.time())
