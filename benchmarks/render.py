"""/metrics render cost at fleet size: the daemon's exposition (rendered once per publish from an
immutable FleetView, served as bytes) against a conventional exporter's (prometheus_client
`Gauge`s with labels, rendered on every request), same series, same process.

Reports come from the real pipeline: a simulated kv-pressure server scraped twice, parsed,
windowed and evaluated; the report is then given to N targets.

usage: .venv/bin/python benchmarks/render.py [N ...]   (default 1000 3000)
Prints figures and ratios; asserts nothing.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from exporter.config import Config, TargetSpec
from exporter.export.collector import Exposition, FleetView, TargetView
from exporter.parse import parse_vllm
from exporter.pipeline import Pipelines
from exporter.report import PARAMETERS
from exporter.sim.scenario import build, load_scenario


def one_report():
    """A kv-pressure server's evaluation over a full 10 min window (status ok, with findings)."""
    sc = load_scenario("kv-pressure")
    st = build(sc, seed=1, version="0.11.0")
    url = "http://10.0.0.1:8000"
    pipe = None
    for i in range(21):
        st.tick(30.0)
        snaps = parse_vllm(st.renderer.render(st.engine.metrics), target=url, timestamp=1000.0 + 30 * i)
        if pipe is None:
            pipe = Pipelines(Config()).pipeline(TargetSpec(url=url, gpu=sc.gpu), snaps[0].model_name, window_s=600.0)
        pipe.observe(snaps[0])
    return pipe.evaluate(None, 1600.0)


def fleet(report, n: int) -> FleetView:
    views = []
    for i in range(n):
        url = f"http://10.{i // 65536}.{(i // 256) % 256}.{i % 256}:8000"
        r = dataclasses.replace(report, target=url)
        views.append(TargetView(url, "static", True, 0.012, 1000.0, {"timeout": 1.0}, "0.11.0",
                                {r.model_name: "v1"}, (r,)))
    return FleetView(tuple(views), 1000.0, 0.5, 0.0, 0.0, 1000.0, {}, 1.0, 10.0, {}, True)


def conventional(view: FleetView) -> CollectorRegistry:
    """The same per-target series as stock labelled Gauges in a registry."""
    reg = CollectorRegistry()
    tm = ["target", "model_name"]
    g = {name: Gauge(name, name, labels, registry=reg) for name, labels in (
        ("vllm_drift_target_up", ["target"]), ("vllm_drift_target_scrape_duration_seconds", ["target"]),
        ("vllm_drift_misconfiguration_score", tm + ["parameter"]), ("vllm_drift_configured_value", tm + ["parameter"]),
        ("vllm_drift_recommended_value", tm + ["parameter"]), ("vllm_drift_kv_pressure_score", tm),
        ("vllm_drift_idle_capacity_ratio", tm), ("vllm_drift_finding", tm + ["finding", "severity"]),
        ("vllm_drift_predicted_kv_cache_tokens", tm), ("vllm_drift_predicted_tpot_seconds", tm))}
    for t in view.targets:
        g["vllm_drift_target_up"].labels(t.target).set(1)
        g["vllm_drift_target_scrape_duration_seconds"].labels(t.target).set(t.scrape_duration_s)
        for r in t.reports:
            for p in PARAMETERS:
                if p in r.misconfiguration:
                    g["vllm_drift_misconfiguration_score"].labels(r.target, r.model_name, p).set(r.misconfiguration[p])
                if r.configured.get(p) is not None:
                    g["vllm_drift_configured_value"].labels(r.target, r.model_name, p).set(r.configured[p])
                if r.recommended.get(p) is not None:
                    g["vllm_drift_recommended_value"].labels(r.target, r.model_name, p).set(r.recommended[p])
            if r.kv_pressure_score is not None:
                g["vllm_drift_kv_pressure_score"].labels(r.target, r.model_name).set(r.kv_pressure_score)
            if r.idle_capacity_ratio is not None:
                g["vllm_drift_idle_capacity_ratio"].labels(r.target, r.model_name).set(r.idle_capacity_ratio)
            for f in r.findings:
                g["vllm_drift_finding"].labels(r.target, r.model_name, f.finding, f.severity).set(1)
            if r.predicted_kv_cache_tokens is not None:
                g["vllm_drift_predicted_kv_cache_tokens"].labels(r.target, r.model_name).set(r.predicted_kv_cache_tokens)
            if r.predicted_tpot_seconds is not None:
                g["vllm_drift_predicted_tpot_seconds"].labels(r.target, r.model_name).set(r.predicted_tpot_seconds)
    return reg


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def timed(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 3000]
    report = one_report()
    print(f"one report: status {report.status}, {len(report.findings)} findings; median of 7 runs each")
    for n in sizes:
        view = fleet(report, n)
        expo = Exposition()
        publish = timed(lambda: expo.publish(view))
        expo.collector.view = view
        collect = timed(lambda: list(expo.registry.collect()))
        families = list(expo.registry.collect())
        write = timed(lambda: expo._renderer.render(families))
        stock_write = timed(lambda: generate_latest(_Fixed(families)))
        serve = timed(expo.render)
        size = len(expo.render())
        reg = conventional(view)
        stock = timed(lambda: generate_latest(reg))
        stock_size = len(generate_latest(reg))
        print(f"{n:>5} targets: families built {collect * 1e3:6.1f} ms, written {write * 1e3:6.1f} ms "
              f"(generate_latest on the same families {stock_write * 1e3:6.1f} ms, ratio {write / stock_write:.2f})")
        print(f"{n:>5} targets: publish (render once) {publish * 1e3:7.1f} ms for {size / 1e6:.2f} MB; "
              f"GET /metrics body {serve * 1e3:5.2f} ms; conventional render-per-request {stock * 1e3:7.1f} ms "
              f"({stock_size / 1e6:.2f} MB, a subset of the series) -> per-request cost ratio {serve / stock:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
