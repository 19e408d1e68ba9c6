"""The GPU telemetry families of the daemon's `/metrics` (only registered when `dcgm:` is set).

A separate collector so GPU telemetry stays optional: the daemon swaps in a new immutable view
(target -> `TargetGpus`) each cycle, and the exposition renders it with everything else.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.telemetry.dcgm import TargetGpus


class GpuCollector(Collector):
    def __init__(self) -> None:
        self.view: Mapping[str, TargetGpus] = {}

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily("vllm_drift_gpu_info", "GPU model of a target as DCGM reports it, "
                                 "with its GPU catalog name and how it was joined (always 1).",
                                 labels=["target", "gpu_model", "catalog_gpu", "joined_by"])
        count = GaugeMetricFamily("vllm_drift_gpu_count", "GPUs DCGM reports for a target.", labels=["target"])
        util = GaugeMetricFamily("vllm_drift_gpu_utilization_ratio", "Mean GPU utilisation of a target's GPUs "
                                 "(DCGM SM active, else GPU_UTIL/100).", labels=["target"])
        used = GaugeMetricFamily("vllm_drift_gpu_memory_used_bytes", "GPU memory in use on a target's GPUs.",
                                 labels=["target"])
        total = GaugeMetricFamily("vllm_drift_gpu_memory_total_bytes", "GPU memory of a target's GPUs.",
                                  labels=["target"])
        for target, g in sorted(self.view.items()):
            info.add_metric([target, g.model_name or "unknown", g.catalog_gpu or "unknown", g.joined_by], 1.0)
            count.add_metric([target], float(g.count))
            if g.utilization is not None:
                util.add_metric([target], g.utilization)
            if g.memory_used_bytes is not None:
                used.add_metric([target], g.memory_used_bytes)
            if g.memory_total_bytes is not None:
                total.add_metric([target], g.memory_total_bytes)
        yield from (info, count, util, used, total)
