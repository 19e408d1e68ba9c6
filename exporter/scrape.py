"""Fetching a vLLM server's `/metrics`, `/version` and `/v1/models` over keep-alive HTTP connections.

One `aiohttp` session with a per-host keep-alive pool (see `Scraper`); a semaphore bounds concurrency;
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
import aiohttp

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
    """HTTP client for every target; call `aclose()` when done.

    One `aiohttp` session for the fleet, created on first use inside the running loop. Why
    aiohttp and not httpx: at 1,000 targets a profile put 31 % of the daemon's CPU in httpx and
    httpcore (0.4 ms of Python per request on top of the parse); aiohttp's C-accelerated HTTP
    parser and its per-host connection pool cost ~0.08 ms per request for the same 46 KB body
    (docs/scaling.md). Its pool keeps up to `per_host` (one) keep-alive connection per target and
    drops those idle for `idle_close` seconds, so departed targets do not keep sockets. The TLS
    context is built once and shared; the semaphore bounds concurrency over all targets.
    Bodies are read raw (no automatic decompression) and decoded here with the size cap.
    """

    def __init__(self, *, timeout: float = 5.0, max_body_bytes: int = 16 * 2**20,
                 concurrency: int = 64, verify: bool | str = True, idle_close: float = 120.0,
                 per_host: int = 1) -> None:
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.semaphore = asyncio.Semaphore(concurrency)
        self.idle_close = idle_close
        self.per_host = per_host
        if verify is False:
            self._verify: ssl.SSLContext = ssl.create_default_context()
            self._verify.check_hostname = False
            self._verify.verify_mode = ssl.CERT_NONE
        elif isinstance(verify, str):
            self._verify = ssl.create_default_context(cafile=verify)
        else:
            self._verify = ssl.create_default_context()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.per_host, ssl=self._verify,
                                             keepalive_timeout=self.idle_close, enable_cleanup_closed=False)
            session = self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None), headers={"User-Agent": USER_AGENT})
        return session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def fetch(self, url: str, *, accept: str = ACCEPT, cap: int | None = None) -> Fetched:
        """GET `url`; the whole exchange must finish within the scrape timeout."""
        cap = self.max_body_bytes if cap is None else cap
        start = time.perf_counter()
        async with self.semaphore:
            try:
                async with asyncio.timeout(self.timeout):
                    async with self._client().get(url, headers={"Accept": accept, "Accept-Encoding": "gzip"},
                                                  allow_redirects=False) as resp:
                        status = resp.status
                        if status != 200:
                            raise ScrapeError("http_status", f"HTTP {status} from {url}")
                        headers = resp.headers
                        encoding = headers.get("Content-Encoding", "")
                        length = headers.get("Content-Length")
                        if length and length.isdigit() and int(length) > cap and not encoding:
                            raise ScrapeError("body_too_large",
                                              f"Content-Length {length} exceeds max_body_bytes ({cap} bytes)")
                        decoder = _Decoder(encoding, cap)
                        async for chunk in resp.content.iter_any():
                            decoder.feed(chunk)
                        body = decoder.finish()
            except TimeoutError:
                raise ScrapeError("timeout", f"no complete answer from {url} within {self.timeout:g}s") from None
            except aiohttp.ClientConnectorError as exc:
                raise ScrapeError("connect", f"cannot connect to {url}: {exc or type(exc).__name__}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError,
                    aiohttp.ClientResponseError) as exc:
                raise ScrapeError("read", f"connection to {url} broke: {exc or type(exc).__name__}") from None
            except aiohttp.ClientError as exc:
                raise ScrapeError("read", f"request to {url} failed: {exc or type(exc).__name__}") from None
        return Fetched(body, status, time.perf_counter() - start)

    async def metadata(self, base_url: str) -> Metadata:
        """`/version` and `/v1/models`; failures leave fields unknown (they are optional)."""
        # one after the other: on the target's one kept-alive connection (`per_host`), not a
        # second one held open per target (at 10,000 targets: 20,000 sockets, the open-file limit)
        return read_metadata(await self._optional(base_url + "/version", 64 * 1024),
                             await self._optional(base_url + "/v1/models", 1024 * 1024), time.time())

    async def _optional(self, url: str, cap: int) -> bytes | None:
        """A JSON body, or None on any failure (the metadata is optional)."""
        try:
            return (await self.fetch(url, accept="application/json", cap=cap)).body
        except Exception:  # noqa: BLE001
            return None
