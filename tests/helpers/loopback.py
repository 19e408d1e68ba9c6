"""Real HTTP servers on 127.0.0.1 for tests: serve bytes, or misbehave on purpose.

`Site` runs a raw asyncio server in a background thread, so a behaviour can break HTTP in ways a
framework would not let it (stall after the headers, reset mid-body, lie about the length).
"""
from __future__ import annotations

import asyncio
import gzip
import threading
from typing import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


def response(body: bytes, ctype: str = "text/plain; version=0.0.4; charset=utf-8", status: str = "200 OK",
             headers: dict[str, str] | None = None) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    return head.encode() + b"\r\n" + body


def static(routes: dict[str, bytes | Callable[[], bytes]], ctype: str = "text/plain; version=0.0.4; charset=utf-8"):
    """Serve fixed (or computed) bodies by path; JSON for /version and /v1/models."""
    async def handle(reader, writer, path):
        body = routes.get(path)
        if body is None:
            writer.write(response(b"not found", status="404 Not Found"))
            return
        if callable(body):
            body = body()
        kind = "application/json" if path in ("/version", "/v1/models") else ctype
        writer.write(response(body, kind))
    return handle


def gzipped(body: bytes) -> Handler:
    async def handle(reader, writer, path):
        writer.write(response(gzip.compress(body), headers={"Content-Encoding": "gzip"}))
    return handle


def status(code: str, body: bytes = b"<html><body>Internal Server Error</body></html>") -> Handler:
    async def handle(reader, writer, path):
        writer.write(response(body, "text/html", code))
    return handle


def hang() -> Handler:
    async def handle(reader, writer, path):
        await asyncio.sleep(3600)
    return handle


def trickle(body: bytes, delay: float) -> Handler:
    async def handle(reader, writer, path):
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for i in range(0, len(body), 16):
            writer.write(body[i:i + 16])
            await writer.drain()
            await asyncio.sleep(delay)
    return handle


def reset_mid_body(body: bytes) -> Handler:
    async def handle(reader, writer, path):
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body) * 2}\r\n\r\n".encode() + body)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        import socket as _s
        import struct
        sock.setsockopt(_s.SOL_SOCKET, _s.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    return handle


async def _stream_metrics_lines(writer, size: int) -> None:
    """Write `size` bytes of valid-looking sample lines, until done or the client hangs up."""
    chunk = b"vllm:num_requests_running{model_name=\"x\"} 1\n" * 1000
    sent = 0
    try:
        while sent < size:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    except ConnectionError:
        pass


def huge(size: int) -> Handler:
    async def handle(reader, writer, path):
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        await _stream_metrics_lines(writer, size)
    return handle


def gzip_bomb(decoded_size: int) -> Handler:
    payload = gzip.compress(b"\0" * decoded_size, compresslevel=9)
    async def handle(reader, writer, path):
        writer.write(response(payload, headers={"Content-Encoding": "gzip"}))
    return handle


def headers_then_stall(length: int = 100_000) -> Handler:
    """Slow loris from the server side: a 200 and its headers, then nothing."""
    async def handle(reader, writer, path):
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {length}\r\n\r\n".encode())
        await writer.drain()
        await asyncio.sleep(3600)
    return handle


def huge_unannounced(size: int) -> Handler:
    """A body of `size` bytes with no Content-Length (ends at close): only a streaming cap stops it."""
    async def handle(reader, writer, path):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        await _stream_metrics_lines(writer, size)
        writer.close()
    return handle


def gzip_bomb_streamed(decoded_size: int) -> Handler:
    """Like `gzip_bomb`, but compressed in 1 MiB steps so a large bomb costs the test no memory."""
    import zlib
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * 2**20
    parts = [z.compress(zeros) for _ in range(decoded_size // 2**20)]
    payload = b"".join(parts) + z.flush()
    async def handle(reader, writer, path):
        writer.write(response(payload, headers={"Content-Encoding": "gzip"}))
    return handle


def flapping(good: Handler, bad: Handler) -> Handler:
    """Alternates `good` and `bad` on every /metrics request (other paths always `good`)."""
    n = [0]
    async def handle(reader, writer, path):
        if path == "/metrics":
            n[0] += 1
            await (good if n[0] % 2 else bad)(reader, writer, path)
        else:
            await good(reader, writer, path)
    return handle


class Switch:
    """A handler whose behaviour the test swaps while the server runs (a restart, a redeploy)."""

    def __init__(self, current: Handler) -> None:
        self.current = current

    async def __call__(self, reader, writer, path):
        await self.current(reader, writer, path)


class Site:
    """One loopback HTTP server; `handler` answers every request (keep-alive supported)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[str] = []
        self.connections = 0                  # TCP connections accepted
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.decode("latin-1").split()
                path = parts[1].split("?")[0] if len(parts) > 1 else "/"
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                self.requests.append(path)
                await self.handler(reader, writer, path)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Site":
        self.thread.start()
        self._ready.wait(5)
        return self

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
