"""vLLM pods found through the Kubernetes API, as a target source.

Why watch, not poll: a fleet daemon asks its sources for targets every scrape cycle, and a list of
every pod every 15 s is a load on the API server that grows with the cluster. Here two background
threads each list once, then follow a watch stream from the list's `resourceVersion` (the
informer pattern of client-go): pods in the configured namespace matching the label selector, and
nodes, whose `nvidia.com/gpu.product` label (GPU feature discovery) or
`cloud.google.com/gke-accelerator` label names the GPU. A watch that ends is resumed from the last
`resourceVersion` seen (bookmarks included); `410 Gone` (the version was compacted away) means
events were lost, so the thread lists afresh. Any other failure is reported through `on_error`,
the last good state is kept, and the thread retries with exponential backoff (1 s .. 60 s).

What becomes a target: a pod in phase Running, with a pod IP, whose `Ready` condition is True and
that is not being deleted. Its URL is `scheme://podIP:port`. Hints, first found wins:

* annotations, then labels, `vllm-drift.io/{gpu,tp,pp,model,quantization,max-num-seqs,
  max-num-batched-tokens,port,scheme}`;
* the vLLM container's command + args (`--tensor-parallel-size`/`-tp`, `--max-num-seqs`,
  `--model` or the positional model of `vllm serve`, `--served-model-name`, `--port`, ...);
* the node's GPU product label, mapped onto our GPU catalog;
* the config's `kubernetes.port` and `kubernetes.scheme`.

Client: the official `kubernetes` package (the `[kubernetes]` extra: `pip install
'vllm-drift[kubernetes]'`), imported only when this source is configured; without it a `kubernetes:`
config is rejected with a one-line error naming the extra (`require_client`). Its
configuration comes from `kubernetes.kubeconfig` if set, else the in-cluster service account when
`KUBERNETES_SERVICE_HOST` is set, else `$KUBECONFIG` / `~/.kube/config`. Needs RBAC `get, list,
watch` on pods (and on nodes for GPU hints; without it targets still come, with no GPU hint).
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import structlog
from pydantic import ValidationError

from exporter.config import KubernetesConfig, TargetSpec
from exporter.discovery.vllm_args import parse_vllm_args, token_count
from exporter.model.architectures import QUANT_BYTES_PER_PARAM, known_quantization
from exporter.telemetry.gpu_product import catalog_gpu

log = structlog.get_logger("vllm_drift.kubernetes")

ANNOTATION_PREFIX = "vllm-drift.io/"
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "cloud.google.com/gke-accelerator")
# hint key -> (annotation/label suffix, type)
_POD_HINTS: dict[str, tuple[str, Any]] = {
    "gpu": ("gpu", str), "tp": ("tp", int), "pp": ("pp", int), "model": ("model", str),
    "quantization": ("quantization", str), "max_num_seqs": ("max-num-seqs", int),
    "max_num_batched_tokens": ("max-num-batched-tokens", token_count), "port": ("port", int),
    "scheme": ("scheme", str),
}
# argv hints that are not TargetSpec fields ride along as string labels
_ARG_LABELS = ("served_model_name", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype",
               "enable_prefix_caching", "dtype", "block_size", "enforce_eager", "expert_parallel",
               "async_scheduling", "limit_mm_per_prompt", "mm_max_pixels", "skip_mm_profiling",
               "speculative_config", "cpu_offload_gb", "enable_lora", "max_loras", "max_lora_rank",
               "fully_sharded_loras")
_SPEC_FIELDS = ("gpu", "tp", "pp", "dp", "model", "quantization", "max_num_seqs", "max_num_batched_tokens")


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What this source keeps of one pod: enough to build its target, nothing more."""

    namespace: str
    name: str
    node: str | None
    ip: str | None
    ready: bool
    hints: dict[str, Any] = field(default_factory=dict)     # from annotations/labels, then args
    labels: dict[str, str] = field(default_factory=dict)    # extra string hints
    problems: tuple[str, ...] = ()                          # hint values that did not convert


