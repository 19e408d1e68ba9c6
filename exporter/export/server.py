"""The daemon's HTTP endpoints, served from a thread so a busy scrape cycle never delays them.

`/metrics` returns bytes rendered at the end of the last cycle; `/api/v1/findings` a JSON document
built at the same time. TLS (optionally requiring client certificates) and basic auth with bcrypt
hashes follow Prometheus' web configuration; `/-/healthy` may stay open by choice. `/` is a status
page (export/status_page.py) built from the same two documents, behind the same TLS and auth.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Callable

import structlog

from exporter import __version__, buildinfo
from exporter.config import WebConfig
from exporter.export import status_page
from exporter.export.findings import QueryError, parse_query
from exporter.export.render import coalesced, send_parts

log = structlog.get_logger("vllm_drift.http")

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"
INLINE_GZIP_MAX = 256 * 1024   # larger /metrics bodies are gzipped once per publish, off the request path
# The status page runs no script and loads nothing: its inline stylesheet is all it may use.
PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


class Published:
    """Everything the endpoints serve, swapped as a whole by the daemon (reads need no lock).

    `findings`/`targets` are the full JSON documents; `findings_index`/`targets_index`
    (exporter/export/findings.py), when set, build them on request, filtered and paginated."""

    def __init__(self, metrics: Callable[[], bytes | tuple[bytes, ...]],
                 metrics_gzip: Callable[[], bytes | tuple[bytes, ...] | None] | None = None) -> None:
        # the body, as bytes or as parts written one after the other (no copy of a large body)
        self.metrics = metrics
        self.metrics_gzip = metrics_gzip     # the gzip body if ready, else None (exporter/export/cache.py)
        self._findings: bytes = b'{"targets": []}'
        self._targets: bytes = b'{"targets": []}'
        self.findings_index = None
        self.targets_index = None
        self.ready = False
        self.reload: Callable[[], str] | None = None

    @property
    def findings(self) -> bytes:
        return self.findings_index.document() if self.findings_index is not None else self._findings

    @findings.setter
    def findings(self, value: bytes) -> None:
        self._findings, self.findings_index = value, None

    @property
    def targets(self) -> bytes:
        return self.targets_index.document() if self.targets_index is not None else self._targets

    @targets.setter
    def targets(self, value: bytes) -> None:
        self._targets, self.targets_index = value, None

    def api_document(self, which: str, query: str) -> tuple[int, bytes]:
        """(status, body) of `/api/v1/findings` or `/api/v1/targets` with its query string."""
        index = self.findings_index if which == "findings" else self.targets_index
        if index is None:
            return 200, self.findings if which == "findings" else self.targets
        try:
            return 200, index.document(parse_query(query))
        except QueryError as exc:
            return 400, json.dumps({"error": str(exc)}).encode()


class Authenticator:
    """Basic auth against bcrypt hashes. A verified (user, password) pair is remembered by its
    SHA-256 so bcrypt's deliberate slowness is paid once, not on every scrape."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = {u: h.encode() for u, h in users.items()}
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()
        # A dummy hash to spend the same time on unknown users as on known ones.
        import bcrypt

        self._bcrypt = bcrypt
        self._dummy = bcrypt.hashpw(b"vllm-drift", bcrypt.gensalt(rounds=4))

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        token = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if any(hmac.compare_digest(token, known) for known in self._ok):
                return True
        hashed = self.users.get(user)
        try:
            ok = self._bcrypt.checkpw(password.encode(), hashed if hashed else self._dummy) and hashed is not None
        except ValueError:   # a malformed hash in the config
            ok = False
        if ok:
            with self._lock:
                self._ok.add(token)
        return ok


def _size(body: bytes | tuple[bytes, ...]) -> int:
    return len(body) if isinstance(body, bytes) else sum(map(len, body))


