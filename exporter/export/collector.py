"""The daemon's Prometheus families, built from a published `FleetView`.

A custom collector on a private registry: no global mutable metric objects. The daemon renders
the exposition once per scrape/evaluation cycle (`render()`), so `/metrics` serves bytes and its
latency does not grow with the fleet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter import __version__, buildinfo
from exporter.export.render import Renderer
from exporter.report import ModelReport, PARAMETERS


@dataclass(frozen=True, slots=True)
class TargetView:
    """The exported state of one target (immutable, swapped whole each cycle)."""

    target: str
    source: str
    up: bool | None                      # None: never scraped yet
    scrape_duration_s: float | None
    last_success: float | None
    errors: Mapping[str, float]          # reason -> count
    vllm_version: str | None
    models: Mapping[str, str]            # model_name -> engine_era
    reports: tuple[ModelReport, ...] = ()


@dataclass(frozen=True, slots=True)
class FleetView:
    targets: tuple[TargetView, ...] = ()
    last_evaluation: float | None = None
    evaluation_duration_s: float | None = None
    config_reload_failures: float = 0.0
    config_reloads: float = 0.0
    config_loaded_at: float | None = None
    discovery_errors: Mapping[str, float] = field(default_factory=dict)
    cycle_duration_s: float | None = None
    cycles: float = 0.0
    state_errors: Mapping[str, float] = field(default_factory=dict)
    ready: bool = False


def _g(name: str, doc: str, labels: Iterable[str] = (), unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)


_NO_TARGETS = FleetView()


class FleetCollector(Collector):
    def __init__(self) -> None:
        self.view = FleetView()
        # False: the per-target families (TARGET_FAMILIES, REPORT_FAMILIES) are yielded empty
        # (`CachedExposition` writes their samples from its per-target blocks; a view copied
        # without reports cost ~3 us a target)
        self.per_target = True

    def collect(self) -> Iterable[Metric]:
        v = self.view
        build = InfoMetricFamily("vllm_drift_build", "vllm-drift build information (revision: see exporter/buildinfo.py).",
                                 labels=["version", "revision", "python_version"])
        build.add_metric([__version__, buildinfo.revision(), buildinfo.python_version()], {})
        yield build

        families = [CounterMetricFamily(name, doc, labels=list(labels)) if typ == "counter" else _g(name, doc, labels)
                    for name, doc, typ, labels in TARGET_FAMILIES]
        source = _g("vllm_drift_targets", "Targets being watched, by discovery source.", ["source"])
        by_source: dict[str, int] = {}
        for t in v.targets:
            by_source[t.source] = by_source.get(t.source, 0) + 1
            if self.per_target:
                for i, values, value in target_samples(t):
                    families[i].add_metric(values, value)
        for name, count in sorted(by_source.items()):
            source.add_metric([name], count)
        yield from families
        yield source
        yield from self.reports(v if self.per_target else _NO_TARGETS)

        ev_ts = _g("vllm_drift_last_evaluation_timestamp_seconds", "Unix time the last evaluation finished.")
        ev_dur = _g("vllm_drift_evaluation_duration_seconds", "Duration of the last evaluation of the fleet.")
        if v.last_evaluation is not None:
            ev_ts.add_metric([], v.last_evaluation)
        if v.evaluation_duration_s is not None:
            ev_dur.add_metric([], v.evaluation_duration_s)
        cyc = _g("vllm_drift_scrape_cycle_duration_seconds", "Duration of the last scrape cycle over all targets.")
        if v.cycle_duration_s is not None:
            cyc.add_metric([], v.cycle_duration_s)
        cycles = CounterMetricFamily("vllm_drift_scrape_cycles", "Scrape cycles completed.")
        cycles.add_metric([], v.cycles)
        fails = CounterMetricFamily("vllm_drift_config_reload_failures",
                                    "Config reloads rejected because the new config was invalid.")
        fails.add_metric([], v.config_reload_failures)
        reloads = CounterMetricFamily("vllm_drift_config_reloads", "Config reloads applied.")
        reloads.add_metric([], v.config_reloads)
        loaded = _g("vllm_drift_config_last_reload_success_timestamp_seconds",
                    "Unix time the config in force was loaded.")
        if v.config_loaded_at is not None:
            loaded.add_metric([], v.config_loaded_at)
        disc = CounterMetricFamily("vllm_drift_discovery_errors", "Target discovery failures, by source.",
                                   labels=["source"])
        for name, count in sorted(v.discovery_errors.items()):
            disc.add_metric([name], count)
        state = CounterMetricFamily("vllm_drift_state_errors",
                                    "Failures to read or write the state directory, by operation.",
                                    labels=["operation"])
        for name, count in sorted(v.state_errors.items()):
            state.add_metric([name], count)
        ready = _g("vllm_drift_ready", "1 once the first evaluation has finished.")
        ready.add_metric([], 1.0 if v.ready else 0.0)
        yield from (ev_ts, ev_dur, cyc, cycles, fails, reloads, loaded, disc, state, ready)

    @staticmethod
    def reports(v: FleetView) -> Iterable[Metric]:
        """The families made from the targets' `ModelReport`s (every sample has a `target`
        label). Everything a report shows belongs in `REPORT_FAMILIES` and `report_samples`:
        `/metrics` renders these per target right after its evaluation (`report_lines`) and
        the rest at each publish."""
        families = []
        for name, doc, typ, labels in REPORT_FAMILIES:
            if typ == "summary":
                families.append(Metric(name, doc, "summary"))
            else:
                families.append(_g(name, doc, labels))
        for t in v.targets:
            for r in t.reports:
                for i, values, value in report_samples(r):
                    fam = families[i]
                    if fam.type == "summary":
                        fam.add_sample(fam.name, dict(zip(REPORT_FAMILIES[i][3], values)), value)
                    else:
                        fam.add_metric(values, value)
        yield from families


# (name, HELP, type, label names) of the families of each target's scrape state, in exposition
# order (a counter's samples are named `<name>_total`)
TARGET_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("vllm_drift_target_up", "1 if the last scrape of the target succeeded, else 0.", "gauge", ("target",)),
    ("vllm_drift_target_scrape_duration_seconds", "Duration of the last scrape of the target.", "gauge", ("target",)),
    ("vllm_drift_target_last_success_timestamp_seconds", "Unix time of the last successful scrape of the target.",
     "gauge", ("target",)),
    ("vllm_drift_target_info", "The served model, vLLM version and engine era of a target (always 1).", "gauge",
     ("target", "model_name", "vllm_version", "engine_era")),
    ("vllm_drift_scrape_errors", "Failed scrapes of a target, by reason.", "counter", ("target", "reason")),
)


def target_samples(t: TargetView) -> Iterable[tuple[int, tuple[str, ...], float]]:
    """(index in TARGET_FAMILIES, label values, value) of every sample of one target's scrape
    state."""
    if t.up is not None:
        yield 0, (t.target,), 1.0 if t.up else 0.0
    if t.scrape_duration_s is not None:
        yield 1, (t.target,), t.scrape_duration_s
    if t.last_success is not None:
        yield 2, (t.target,), t.last_success
    for model, era in t.models.items():
        yield 3, (t.target, model, t.vllm_version or "unknown", era or "unknown"), 1.0
    for reason, count in t.errors.items():
        yield 4, (t.target, reason), count


_TM = ("target", "model_name")
# (name, HELP, type, label names) of the families made from reports, in exposition order
REPORT_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("vllm_drift_misconfiguration_score",
     "How far a setting is from the predicted optimum for the observed traffic (0 optimal, 1 worst).",
     "gauge", _TM + ("parameter",)),
    ("vllm_drift_configured_value", "The value a setting has on the target, where observable.",
     "gauge", _TM + ("parameter",)),
    ("vllm_drift_recommended_value", "The value the model recommends for a setting.", "gauge", _TM + ("parameter",)),
    ("vllm_drift_kv_pressure_score", "KV-cache pressure: 0 comfortable, 1 saturated with preemptions.", "gauge", _TM),
    ("vllm_drift_idle_capacity_ratio", "Share of predicted sustainable capacity left unused.", "gauge", _TM),
    ("vllm_drift_tier_misplacement_score",
     "Fraction of spend a cheaper GPU tier meeting the same SLOs would save (0: right tier).",
     "gauge", _TM + ("current_gpu", "recommended_gpu")),
    ("vllm_drift_estimated_waste_dollars_per_hour", "Estimated money lost per hour to the active findings.",
     "gauge", _TM),
    ("vllm_drift_finding", "1 while a finding is active.", "gauge", _TM + ("finding", "severity")),
    ("vllm_drift_finding_score", "Score of an active finding.", "gauge", _TM + ("finding",)),
    ("vllm_drift_finding_confidence",
     "How much data backs an active finding, 0 to 1 (grows as the window fills).", "gauge", _TM + ("finding",)),
    ("vllm_drift_finding_status", "1 for each finding's evaluation status (ok, insufficient_data, unavailable).",
     "gauge", _TM + ("finding", "status")),
    ("vllm_drift_predicted_kv_cache_tokens", "KV-cache capacity the model predicts for the setup.", "gauge", _TM),
    ("vllm_drift_predicted_tpot_seconds",
     "TPOT the model predicts at the observed load; basis: prior (a-priori model), unprofiled "
     "(a generic prior for a device with no catalog row) or calibrated (fitted to this "
     "server's pool).", "gauge", _TM + ("basis",)),
    ("vllm_drift_predicted_ttft_seconds", "TTFT the model predicts at the observed load; basis as for TPOT.",
     "gauge", _TM + ("basis",)),
    ("vllm_drift_model_calibration_factor",
     "Step-time or TTFT model factor fitted online to this server's pool (absent until calibrated).",
     "gauge", _TM + ("factor",)),
    ("vllm_drift_model_fit_error_ratio",
     "Relative TPOT error of the calibrated model on the last measurement it folded in.", "gauge", _TM),
    ("vllm_drift_model_calibration_rejections",
     "Measurements of this server's pool refused because the fit would leave physics.", "gauge", _TM),
    ("vllm_drift_observed_to_predicted_kv_cache_ratio", "Observed KV-cache capacity divided by the predicted one.",
     "gauge", _TM),
    ("vllm_drift_evaluation_status",
     "1 for the current evaluation status of a model (ok, insufficient_data, unavailable).", "gauge", _TM + ("status",)),
    # typed summary: its samples are quantile objectives (the agreed `quantile` label), which
    # the exposition linters (promtool check metrics) accept on summaries only
    ("vllm_drift_slo_seconds",
     "The latency SLO (p99 objective) a target is judged against "
     "(source: configured; else expected, the model's p99 at the observed load x 1.5; else default).",
     "summary", _TM + ("metric", "quantile", "source")),
    ("vllm_drift_engine_sleep_level",
     "vLLM sleep mode at the last scrape: 0 awake, 1 weights offloaded (KV cache discarded), "
     "2 weights and KV cache discarded; load findings wait while it is above 0. Absent when the "
     "server does not export vllm:engine_sleep_state (before 0.11.1).", "gauge", _TM),
)
(_MIS, _CONF, _REC, _KVP, _IDLE, _TIER, _WASTE, _FINDING, _FSCORE, _FCONF, _FSTATUS, _PKV, _PTPOT, _PTTFT,
 _CFAC, _CERR, _CREJ, _RATIO, _STATUS, _SLO, _SLEEP) = range(len(REPORT_FAMILIES))


def report_samples(r: ModelReport) -> Iterable[tuple[int, tuple[str, ...], float]]:
    """(index in REPORT_FAMILIES, label values, value) of every sample one report shows."""
    key = (r.target, r.model_name)
    yield _STATUS, key + (r.status,), 1.0
    for p in PARAMETERS:
        if p in r.misconfiguration:
            yield _MIS, key + (p,), r.misconfiguration[p]
        if p in r.configured and r.configured[p] is not None:
            yield _CONF, key + (p,), float(r.configured[p])
        if p in r.recommended and r.recommended[p] is not None:
            yield _REC, key + (p,), float(r.recommended[p])
    if r.kv_pressure_score is not None:
        yield _KVP, key, r.kv_pressure_score
    if r.idle_capacity_ratio is not None:
        yield _IDLE, key, r.idle_capacity_ratio
    if r.tier is not None:
        yield _TIER, key + (r.tier.current_gpu, r.tier.recommended_gpu), r.tier.score
    if r.waste_dollars_per_hour is not None:
        yield _WASTE, key, r.waste_dollars_per_hour
    for f in r.findings:
        if f.finding in ("unavailable", "insufficient_data"):
            continue        # statuses, not findings (vllm_drift_finding_status)
        yield _FINDING, key + (f.finding, f.severity), 1.0
        yield _FSCORE, key + (f.finding,), f.score
        if f.confidence is not None:
            yield _FCONF, key + (f.finding,), f.confidence
    for name, st in r.finding_status.items():
        yield _FSTATUS, key + (name, st.get("status", "ok")), 1.0
    for metric, seconds in r.slo_seconds.items():
        yield _SLO, key + (metric, "0.99", r.slo_source.get(metric, "default")), seconds
    if r.predicted_kv_cache_tokens is not None:
        yield _PKV, key, r.predicted_kv_cache_tokens
    if r.predicted_tpot_seconds is not None:
        yield _PTPOT, key + (r.prediction_basis,), r.predicted_tpot_seconds
    if r.predicted_ttft_seconds is not None:
        yield _PTTFT, key + (r.prediction_basis,), r.predicted_ttft_seconds
    if r.calibration:
        for name, value in sorted(r.calibration["factors"].items()):
            yield _CFAC, key + (name,), value
        if r.calibration["fit_error"] is not None:
            yield _CERR, key, r.calibration["fit_error"]
        yield _CREJ, key, r.calibration["rejected"]
    if r.observed_kv_cache_tokens_ratio is not None:
        yield _RATIO, key, r.observed_kv_cache_tokens_ratio
    if r.observed.get("sleep_level") is not None:
        yield _SLEEP, key, float(r.observed["sleep_level"])


class Exposition:
    """The fleet's families rendered once per publish, plus live process metrics per request."""

    def __init__(self) -> None:
        self.collector = FleetCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

        self.live = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.live)
        PlatformCollector(registry=self.live)
        GCCollector(registry=self.live)
        self._renderer = Renderer()     # generate_latest's output, faster on a fleet (export/render.py)
        self._rendered = self._renderer.render(self.registry.collect())

    def publish(self, view: FleetView) -> None:
        self.collector.view = view
        self._rendered = self._renderer.render(self.registry.collect())

    def render(self) -> bytes:
        return self._rendered + generate_latest(self.live)
