"""The simulator's HTTP side: `/metrics`, `/v1/models`, `/version`, `/health` answered like a real
vLLM OpenAI server, on plain asyncio streams (no framework, so one process can listen on a
thousand ports cheaply in fleet mode).

`POST /v1/completions` and `/v1/chat/completions` (streaming SSE or not) run through the simulated
engine (`exporter.sim.openai`), so a load generator sees the engine's latencies and /metrics moves
with its load; while such requests are in flight the ticker runs every 10 ms of wall time.

HTTP/1.1 with keep-alive and Content-Length; gzip when the client's Accept-Encoding asks for it
(the compressed body is cached per exposition, like the text itself). A ticker advances the
simulated engines with wall time × speed; nothing here decides what the metrics say.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from exporter.sim import openai
from exporter.sim.scenario import SimServerState

log = logging.getLogger("vllm_drift.sim")

MAX_HEADER_BYTES = 65536
MAX_BODY_BYTES = 8 << 20
BUSY_TICK_S = 0.01
IDLE_TIMEOUT_S = 30.0
METRICS_CT = b"text/plain; version=0.0.4; charset=utf-8"
JSON_CT = b"application/json"


@dataclass
class Endpoint:
    """What one simulated server answers; several endpoints may share one engine (fleet)."""

    state: SimServerState
    wall_start: float | None = None           # monotonic time of sim time `warmup` (set by serve)
    active: int = 0                           # OpenAI requests in flight
    _key: float = field(default=-1.0, repr=False)
    _plain: bytes = field(default=b"", repr=False)
    _gz: bytes | None = field(default=None, repr=False)

    def metrics(self, want_gzip: bool) -> tuple[bytes, bool]:
        st = self.state
        if st.sim_time != self._key or not self._plain:
            self._plain = st.exposition().encode()
            self._gz = None
            self._key = st.sim_time
        if want_gzip:
            if self._gz is None:
                self._gz = gzip.compress(self._plain, compresslevel=5, mtime=0)
            return self._gz, True
        return self._plain, False

    def models(self) -> bytes:
        st = self.state
        created = int(time.time())
        return json.dumps({"object": "list", "data": [{
            "id": st.model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": st.scenario.model, "parent": None, "max_model_len": st.max_model_len,
            "permission": [{"id": f"modelperm-{st.engine.cfg.num_gpu_blocks:x}",
                            "object": "model_permission", "created": created,
                            "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False,
                            "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                            "group": None, "is_blocking": False}]}]}, separators=(",", ":")).encode()

    def version(self) -> bytes:
        return json.dumps({"version": self.state.version}, separators=(",", ":")).encode()


def _response(status: str, body: bytes, ctype: bytes, *, gz: bool = False, keep: bool = True,
              head: bool = False) -> bytes:
    hdr = [b"HTTP/1.1 " + status.encode(), b"server: uvicorn", b"content-type: " + ctype,
           b"content-length: " + str(len(body)).encode()]
    if gz:
        hdr.append(b"content-encoding: gzip")
        hdr.append(b"vary: Accept-Encoding")
    if not keep:
        hdr.append(b"connection: close")
    return b"\r\n".join(hdr) + b"\r\n\r\n" + (b"" if head else body)


async def handle(endpoint: Endpoint, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    """Serve requests on one connection until the client closes or asks to."""
    try:
        while True:
            try:
                raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                break
            except asyncio.LimitOverrunError:
                writer.write(_response("431 Request Header Fields Too Large", b"", JSON_CT, keep=False))
                break
            lines = raw.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3:
                writer.write(_response("400 Bad Request", b"", JSON_CT, keep=False))
                break
            method, target, proto = parts
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            try:
                length = int(headers.get("content-length", "0") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                writer.write(_response("413 Request Entity Too Large", b"", JSON_CT, keep=False))
                break
            payload = await reader.readexactly(length) if length else b""
            conn = headers.get("connection", "").lower()
            keep = (proto == "HTTP/1.1" and conn != "close") or conn == "keep-alive"
            path = target.split("?", 1)[0]
            head = method == "HEAD"
            if method == "POST" and path in openai.PATHS:
                endpoint.active += 1
                try:
                    ok = await openai.serve_request(endpoint, path, payload, writer, keep=keep)
                finally:
                    endpoint.active -= 1
                if not (ok and keep):
                    break
                continue
            if method not in ("GET", "HEAD"):
                body, ctype, status, gz = b'{"detail":"Method Not Allowed"}', JSON_CT, "405 Method Not Allowed", False
            elif path == "/metrics" or path == "/metrics/":
                want = "gzip" in headers.get("accept-encoding", "")
                body, gz = endpoint.metrics(want)
                ctype, status = METRICS_CT, "200 OK"
            elif path == "/v1/models":
                body, ctype, status, gz = endpoint.models(), JSON_CT, "200 OK", False
            elif path == "/version":
                body, ctype, status, gz = endpoint.version(), JSON_CT, "200 OK", False
            elif path in ("/health", "/ping"):
                body, ctype, status, gz = b"", JSON_CT, "200 OK", False
            else:
                body, ctype, status, gz = b'{"detail":"Not Found"}', JSON_CT, "404 Not Found", False
            writer.write(_response(status, body, ctype, gz=gz, keep=keep, head=head))
            await writer.drain()
            if not keep:
                break
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the peer may be gone already
            pass


async def serve(bindings: Sequence[tuple[str, int, Endpoint]], states: Sequence[SimServerState], *,
                tick_s: float = 0.25, duration: float | None = None,
                stop: asyncio.Event | None = None,
                on_ready: Callable[[list[str]], None] | None = None) -> None:
    """Listen on every (host, port, endpoint), advance `states` every `tick_s` of wall time, and
    return when `stop` is set or `duration` seconds have passed."""
    stop = stop or asyncio.Event()
    servers = []
    urls = []
    try:
        for host, port, ep in bindings:
            srv = await asyncio.start_server(lambda r, w, ep=ep: handle(ep, r, w), host, port,
                                             limit=MAX_HEADER_BYTES, backlog=128)
            servers.append(srv)
            sock = srv.sockets[0].getsockname()
            urls.append(f"http://{host if ':' not in host else '[' + host + ']'}:{sock[1]}")
        if on_ready:
            on_ready(urls)
        t0 = time.monotonic()
        endpoints = [ep for _, _, ep in bindings]
        for ep in endpoints:
            ep.wall_start = t0
        deadline = t0 + duration if duration else None
        while not stop.is_set():
            now = time.monotonic()
            for st in states:
                st.tick(now - t0)
            if deadline is not None and now >= deadline:
                break
            tick = min(tick_s, BUSY_TICK_S) if any(ep.active for ep in endpoints) else tick_s
            wait = tick if deadline is None else max(0.0, min(tick, deadline - now))
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except asyncio.TimeoutError:
                pass
    finally:
        for srv in servers:
            srv.close()
        for srv in servers:
            try:
                await asyncio.wait_for(srv.wait_closed(), 2.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