def make_handler(pub: Published, auth: Authenticator, web: WebConfig):
    status = status_page.Cached(version=__version__, revision=buildinfo.revision())

    class Handler(BaseHTTPRequestHandler):
        server_version = f"vllm-drift/{__version__}"
        protocol_version = "HTTP/1.1"
        timeout = 30   # a client that stalls mid-request is dropped, it cannot hold a thread

        def log_message(self, fmt: str, *args) -> None:  # quiet: access logs are not wanted
            pass

        def _send(self, code: int, body: bytes | tuple[bytes, ...], ctype: str,
                  extra: dict[str, str] | None = None) -> None:
            if "gzip" in (self.headers.get("Accept-Encoding") or "") and _size(body) > 1024:
                body = gzip.compress(body if isinstance(body, bytes) else b"".join(body), compresslevel=1)
                extra = {**(extra or {}), "Content-Encoding": "gzip"}
            self._send_raw(code, body, ctype, extra)

        def _send_raw(self, code: int, body: bytes | tuple[bytes, ...], ctype: str,
                      extra: dict[str, str] | None = None) -> None:
            parts = (body,) if isinstance(body, bytes) else body
            ends = list(accumulate(map(len, parts)))    # the length, and where send_parts is
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(ends[-1] if ends else 0))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            for k, val in (extra or {}).items():
                self.send_header(k, val)
            self.end_headers()
            if self.command == "HEAD":
                return
            if isinstance(self.connection, ssl.SSLSocket):   # no gather writes through TLS
                for piece in coalesced(parts):   # many small parts (a target's block each)
                    self.wfile.write(piece)
            else:
                send_parts(self.connection, parts, ends)

        def _send_metrics(self) -> None:
            """The cached gzip body when the client takes gzip and it is ready (compressed once per
            publish, not per request); otherwise the plain bytes."""
            if pub.metrics_gzip is not None and "gzip" in (self.headers.get("Accept-Encoding") or ""):
                gz = pub.metrics_gzip()
                if gz is not None:
                    self._send_raw(200, gz, CONTENT_TYPE_METRICS, {"Content-Encoding": "gzip"})
                    return
                body = pub.metrics()
                if _size(body) > INLINE_GZIP_MAX:   # being compressed in the background: send it plain
                    self._send_raw(200, body, CONTENT_TYPE_METRICS)
                    return
                self._send(200, body, CONTENT_TYPE_METRICS)
                return
            self._send(200, pub.metrics(), CONTENT_TYPE_METRICS)

        def _authorised(self, path: str) -> bool:
            if not auth.enabled or (path == "/-/healthy" and web.open_health):
                return True
            if auth.check(self.headers.get("Authorization")):
                return True
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                       {"WWW-Authenticate": 'Basic realm="vllm-drift"'})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorised(path):
                return
            if path == "/metrics":
                self._send_metrics()
            elif path == "/-/healthy":
                self._send(200, b"Healthy\n", "text/plain; charset=utf-8")
            elif path == "/-/ready":
                if pub.ready:
                    self._send(200, b"Ready\n", "text/plain; charset=utf-8")
                else:
                    self._send(503, b"Not ready: the first evaluation has not finished\n", "text/plain; charset=utf-8")
            elif path in ("/api/v1/findings", "/api/v1/targets"):
                code, body = pub.api_document(path.rsplit("/", 1)[1], self.path.partition("?")[2])
                self._send(code, body, "application/json")
            elif path == "/":
                page = status.page(pub.findings, pub.targets)
                self._send(200, page, "text/html; charset=utf-8", {"Content-Security-Policy": PAGE_CSP})
            else:
                self._send(404, b"Not found\n", "text/plain; charset=utf-8")

        do_HEAD = do_GET

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorised(path):
                return
            if path == "/-/reload" and pub.reload is not None:
                result = pub.reload()
                code = 200 if result == "ok" else 400
                self._send(code, json.dumps({"status": result}).encode(), "application/json")
            else:
                self._send(405, b"Method not allowed\n", "text/plain; charset=utf-8")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        """One structured line instead of socketserver's traceback on stderr: a client that fails
        the TLS handshake or hangs up must not be able to flood the log with stack traces."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)):
            log.debug("client went away", client=client_address[0], error=type(exc).__name__)
        else:
            log.warning("client connection failed", client=client_address[0],
                        error=f"{type(exc).__name__}: {exc}"[:200])


class _Server6(_Server):
    address_family = socket.AF_INET6


def tls_context(web: WebConfig) -> ssl.SSLContext | None:
    if not web.tls_cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(web.tls_cert_file, web.tls_key_file)
    if web.client_ca_file:
        ctx.load_verify_locations(web.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class HTTPServer:
    """Serves `Published` on HOST:PORT from a background thread."""

    def __init__(self, listen: str, pub: Published, web: WebConfig) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        self.auth = Authenticator(web.basic_auth_users)
        handler = make_handler(pub, self.auth, web)
        server_cls = _Server6 if ":" in host else _Server
        self.httpd = server_cls((host, int(port)), handler)
        ctx = tls_context(web)
        if ctx is not None:
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="vllm-drift-http", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
