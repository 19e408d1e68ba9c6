"""A loopback HTTP server speaking the Kubernetes API's list and watch protocol for pods and nodes.

No API server binary runs on this machine, so discovery is tested against this one. It follows the
wire format of the real API (apiserver `v1` JSON): `PodList`/`NodeList` with
`metadata.resourceVersion` and `continue` paging, `?watch=true` streams of newline-delimited
`{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}` events sent chunked, resuming
after `resourceVersion`, and a `410 Gone` `Status` event when that version was compacted away.
Label selectors support `k=v`, `k==v`, `k!=v`, `k`, `!k`. Bearer-token auth as a kubeconfig sets it.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "test-token-7f3a"


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKubeAPI:
    """State of the fake cluster; mutate it with add/modify/delete, break it with fail/compact."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"pods": {}, "nodes": {}}
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []   # (rv, kind, type, object)
        self.compacted = 0
        self.generation = 0           # bumped to end every open watch
        self.fail_status = 0          # answer every request with this status while set
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "FakeKubeAPI":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.cond:
            self.generation += 1
            self.closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: str) -> str:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "loop", "cluster": {"server": self.url}}],
               "users": [{"name": "tester", "user": {"token": TOKEN}}],
               "contexts": [{"name": "test", "context": {"cluster": "loop", "user": "tester"}}]}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        return path

    # ------------------------------------------------------------ mutations
    @staticmethod
    def _key(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def _record(self, kind: str, typ: str, obj: dict[str, Any], *, silent: bool = False) -> None:
        with self.cond:
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            if typ == "DELETED":
                self.objects[kind].pop(self._key(obj), None)
            else:
                self.objects[kind][self._key(obj)] = obj
            if not silent:
                self.events.append((self.rv, kind, typ, obj))
            self.cond.notify_all()

    def add(self, kind: str, obj: dict[str, Any], *, silent: bool = False) -> None:
        self._record(kind, "ADDED", obj, silent=silent)

    def modify(self, kind: str, obj: dict[str, Any], *, silent: bool = False) -> None:
        self._record(kind, "MODIFIED", obj, silent=silent)

    def delete(self, kind: str, obj: dict[str, Any], *, silent: bool = False) -> None:
        self._record(kind, "DELETED", obj, silent=silent)

    def compact(self) -> None:
        """Forget every event so far and end the open watches: resuming from an old
        resourceVersion now gets 410 Gone, as after etcd compaction."""
        with self.cond:
            self.compacted = self.rv
            self.events.clear()
            self.generation += 1
            self.cond.notify_all()

    def count(self, kind: str, *, watch: bool) -> int:
        suffix = "/" + kind
        return sum(1 for path, q in self.requests if path.endswith(suffix)
                   and (q.get("watch", ["false"])[0] == "true") == watch)

    # ------------------------------------------------------------ HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                api.requests.append((parts.path, query))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._json(401, status(401, "Unauthorized", "Unauthorized"))
                if api.fail_status:
                    return self._json(api.fail_status, status(api.fail_status, "InternalError",
                                                              "etcdserver: request timed out"))
                segs = parts.path.strip("/").split("/")
                namespace = None
                if segs[:2] != ["api", "v1"]:
                    return self._json(404, status(404, "NotFound", "the server could not find the requested resource"))
                if len(segs) == 5 and segs[2] == "namespaces" and segs[4] == "pods":
                    kind, namespace = "pods", segs[3]
                elif len(segs) == 3 and segs[2] in ("pods", "nodes"):
                    kind = segs[2]
                else:
                    return self._json(404, status(404, "NotFound", "the server could not find the requested resource"))
                selector = query.get("labelSelector", [""])[0]

                def wanted(obj: dict[str, Any]) -> bool:
                    meta = obj["metadata"]
                    if namespace is not None and meta.get("namespace") != namespace:
                        return False
                    return selector_matches(selector, meta.get("labels") or {})

                if query.get("watch", ["false"])[0] == "true":
                    return self._watch(kind, wanted, query)
                with api.cond:
                    items = sorted((o for o in api.objects[kind].values() if wanted(o)), key=api._key)
                    rv = api.rv
                limit = int(query.get("limit", ["0"])[0] or 0)
                start = int(query.get("continue", ["0"])[0] or 0)
                page = items[start:start + limit] if limit else items[start:]
                meta: dict[str, Any] = {"resourceVersion": str(rv)}
                if limit and start + limit < len(items):
                    meta["continue"] = str(start + limit)
                self._json(200, {"kind": "PodList" if kind == "pods" else "NodeList", "apiVersion": "v1",
                                 "metadata": meta, "items": page})

            def _chunk(self, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _watch(self, kind: str, wanted: Any, query: dict[str, list[str]]) -> None:
                since = int(query.get("resourceVersion", ["0"])[0] or 0)
                timeout = float(query.get("timeoutSeconds", ["30"])[0])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                import time
                deadline = time.monotonic() + timeout
                with api.cond:
                    generation = api.generation
                    if since < api.compacted:
                        self._chunk({"type": "ERROR", "object": status(
                            410, "Expired", f"too old resource version: {since} ({api.compacted})")})
                        self.wfile.write(b"0\r\n\r\n")
                        return
                try:
                    while True:
                        with api.cond:
                            batch = [(rv, t, o) for rv, k, t, o in api.events if k == kind and rv > since]
                            if not batch:
                                remaining = deadline - time.monotonic()
                                if remaining <= 0 or api.generation != generation:
                                    break
                                api.cond.wait(min(remaining, 0.5))
                                continue
                        for rv, typ, obj in batch:
                            since = rv
                            if wanted(obj):
                                self._chunk({"type": typ, "object": obj})
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


def node(name: str, product: str | None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels["nvidia.com/gpu.product"] = product
        labels["nvidia.com/gpu.count"] = "8"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}}


def pod(name: str, *, namespace: str = "llm", ip: str | None = "10.1.0.5", node_name: str = "gpu-a",
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        args: list[str] | None = None, command: list[str] | None = None, phase: str = "Running",
        ready: bool = True, port: int = 8000) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai:v0.10.1",
                                 "ports": [{"containerPort": port, "name": "http", "protocol": "TCP"}]}
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    status_: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"}]}
    if ip:
        status_["podIP"] = ip
        status_["podIPs"] = [{"ip": ip}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "labels": labels if labels is not None else {"app": "vllm"},
                         "annotations": annotations or {}},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "istio-proxy", "image": "istio/proxyv2:1.22", "ports": [{"containerPort": 15090}]},
                container]},
            "status": status_}
