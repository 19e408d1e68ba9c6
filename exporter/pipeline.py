"""The one way scrapes of a target become an evaluation.

    Snapshot --observe--> Window --summary--> observed signals + DriftInput   (exporter.window,
                                                                                exporter.drift.observe)
      target hints + /v1/models --identify (once)--> Identity               (exporter.drift.predict)
      Identity + DriftInput --predict--> Prediction (with its basis)         (exporter.drift.predict)
      DriftInput + Prediction --judge--> Judgement (findings, scores)       (exporter.drift.engine)
      Judgement + observed --> ModelReport                                   (exporter.report)

`TargetPipeline` is one (target, served model): its window, latest snapshot and resolved
identity. `Pipelines` is what every caller holds (the daemon, `scan`, the benchmarks, the tests):
the config, the drift engine with its per-(target, model) stability state, and the persisted
state (`to_state`/`restore`) that survives daemon restarts. This is the only module that wires
the window and the drift engine together.

Seams for later work: prediction is `exporter.drift.predict.predict_for(identity, x, ...)`;
state a target learns over time (calibration, say) belongs next to the window on
`TargetPipeline` and in `Pipelines.to_state`/`restore` under its own key.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

import structlog

from exporter.config import Config, TargetSpec
from exporter.drift.calibration import FleetCalibration
from exporter.drift.engine import DriftEngine, Judgement
from exporter.drift.state import Streamed
from exporter.drift.inputs import DriftInput, Prediction, with_prediction
from exporter.drift.observe import build_input
from exporter.drift.predict import Identity, identify, predict_for, setup_for, slo_of
from exporter.model.resolve import HubSettings
from exporter.parse.snapshot import Snapshot
from exporter.report import ModelReport
from exporter.parse.metadata import Metadata
from exporter.window import Observed, Window, observed_signals, window_from_dict, window_to_dict

log = structlog.get_logger("vllm_drift")


class Pipelines:
    """The config, the drift engine and the saved state shared by a fleet's `TargetPipeline`s."""

    def __init__(self, cfg: Config, *, one_shot: bool = False, raise_after: int = 2,
                 clear_after: int = 2) -> None:
        self.cfg = cfg
        self.engine = DriftEngine(cfg, one_shot=one_shot, raise_after=raise_after, clear_after=clear_after)
        self.restored_windows: dict[tuple[str, str], dict[str, Any]] = {}
        self._restored_index: dict[str, set[str]] | None = None   # url -> models of restored_windows
        self.on_state_error: Callable[[str, str], None] | None = None   # (operation, message)
        self.calibration = FleetCalibration(cfg.calibration_rows)
        self.hub = HubSettings.from_config(cfg.huggingface)   # where served models' configs are found

    def reconfigure(self, cfg: Config) -> None:
        """A reloaded config: the stable findings carry over."""
        self.cfg = cfg
        self.engine = DriftEngine(cfg, one_shot=self.engine.one_shot, raise_after=self.engine.raise_after,
                                  clear_after=self.engine.clear_after, previous=self.engine)
        self.calibration.set_rows(cfg.calibration_rows)
        self.hub = HubSettings.from_config(cfg.huggingface)

    def pipeline(self, spec: TargetSpec, model_name: str, *, window_s: float | None = None) -> "TargetPipeline":
        """A new pipeline for (target, model), continuing its saved window when there is one."""
        window_s = self.cfg.evaluation.window if window_s is None else window_s
        window = None
        saved = self.restored_windows.pop((spec.url, model_name), None)
        if saved is not None:
            try:
                window = window_from_dict(saved, window_s)
            except (TypeError, ValueError, KeyError) as exc:
                if self.on_state_error is not None:
                    self.on_state_error("load", f"window of {spec.url} {model_name}: {exc}")
        return TargetPipeline(self, spec, model_name, window if window is not None else Window(window_s))

    def forget_restored(self, url: str, serving: Iterable[str]) -> None:
        """Saved windows of models this target no longer serves."""
        if not self.restored_windows:
            return
        keep = set(serving)
        # by URL, not a scan of every saved window: called on each scrape, and a restart at
        # 10,000 targets would otherwise cost 10,000 x 10,000 lookups in its first cycle
        for model in self._restored_models(url) - keep:
            self.restored_windows.pop((url, model), None)

    def _restored_models(self, url: str) -> set[str]:
        index = self._restored_index      # built once per restore(); claimed windows only leave
        if index is None:
            index = self._restored_index = {}
            for u, m in self.restored_windows:
                index.setdefault(u, set()).add(m)
        return {m for m in index.get(url, ()) if (url, m) in self.restored_windows}

    # ------------------------------------------------------------------ state
    def to_state(self, pipelines: Iterable["TargetPipeline"], *,
                 keep_restored: Callable[[str], bool] | None = None, streamed: bool = False) -> dict[str, Any]:
        """The state file's document. `keep_restored(url) -> bool`: which windows restored at
        start-up and not yet claimed by a first good scrape to carry over. `streamed`: the
        windows as a `Streamed` object whose documents are made as `StateStore` writes them."""
        pipelines = list(pipelines)
        live = {f"{p.spec.url}|{p.model_name}" for p in pipelines}
        restored = [(f"{url}|{model}", saved) for (url, model), saved in list(self.restored_windows.items())
                    if (keep_restored is None or keep_restored(url)) and f"{url}|{model}" not in live]

        def windows():     # each window's document made when it is written (StateStore.saving)
            for p in pipelines:
                yield f"{p.spec.url}|{p.model_name}", window_to_dict(p.window)
            yield from restored
        return {"evaluator": self.engine.to_dict(),
                "windows": Streamed(windows()) if streamed else dict(windows()),
                "calibration": self.calibration.to_dict()}

    def restore(self, doc: Mapping[str, Any]) -> tuple[int, int]:
        """Load a saved document; returns (stability trackers, windows) restored. Raises
        TypeError/ValueError/KeyError/AttributeError on an unusable document."""
        n = self.engine.restore(doc.get("evaluator") or {})
        self.calibration.restore(doc.get("calibration") or {})
        for key, wd in (doc.get("windows") or {}).items():
            url, _, model = key.partition("|")
            self.restored_windows[(url, model)] = wd
        self._restored_index = None
        return n, len(self.restored_windows)


