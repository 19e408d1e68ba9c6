"""Turning one target's window into a `ModelReport`.

`Evaluator.evaluate` is the single entry point the daemon and `scan` call for every served model.
It gathers the observed signals from the window; the drift engine (`exporter.drift`) adds the
calculator's optimum, the findings and the scores on top.
"""
from __future__ import annotations

from exporter.config import Config, TargetSpec
from exporter.parse.snapshot import Snapshot
from exporter.report import ModelReport
from exporter.scrape import Metadata
from exporter.window import Window, observed_signals


class Evaluator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def evaluate(self, spec: TargetSpec, model_name: str, window: Window, latest: Snapshot,
                 metadata: Metadata | None, now: float) -> ModelReport:
        summary = window.summary(now)
        observed = observed_signals(latest, summary)
        if metadata and metadata.max_model_len and model_name in metadata.max_model_len:
            observed["max_model_len"] = metadata.max_model_len[model_name]
        version = metadata.vllm_version if metadata and metadata.vllm_version else None
        return ModelReport(target=spec.url, model_name=model_name, vllm_version=version,
                           engine_era=latest.engine_era, observed=observed, evaluated_at=now)
