"""A loopback stand-in for the Hugging Face Hub's file API, for `huggingface_hub` itself to talk to.

Serves `/{repo}/resolve/{revision}/{filename}` as the Hub does for small (non-LFS, non-Xet) files:
HEAD and GET with `ETag`, `X-Repo-Commit` and `Content-Length`, HTTP range reads (206 with
`Content-Range`, which `get_safetensors_metadata` uses to read only a header), and 404 with
`X-Error-Code: EntryNotFound` / `RepositoryNotFound` so the client raises the same errors it
raises against the real Hub. Also: header-only safetensors files built from a tensor list (the
tensor data is never read by anything under test, so the files stop after the header).
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from math import prod
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1, "I64": 8}


def safetensors_header_only(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """The first bytes of a safetensors file: 8-byte length + JSON header with real offsets."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        n = int(prod(shape) * _SIZE[dtype])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def sharded(tensors: dict[str, tuple[str, list[int]]], shards: int) -> dict[str, bytes]:
    """model-0000i-of-0000n.safetensors files plus model.safetensors.index.json."""
    names = list(tensors)
    per = -(-len(names) // shards)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
        files[fname] = safetensors_header_only(part)
        weight_map.update({n: fname for n in part})
        total += sum(int(prod(s) * _SIZE[d]) for d, s in part.values())
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}).encode()
    return files


class FakeHub:
    """`repos`: repo id -> {filename: bytes}. `requests` records (method, path, Range header)."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        self.gate: threading.Event | None = None   # when set to an Event, answers wait for it
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _serve(self, head: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if hub.gate is not None:
                    hub.gate.wait(10)
                m = re.match(r"^/(?:api/models/)?(.+?)/resolve/([^/]+)/(.+?)(\?.*)?$", self.path)
                if not m:
                    return self._error(404, "RepositoryNotFound", head)
                repo, _, filename = m.group(1), m.group(2), m.group(3)
                if repo not in hub.repos:
                    return self._error(404, "RepositoryNotFound", head)
                body = hub.repos[repo].get(filename)
                if body is None:
                    return self._error(404, "EntryNotFound", head)
                status, headers = 200, {}
                rng = self.headers.get("Range")
                if rng and (r := re.match(r"bytes=(\d+)-(\d*)", rng)):
                    start = int(r.group(1))
                    end = min(int(r.group(2)) if r.group(2) else len(body) - 1, len(body) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
                    status, part = 206, body[start:end + 1]
                else:
                    part = body
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(part)))
                self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(part)

            def _error(self, code: int, error_code: str, head: bool):
                body = json.dumps({"error": error_code}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Error-Code", error_code)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def hf_cache_entry(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """Write files in the HF cache layout: models--org--name/{blobs,refs/main,snapshots/<rev>/}
    with the snapshot files as symlinks to content-addressed blobs, as huggingface_hub does."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(Path("../..") / "blobs" / blob.name if "/" not in name
                            else blob.resolve())
    return snap
