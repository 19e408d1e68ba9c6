"""GPU telemetry from NVIDIA's DCGM exporter, joined to vLLM targets.

Why: vLLM's `/metrics` says nothing about the hardware, yet the calculator needs the GPU model,
and "idle capacity" is better judged against what the GPU actually does. dcgm-exporter (one per
GPU node, port 9400) publishes per-GPU series labelled with `modelName` ("NVIDIA H100 80GB HBM3"),
`Hostname`, `UUID`, `gpu`, and — with its Kubernetes pod mapping on — the `namespace`, `pod` and
`container` using the GPU. Read here, straight from the exporters or from Prometheus:

* `DCGM_FI_DEV_FB_USED` / `DCGM_FI_DEV_FB_FREE` (MiB): memory in use, and the total;
* `DCGM_FI_PROF_SM_ACTIVE` (ratio, profiling metrics) or else `DCGM_FI_DEV_GPU_UTIL` (percent):
  utilisation;
* `modelName`, mapped onto our GPU catalog (`exporter.telemetry.gpu_product.catalog_gpu`).

Joining a target to its GPUs, first rule that matches wins: the pod (`namespace` + `pod` labels
the Kubernetes discovery puts on a target) against DCGM's pod mapping; the node (`node` label)
against DCGM's `Hostname`; the host of the target's URL against the host of the DCGM exporter
that reported the GPU (a sidecar or a single-node server). Pure except `DCGMSource.refresh`.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from exporter.config import DCGMConfig, TargetSpec
from exporter.errors import ParseError
from exporter.parse.exposition import Reader
from exporter.telemetry.gpu_product import catalog_gpu

FIELDS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE")
_READER = Reader(FIELDS)
MIB = 2**20


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as one DCGM exporter reports it."""

    uuid: str
    index: str
    model_name: str | None           # DCGM's modelName
    hostname: str | None
    source_host: str | None          # host of the exporter URL (or Prometheus instance) it came from
    namespace: str | None = None
    pod: str | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    sm_active: float | None = None   # 0..1
    gpu_util: float | None = None    # 0..1 (DCGM_FI_DEV_GPU_UTIL / 100)

    @property
    def utilization(self) -> float | None:
        return self.sm_active if self.sm_active is not None else self.gpu_util


@dataclass(frozen=True, slots=True)
class TargetGpus:
    """What the GPUs joined to one target say."""

    count: int
    model_name: str | None           # the most common modelName among them
    catalog_gpu: str | None          # that model in our catalog, if known
    utilization: float | None        # mean over the GPUs that report it, 0..1
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    joined_by: str                   # "pod", "node" or "host"


def _host(url_or_instance: str) -> str | None:
    text = url_or_instance if "://" in url_or_instance else f"//{url_or_instance}"
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


def readings_from_series(series: Iterable[tuple[str, Mapping[str, str], float]], source_host: str | None) -> list[GpuReading]:
    """(field name, labels, value) -> one reading per GPU (keyed by UUID, else host + index)."""
    acc: dict[tuple, dict] = {}
    for name, labels, value in series:
        if name not in FIELDS:
            continue
        host = source_host or (_host(labels["instance"]) if labels.get("instance") else None)
        uuid = labels.get("UUID") or labels.get("uuid") or ""
        key = (uuid,) if uuid else (labels.get("Hostname"), host, labels.get("gpu"))
        row = acc.setdefault(key, {"uuid": uuid, "index": labels.get("gpu", ""), "model_name": labels.get("modelName"),
                                   "hostname": labels.get("Hostname"), "source_host": host,
                                   "namespace": labels.get("namespace") or labels.get("exported_namespace"),
                                   "pod": labels.get("pod") or labels.get("exported_pod")})
        if name == "DCGM_FI_DEV_FB_USED":
            row["fb_used_mib"] = value
        elif name == "DCGM_FI_DEV_FB_FREE":
            row["fb_free_mib"] = value
        elif name == "DCGM_FI_PROF_SM_ACTIVE":
            row["sm_active"] = value
        elif name == "DCGM_FI_DEV_GPU_UTIL":
            row["gpu_util"] = value / 100.0
    return [GpuReading(**row) for row in acc.values()]


def parse_dcgm(text: str | bytes, source_host: str | None) -> list[GpuReading]:
    """A dcgm-exporter `/metrics` body -> readings. ParseError on a malformed DCGM line."""
    families = _READER.parse(text)
    return readings_from_series(((s.name, s.labels, s.value) for f in families for s in f.samples), source_host)