def _pod_ready(pod: dict[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _vllm_container(pod: dict[str, Any], port: int) -> dict[str, Any] | None:
    """The container serving vLLM: the one exposing the configured port, else the first whose
    image or argv mentions vllm, else the first."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for c in containers:
        if any(p.get("containerPort") == port for p in c.get("ports") or ()):
            return c
    for c in containers:
        text = " ".join([c.get("image") or "", *(c.get("command") or ()), *(c.get("args") or ())])
        if "vllm" in text.lower():
            return c
    return containers[0] if containers else None


def pod_target(pod: dict[str, Any], default_port: int) -> PodTarget:
    """Reduce a pod (API JSON) to its target facts and hints. Pure."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    pod_labels = meta.get("labels") or {}
    hints: dict[str, Any] = {}
    labels: dict[str, str] = {}
    problems: list[str] = []
    container = _vllm_container(pod, default_port)
    if container is not None:
        argv = [*(container.get("command") or ()), *(container.get("args") or ())]
        for key, value in parse_vllm_args(argv).items():
            if key == "quantization" and not known_quantization(str(value)):
                labels[key] = str(value)    # the server runs it; the calculator's note will say it cannot size it
            elif key in _SPEC_FIELDS or key == "port":
                hints[key] = value
            elif key in _ARG_LABELS:
                labels[key] = str(value).lower() if isinstance(value, bool) else str(value)
        labels["container"] = str(container.get("name") or "")
    for key, (suffix, conv) in _POD_HINTS.items():
        for source in (annotations, pod_labels):     # annotations first: they override labels
            raw = source.get(ANNOTATION_PREFIX + suffix)
            if raw is None:
                continue
            try:
                value = conv(str(raw).strip())
            except ValueError:
                problems.append(f"{ANNOTATION_PREFIX}{suffix}={raw!r} is not {conv.__name__}")
                continue
            if key == "quantization" and not known_quantization(value):
                problems.append(f"{ANNOTATION_PREFIX}{suffix}={raw!r} is not a quantization scheme the "
                                f"calculator knows ({', '.join(k for k in QUANT_BYTES_PER_PARAM if k)})")
                continue
            hints[key] = value
            break
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    labels.update(namespace=ns, pod=name)
    node = spec.get("nodeName")
    if node:
        labels["node"] = str(node)
    return PodTarget(ns, name, node, status.get("podIP"), _pod_ready(pod), hints, labels, tuple(problems))


def target_spec(pod: PodTarget, gpu_product: str | None, cfg: KubernetesConfig) -> TargetSpec:
    """The target of a ready pod. Raises ValueError when the pod cannot make a valid target."""
    hints = dict(pod.hints)
    port = hints.pop("port", None) or cfg.port
    scheme = hints.pop("scheme", None) or cfg.scheme
    labels = dict(pod.labels)
    if gpu_product:
        labels["gpu_product"] = gpu_product
    if "gpu" in hints:
        hints["gpu"] = catalog_gpu(hints["gpu"]) or hints["gpu"]
    elif gpu_product and (known := catalog_gpu(gpu_product)):
        hints["gpu"] = known
    host = f"[{pod.ip}]" if pod.ip and ":" in pod.ip else pod.ip
    try:
        return TargetSpec(url=f"{scheme}://{host}:{port}", name=f"{pod.namespace}/{pod.name}",
                          labels=labels, source="kubernetes", **hints)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "target"
        raise ValueError(f"pod {pod.namespace}/{pod.name}: {where}: {err['msg'].removeprefix('Value error, ')}") from None


MISSING_CLIENT = ("needs the Kubernetes client, an optional extra not installed here: "
                  "pip install 'vllm-drift[kubernetes]'")


def require_client() -> None:
    """Raise `ValueError(MISSING_CLIENT)` unless the `kubernetes` package can be imported (checked
    without importing it: the config validator calls this and the client is slow to import)."""
    try:
        found = importlib.util.find_spec("kubernetes") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ValueError(MISSING_CLIENT)


def _load_api(cfg: KubernetesConfig) -> Any:
    """A CoreV1Api on its own ApiClient (the global default configuration is left alone)."""
    try:
        from kubernetes import client, config  # lazy: the daemon runs without the package otherwise
    except ImportError:
        raise ValueError(MISSING_CLIENT) from None

    conf = client.Configuration()
    if cfg.kubeconfig:
        if not os.path.isfile(cfg.kubeconfig):
            raise FileNotFoundError(f"kubernetes.kubeconfig: {cfg.kubeconfig}: no such file")
        config.load_kube_config(config_file=cfg.kubeconfig, client_configuration=conf, persist_config=False)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=conf)
    else:
        config.load_kube_config(client_configuration=conf, persist_config=False)
    return client.CoreV1Api(client.ApiClient(conf))


def _iter_lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited watch events of a streaming urllib3 response."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1:]
            if line.strip():
                yield line
    if buf.strip():
        yield buf


class _Watcher(threading.Thread):
    """List, then watch, one kind of object; apply events to the owner's state."""

    def __init__(self, owner: "KubernetesSource", kind: str) -> None:
        super().__init__(name=f"k8s-watch-{kind}", daemon=True)
        self.owner, self.kind = owner, kind
        self.resp: Any = None
        self.synced = threading.Event()
        self.lists = 0

    def _call(self, api: Any, **kw: Any) -> Any:
        cfg = self.owner.cfg
        if self.kind == "nodes":
            return api.list_node(_preload_content=False, **kw)
        if cfg.namespace:
            return api.list_namespaced_pod(cfg.namespace, label_selector=cfg.label_selector or None,
                                           _preload_content=False, **kw)
        return api.list_pod_for_all_namespaces(label_selector=cfg.label_selector or None,
                                               _preload_content=False, **kw)

    def _list(self, api: Any) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"limit": 500, "_request_timeout": (10, 60)}
            if token:
                kw["_continue"] = token
            resp = self._call(api, **kw)
            try:
                doc = json.loads(resp.data)
            finally:
                resp.release_conn()
            items.extend(doc.get("items") or ())
            meta = doc.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self.lists += 1
                return items, str(meta.get("resourceVersion") or "")

    def _watch(self, api: Any, rv: str) -> str:
        timeout = self.owner.watch_timeout
        self.resp = resp = self._call(api, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                      timeout_seconds=int(timeout), _request_timeout=(10, timeout + 30))
        try:
            for line in _iter_lines(resp):
                if self.owner.stopping.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(obj.get("message") or "resource version too old")
                    raise RuntimeError(f"watch error {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind != "BOOKMARK":
                    self.owner._apply(self.kind, kind, obj)
        finally:
            self.resp = None
            resp.release_conn()
        return rv

    def run(self) -> None:
        from urllib3.exceptions import ProtocolError, ReadTimeoutError

        owner, backoff = self.owner, 1.0
        while not owner.stopping.is_set():
            try:
                api = owner._api()
                items, rv = self._list(api)
                owner._replace(self.kind, items)
                self.synced.set()
                backoff = 1.0
                while not owner.stopping.is_set():
                    try:
                        rv = self._watch(api, rv)
                    except (ReadTimeoutError, ProtocolError):
                        if owner.stopping.is_set():
                            break
                        continue          # an idle or dropped stream: resume from rv
            except _Gone as exc:
                log.info("watch expired; listing again", kind=self.kind, detail=str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - reported, retried; never kills the daemon
                if owner.stopping.is_set():
                    break
                status = getattr(exc, "status", None)
                if status == 410:
                    continue
                if status == 401:             # a rotated token: read the credentials again
                    with owner._lock:
                        owner._api_obj = None
                owner._report(self.kind, _describe(exc))
                owner.stopping.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, owner.backoff_max)

    def interrupt(self) -> None:
        resp = self.resp
        if resp is None:
            return
        try:
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            if sock is not None:
                import socket
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        reason = getattr(exc, "reason", "") or ""
        body = getattr(exc, "body", None)
        message = ""
        if body:
            try:
                message = json.loads(body).get("message") or ""
            except (ValueError, AttributeError, TypeError):
                message = str(body)[:200]
        return f"HTTP {status} {reason}{': ' + message if message else ''}".strip()
    return f"{type(exc).__name__}: {exc}"


class KubernetesSource:
    """Pods from the Kubernetes API, kept current by watches (see the module docstring)."""

    name = "kubernetes"

    def __init__(self, cfg: KubernetesConfig, *, on_error: Callable[[str, str], None] | None = None,
                 watch_timeout: float = 300.0, backoff_max: float = 60.0, watch_nodes: bool = True) -> None:
        self.cfg = cfg
        self.on_error = on_error
        self.watch_timeout = watch_timeout
        self.backoff_max = backoff_max
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._pods: dict[str, PodTarget] = {}
        self._nodes: dict[str, str | None] = {}
        self._version = 0
        self._built: tuple[int, list[TargetSpec]] = (-1, [])
        self._reported: set[str] = set()
        self._api_obj: Any = None
        self.errors: dict[str, float] = {}
        self.last_error: str | None = None
        self.pods_watcher = _Watcher(self, "pods")
        self.nodes_watcher = _Watcher(self, "nodes") if watch_nodes else None
        self.pods_watcher.start()
        if self.nodes_watcher is not None:
            self.nodes_watcher.start()

    # --------------------------------------------------------------- state
    def _api(self) -> Any:
        with self._lock:
            if self._api_obj is None:
                self._api_obj = _load_api(self.cfg)
            return self._api_obj

    def _report(self, kind: str, message: str) -> None:
        msg = f"kubernetes {kind}: {message}"
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0.0) + 1.0
            self.last_error = msg
        if self.on_error:
            self.on_error("kubernetes", msg)
        else:
            log.warning("kubernetes discovery failed", kind=kind, error=msg)

    def _node_entry(self, node: dict[str, Any]) -> tuple[str, str | None]:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        product = next((labels[k] for k in GPU_PRODUCT_LABELS if labels.get(k)), None)
        return str(meta.get("name") or ""), product

    def _pod_entry(self, pod: dict[str, Any]) -> tuple[str, PodTarget]:
        target = pod_target(pod, self.cfg.port)
        return f"{target.namespace}/{target.name}", target

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        if kind == "nodes":
            nodes = dict(self._node_entry(n) for n in items)
            with self._lock:
                self._nodes = nodes
                self._version += 1
        else:
            pods = dict(self._pod_entry(p) for p in items)
            with self._lock:
                self._pods = pods
                self._version += 1

    def _apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        if kind == "nodes":
            name, product = self._node_entry(obj)
            with self._lock:
                if event == "DELETED":
                    self._nodes.pop(name, None)
                elif self._nodes.get(name, "\0") != product:
                    self._nodes[name] = product
                else:
                    return
                self._version += 1
            return
        key, target = self._pod_entry(obj)
        with self._lock:
            if event == "DELETED":
                if self._pods.pop(key, None) is None:
                    return
            elif self._pods.get(key) == target:
                return                         # status churn that changes nothing we use
            else:
                self._pods[key] = target
            self._version += 1

    # --------------------------------------------------------------- Source
    def targets(self) -> list[TargetSpec]:
        with self._lock:
            version, pods, nodes = self._version, list(self._pods.values()), dict(self._nodes)
            if self._built[0] == version:
                return self._built[1]
        out: list[TargetSpec] = []
        for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
            if not pod.ready:
                continue
            for problem in pod.problems:
                self._report_once(f"pod {pod.namespace}/{pod.name}: {problem}")
            try:
                out.append(target_spec(pod, nodes.get(pod.node) if pod.node else None, self.cfg))
            except ValueError as exc:
                self._report_once(str(exc))
        with self._lock:
            self._built = (version, out)
        return out

    def _report_once(self, message: str) -> None:
        if message in self._reported:
            return
        self._reported.add(message)
        self._report("pods", message)

    def wait_synced(self, timeout: float) -> bool:
        """True once pods (and nodes, when watched) have been listed at least once."""
        ok = self.pods_watcher.synced.wait(timeout)
        if ok and self.nodes_watcher is not None:
            ok = self.nodes_watcher.synced.wait(timeout)
        return ok

    def close(self) -> None:
        self.stopping.set()
        for w in (self.pods_watcher, self.nodes_watcher):
            if w is not None:
                w.interrupt()
        for w in (self.pods_watcher, self.nodes_watcher):
            if w is not None and w.is_alive():
                w.join(timeout=2.0)