class TargetPipeline:
    """One (target, served model): observe its snapshots, evaluate it into a `ModelReport`."""

    def __init__(self, fleet: Pipelines, spec: TargetSpec, model_name: str, window: Window) -> None:
        self.fleet = fleet
        self.spec = spec
        self.model_name = model_name
        self.window = window
        self.latest: Snapshot | None = None
        self.identity_key: tuple[TargetSpec, str | None] | None = None
        self.identity_value: Identity | None = None

    def observe(self, snap: Snapshot) -> None:
        self.window.observe(snap)
        self.latest = snap

    def identity(self, metadata: Metadata | None) -> Identity:
        """The hints (config, file_sd labels, /v1/models root) resolved once per change of them."""
        root = metadata.root.get(self.model_name) if metadata and metadata.root else None
        key = (self.spec, root)
        if self.identity_value is None or key != self.identity_key or self.identity_value.resolved.pending:
            # a one-shot scan waits for a Hub lookup; the daemon asks again at its next evaluation
            self.identity_value = identify(self.spec, self.model_name, root, hub=self.fleet.hub,
                                           wait=self.fleet.engine.one_shot)
            self.identity_key = key
        return self.identity_value

    def evaluate(self, metadata: Metadata | None, now: float) -> ModelReport:
        latest = self.latest
        if latest is None:
            raise ValueError(f"{self.spec.url} {self.model_name}: nothing observed yet")
        fleet, spec, model_name = self.fleet, self.spec, self.model_name
        hists: dict = {}
        summary = self.window.summary(now, hists)
        mml = metadata.max_model_len.get(model_name) if metadata and metadata.max_model_len else None
        observed = observed_signals(latest, summary, max_model_len=mml)
        version = metadata.vllm_version if metadata and metadata.vllm_version else None
        notes: list[str] = []
        event = fleet.engine.observe_config(spec.url, model_name, latest.cache_config, now)
        if event is not None:
            what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in event["changed"].items())
            notes.append(f"config change: {what}")
            log.info("config change", target=spec.url, model_name=model_name, changed=event["changed"])

        deferred = summary.waiting_deferred_mean
        if deferred is not None and deferred >= 0.5:
            notes.append(f"{deferred:.1f} requests wait on average on something other than capacity "
                         "(vLLM's `deferred`: a LoRA slot, a KV transfer, a blocked request); they are "
                         "not counted as a queue behind max_num_seqs or the KV cache")
        ident = self.identity(metadata)
        x = build_input(ident, summary, latest, metadata, observed, spec.slo or fleet.cfg.slo,
                        fleet.cfg.evaluation.window, self.window, hists)
        pred = self.predict(ident, x, summary, version, now)
        x = with_prediction(x, pred)
        notes.extend(pred.notes)
        j: Judgement = fleet.engine.judge(x, now, tuple(notes))
        return ModelReport(
            target=spec.url, model_name=model_name, vllm_version=version or latest.version_guess,
            engine_era=latest.engine_era, observed=observed, findings=j.findings, status=j.status,
            misconfiguration=j.misconfiguration, configured=j.configured, recommended=j.recommended,
            kv_pressure_score=j.kv_pressure_score, idle_capacity_ratio=j.idle_capacity_ratio, tier=j.tier,
            waste_dollars_per_hour=j.waste_dollars_per_hour, predicted_kv_cache_tokens=pred.kv_cache_tokens,
            predicted_tpot_seconds=pred.tpot_s, predicted_ttft_seconds=pred.ttft_s,
            prior_tpot_seconds=pred.prior_tpot_s, prior_ttft_seconds=pred.prior_ttft_s,
            prediction_basis=pred.basis, calibration=_calibration_json(pred),
            observed_kv_cache_tokens_ratio=j.observed_kv_cache_tokens_ratio,
            notes=j.notes, evaluated_at=now, events=j.events, derived=j.derived, finding_status=j.statuses,
            **slo_of(x, pred))

    def predict(self, ident: Identity, x: DriftInput, summary: Observed, version: str | None,
                now: float) -> Prediction:
        """The model's view of this target at the observed load: the step-time model calibrated
        on this target's pool of alike servers once that is confident (`drift/calibration.py`),
        the a-priori one until then."""
        per_pos = summary.spec_decode_acceptance_per_pos
        per_pos_r = tuple(round(min(1.0, max(0.0, p)), 2) for p in per_pos) if per_pos else None
        setup = setup_for(ident, x, version)
        cal = None
        if setup is not None:
            tpot = summary.tpot
            key = "tpot_seconds" if summary.tpot_source == "request_tpot" else "itl_seconds"
            lifetime = self.latest.histograms.get(key) if self.latest is not None else None
            cal = self.fleet.calibration.evaluate(
                setup, target=self.spec.url, model_name=self.model_name, prompt_mean=x.prompt_mean,
                output_mean=x.output_mean, prefix_hit_ratio=x.prefix_hit_ratio, running_mean=x.running_mean,
                tpot_mean=tpot.mean if tpot is not None else None,
                window_requests=tpot.count if tpot is not None else 0.0,
                lifetime_requests=lifetime.count if lifetime is not None else None,
                now=now, one_shot=self.fleet.engine.one_shot,
                ttft_mean=summary.ttft.mean if summary.ttft is not None else None,
                ttft_requests=summary.ttft.count if summary.ttft is not None else 0.0,
                queue_mean=summary.queue_time.mean if summary.queue_time is not None else None,
                waiting_mean=x.waiting_mean, preemptions_ps=x.preemptions_ps)
        pred = predict_for(ident, x, vllm_version=version, prices=self.fleet.cfg.prices,
                           spec_per_position=per_pos_r, calibration=cal.calibration if cal else None)
        if cal is None:
            return pred
        notes = pred.notes
        if cal.basis == "calibrated":
            notes += (f"predictions calibrated on this server's pool ({cal.updates} measurement(s) from "
                      f"{len(self.fleet.calibration.pools[cal.pool].targets) or 1} server(s)); "
                      + (f"a-priori TPOT here {cal.prior_tpot_s:.4g} s" if cal.prior_tpot_s is not None
                         else "no a-priori TPOT here"),)
        # a described (unprofiled) device stays "unprofiled" until its calibration is confident
        basis = cal.basis if cal.basis == "calibrated" or pred.basis != "unprofiled" else pred.basis
        return replace(pred, tpot_s=cal.tpot_s, ttft_s=cal.ttft_s, prior_tpot_s=cal.prior_tpot_s,
                       prior_ttft_s=cal.prior_ttft_s, basis=basis, calibration_factors=dict(cal.factors),
                       fit_error=cal.fit_error, calibration_updates=cal.updates,
                       calibration_rejected=cal.rejected, calibration_pool=cal.pool, notes=notes,
                       expected_itl_p99_s=cal.itl_p99_s, expected_ttft_p99_s=cal.ttft_p99_s)


def _calibration_json(pred: Prediction) -> dict[str, Any] | None:
    if pred.calibration_pool is None:
        return None
    return {"pool": pred.calibration_pool, "factors": dict(pred.calibration_factors),
            "fit_error": pred.fit_error, "updates": pred.calibration_updates,
            "rejected": pred.calibration_rejected}


def evaluate_snapshots(fleet: Pipelines, spec: TargetSpec, batches: Iterable[list[Snapshot]],
                       metadata: Metadata | None, now: float, *, window_s: float | None = None) -> list[ModelReport]:
    """Observe parsed scrapes in order on fresh pipelines and evaluate every served model once:
    the one-shot form of what the daemon does across cycles."""
    pipes: dict[str, TargetPipeline] = {}
    for snaps in batches:
        for snap in snaps:
            if snap.model_name not in pipes:
                pipes[snap.model_name] = fleet.pipeline(spec, snap.model_name, window_s=window_s)
            pipes[snap.model_name].observe(snap)
    return [p.evaluate(metadata, now) for p in pipes.values()]