class GpuIndex:
    """Readings indexed by pod, node and host, so joining a fleet costs one lookup per target."""

    def __init__(self, readings: Iterable[GpuReading]) -> None:
        self.by_pod: dict[tuple[str, str], list[GpuReading]] = {}
        self.by_node: dict[str, list[GpuReading]] = {}
        self.by_host: dict[str, list[GpuReading]] = {}
        for r in readings:
            if r.pod and r.namespace:
                self.by_pod.setdefault((r.namespace, r.pod), []).append(r)
            if r.hostname:
                self.by_node.setdefault(r.hostname, []).append(r)
                self.by_host.setdefault(r.hostname, []).append(r)
            if r.source_host and r.source_host != r.hostname:
                self.by_host.setdefault(r.source_host, []).append(r)

    def join(self, spec: TargetSpec) -> TargetGpus | None:
        """The GPUs of one target (see the module docstring for the rules)."""
        labels = spec.labels
        if labels.get("pod") and labels.get("namespace"):
            gpus = self.by_pod.get((labels["namespace"], labels["pod"]))
            if gpus:
                return summarise(gpus, "pod")
        if labels.get("node") and (gpus := self.by_node.get(labels["node"])):
            return summarise(gpus, "node")
        host = _host(spec.url)
        if host and (gpus := self.by_host.get(host)):
            return summarise(gpus, "host")
        return None


def join(spec: TargetSpec, readings: Iterable[GpuReading]) -> TargetGpus | None:
    """The GPUs of one target, from a one-off index of `readings`."""
    return GpuIndex(readings).join(spec)


def summarise(gpus: list[GpuReading], how: str) -> TargetGpus:
    names = Counter(g.model_name for g in gpus if g.model_name)
    model = names.most_common(1)[0][0] if names else None
    utils = [g.utilization for g in gpus if g.utilization is not None]
    used = [g.fb_used_mib for g in gpus if g.fb_used_mib is not None]
    total = [g.fb_used_mib + g.fb_free_mib for g in gpus if g.fb_used_mib is not None and g.fb_free_mib is not None]
    return TargetGpus(len(gpus), model, catalog_gpu(model), sum(utils) / len(utils) if utils else None,
                      sum(used) * MIB if used else None, sum(total) * MIB if total else None, how)


class DCGMSource:
    """Keeps the latest readings of every configured DCGM exporter (or of Prometheus), refreshed
    at most every `interval`; a failing exporter keeps its last readings and is reported."""

    def __init__(self, cfg: DCGMConfig, *, on_error: Callable[[str, str], None] | None = None) -> None:
        self.cfg = cfg
        self.on_error = on_error
        self.readings: dict[str, list[GpuReading]] = {}     # source -> readings
        self.index = GpuIndex(())
        self.refreshed_at = 0.0

    def due(self, now: float) -> bool:
        return now - self.refreshed_at >= self.cfg.interval

    async def refresh(self, scraper, prom_api=None) -> None:
        """`scraper` is the daemon's `Scraper`; `prom_api` a `PromAPI` when `from_prometheus`."""
        import asyncio

        from exporter.scrape import ScrapeError

        self.refreshed_at = time.time()

        async def one(url: str) -> None:
            try:
                fetched = await scraper.fetch(url.rstrip("/") + "/metrics")
                self.readings[url] = parse_dcgm(fetched.body, _host(url))
            except (ScrapeError, ParseError) as exc:
                self._report(f"{url}: {exc}")

        jobs = [one(u) for u in self.cfg.urls]
        if self.cfg.from_prometheus:
            if prom_api is not None:
                jobs.append(self._from_prometheus(prom_api))
            else:
                self._report("dcgm.from_prometheus needs the prometheus: section (query mode)")
        await asyncio.gather(*jobs)
        self.index = GpuIndex(self.all_readings())

    async def _from_prometheus(self, api) -> None:
        from exporter.query.client import QueryError

        sel = self.cfg.selector.strip()[1:-1].strip().rstrip(",")
        matchers = ",".join(p for p in (f'__name__=~"{"|".join(FIELDS)}"', sel) if p)
        try:
            vector = await api.instant("{" + matchers + "}")
        except QueryError as exc:
            self._report(f"prometheus: {exc}")
            return
        self.readings["prometheus"] = readings_from_series(
            ((s.labels.get("__name__", ""), s.labels, s.value) for s in vector), None)

    def _report(self, message: str) -> None:
        if self.on_error:
            self.on_error("dcgm", message)

    def all_readings(self) -> list[GpuReading]:
        return [r for rs in self.readings.values() for r in rs]
