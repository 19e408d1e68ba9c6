"""Turning one target's window into a `ModelReport`: observed signals, the calculator's view,
scored findings, recommendations and the stable (hysteresis) state.

`Evaluator.evaluate` is the single entry point the daemon and `scan` call for every served model.
The Evaluator keeps one `Tracker` per (target, model) across calls, so findings need a minimum
duration to raise and clear (see `exporter.drift.stability`); `to_dict`/`restore` carry that
state across daemon restarts (`exporter.drift.state`). `scan` makes a fresh Evaluator with
`raise_after=1`: a one-shot diagnosis has no history to confirm against.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import structlog

from exporter.config import Config, TargetSpec
from exporter.drift.inputs import DriftInput, Prediction
from exporter.drift.observe import build_input, sufficiency
from exporter.drift.predict import predict, resolve_hints
from exporter.model.resolve import HubSettings
from exporter.drift.observe import low_traffic
from exporter.drift.rules import idle_ratio, rule_idle_capacity, rule_kv_pressure, run_rules
from exporter.drift.stability import Tracker
from exporter.parse.snapshot import Snapshot
from exporter.report import PARAMETERS, Finding, ModelReport, TierAdvice
from exporter.scrape import Metadata
from exporter.window import Window, observed_signals

log = structlog.get_logger("vllm_drift")


class Evaluator:
    def __init__(self, cfg: Config, *, raise_after: int = 2, clear_after: int = 2,
                 one_shot: bool = False, previous: "Evaluator | None" = None) -> None:
        self.cfg = cfg
        self.hub = HubSettings.from_config(cfg.huggingface)   # where model configs are looked up
        self.one_shot = one_shot
        if one_shot:
            raise_after = clear_after = 1
        self.raise_after, self.clear_after = raise_after, clear_after
        # stable state survives a config reload (`previous`: the Evaluator being replaced)
        self.trackers: dict[str, Tracker] = previous.trackers if previous is not None else {}
        self._seen: dict[str, float] = previous._seen if previous is not None else {}
        self._last_prune = 0.0

    # ------------------------------------------------------------------ state
    @staticmethod
    def key(target: str, model_name: str) -> str:
        return f"{target}|{model_name}"

    def tracker(self, target: str, model_name: str, now: float | None = None) -> Tracker:
        k = self.key(target, model_name)
        if now is not None:
            self._seen[k] = now
            self._prune(now)
        t = self.trackers.get(k)
        if t is None:
            t = self.trackers[k] = Tracker(raise_after=self.raise_after, clear_after=self.clear_after)
        return t

    def _prune(self, now: float) -> None:
        """Forget targets not evaluated for three windows (they left discovery)."""
        if now - self._last_prune < 60.0:
            return
        self._last_prune = now
        horizon = max(3 * self.cfg.evaluation.window, 3600.0)
        for k in list(self.trackers):
            seen = self._seen.setdefault(k, now)   # restored from state: counts from now
            if now - seen > horizon:
                del self.trackers[k]
                del self._seen[k]

    def to_dict(self) -> dict[str, Any]:
        return {k: t.to_dict() for k, t in self.trackers.items()}

    def restore(self, data: Mapping[str, Any]) -> int:
        n = 0
        for k, v in (data or {}).items():
            if isinstance(v, Mapping) and "|" in k:
                self.trackers[k] = Tracker.from_dict(v)
                n += 1
        return n

    def forget(self, target: str, model_name: str | None = None) -> None:
        for k in list(self.trackers):
            t, _, m = k.partition("|")
            if t == target and (model_name is None or m == model_name):
                del self.trackers[k]

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, spec: TargetSpec, model_name: str, window: Window, latest: Snapshot,
                 metadata: Metadata | None, now: float) -> ModelReport:
        summary = window.summary(now)
        observed = observed_signals(latest, summary)
        if metadata and metadata.max_model_len and model_name in metadata.max_model_len:
            observed["max_model_len"] = metadata.max_model_len[model_name]
        version = metadata.vllm_version if metadata and metadata.vllm_version else None
        tracker = self.tracker(spec.url, model_name, now)
        notes: list[str] = []
        event = tracker.observe_config(latest.cache_config, now)
        if event is not None:
            what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in event["changed"].items())
            notes.append(f"config change: {what}")
            log.info("config change", target=spec.url, model_name=model_name, changed=event["changed"])

        x = build_input(spec, model_name, summary, latest, metadata, observed, self.cfg, window)
        root = metadata.root.get(model_name) if metadata and metadata.root else None
        gpu_hint = spec.gpu or spec.labels.get("gpu")
        res = resolve_hints([spec.model, (spec.labels or {}).get("model")], gpu_hint,
                            served_name=model_name, root=root, hub=self.hub)
        slo = {"ttft": x.slo_ttft_s, "tpot": x.slo_tpot_s}
        traffic = {"prompt_mean": x.prompt_mean, "output_mean": x.output_mean, "prompt_p99": x.prompt_p99,
                   "output_p99": x.output_p99, "arrival_rps": x.arrival_rps,
                   "prefix_hit_ratio": x.prefix_hit_ratio, "running_mean": x.running_mean,
                   "spec_k": x.spec_k}
        pred = predict(res, tp=x.tp, pp=x.pp, quantization=spec.quantization or spec.labels.get("quantization"),
                       cache_dtype=x.cache_dtype, gpu_memory_utilization=x.gpu_memory_utilization,
                       max_model_len=x.max_model_len, max_num_seqs=x.max_num_seqs,
                       max_num_batched_tokens=x.max_num_batched_tokens, block_size=x.block_size,
                       vllm_version=version, slo=slo, prices=self.cfg.prices,
                       traffic={**_rounded(traffic), "spec_per_position": _per_pos(summary)})
        x = replace(x, prediction=pred, missing_hints=res.missing, model=res.model_id,
                    gpu=res.gpu.name if res.gpu is not None else None)
        notes.extend(pred.notes)

        ok, why = sufficiency(x, one_shot=self.one_shot)
        status = "ok"
        quiet = low_traffic(x) if ok else ""
        blind = ok and x.kv_usage_max is None and x.running_mean is None and x.prompt_tps is None
        if blind:
            # e.g. --disable-log-stats: vLLM then exports its config but no load at all
            status = "unavailable"
            raw = []
            findings = [Finding("unavailable", "info", 0.0, explanation=(
                "unavailable: needs vLLM's load metrics (kv_cache_usage, num_requests_running, "
                "prompt_tokens_total); the server exports none (started with --disable-log-stats?)"))]
            findings += tracker.hold(now, x.window_s)
        elif ok and not quiet:
            raw = run_rules(x)
            findings = tracker.update(raw, now)
        elif ok:
            # too little traffic to judge settings; an idle server is still an observation
            status = "insufficient_data"
            raw = rule_idle_capacity(x)
            findings = tracker.update(raw, now) + [Finding("insufficient_data", "info", 0.0, explanation=quiet)]
        else:
            status = "insufficient_data"
            raw = []
            findings = [Finding("insufficient_data", "info", 0.0, explanation=why)]
            findings += tracker.hold(now, x.window_s)
        findings = sorted(findings, key=_order)
        return self._report(spec, model_name, version, latest, observed, x, raw, findings, status,
                            notes, now)

    def _report(self, spec: TargetSpec, model_name: str, version: str | None, latest: Snapshot,
                observed: dict[str, Any], x: DriftInput, raw: list[Finding], findings: list[Finding],
                status: str, notes: list[str], now: float) -> ModelReport:
        pred: Prediction = x.prediction
        active = {f.finding: f for f in findings if f.severity in ("warning", "critical")}
        allf = {f.finding: f for f in findings}
        mis: dict[str, float] = {}
        configured: dict[str, float] = {}
        recommended: dict[str, float] = {}
        for param, value in _configured(x).items():
            configured[param] = value
        if status == "ok":
            for param in PARAMETERS:
                f = allf.get(param)
                if f is not None and f.parameter == param:
                    mis[param] = f.score
                    if _num(f.recommended) is not None:
                        recommended[param] = _num(f.recommended)
                elif param in configured:
                    mis[param] = 0.0
        for param, value in configured.items():
            recommended.setdefault(param, value)
        kv_score = None
        idle = None
        if status == "ok":
            kvf = [f for f in rule_kv_pressure(x) if f.finding == "kv_pressure"]
            kv_score = kvf[0].score if kvf else (0.0 if x.kv_usage_max is not None else None)
        if status == "ok" or any(f.finding == "idle_capacity" for f in raw):
            idle, _ = idle_ratio(x)     # also for a quiet server: idleness is what was observed
        tier = None
        waste = None
        tf = active.get("tier_misplacement")
        if tf is not None and pred.current_cost_per_hour and pred.tiers:
            best = pred.tiers[0]
            waste = max(0.0, pred.current_cost_per_hour - best.dollars_per_hour * 1.0)
            tier = TierAdvice(current_gpu=x.gpu or "unknown", recommended_gpu=best.gpu, score=tf.score,
                              waste_dollars_per_hour=round(waste, 4),
                              detail={"tp": best.tp, "replicas": best.replicas,
                                      "dollars_per_hour": best.dollars_per_hour,
                                      "current_dollars_per_hour": pred.current_cost_per_hour})
        elif pred.current_cost_per_hour is not None and status == "ok":
            tier = TierAdvice(current_gpu=x.gpu or "unknown", recommended_gpu=x.gpu or "unknown", score=0.0,
                              waste_dollars_per_hour=0.0)
            waste = 0.0
        ratio = None
        if x.kv_cache_tokens and pred.kv_cache_tokens:
            ratio = round(x.kv_cache_tokens / pred.kv_cache_tokens, 4)
        return ModelReport(
            target=spec.url, model_name=model_name, vllm_version=version or latest.version_guess, engine_era=latest.engine_era,
            observed=observed, findings=tuple(findings), status=status, misconfiguration=mis,
            configured=configured, recommended=recommended, kv_pressure_score=kv_score,
            idle_capacity_ratio=None if idle is None else round(idle, 4), tier=tier,
            waste_dollars_per_hour=waste, predicted_kv_cache_tokens=pred.kv_cache_tokens,
            predicted_tpot_seconds=pred.tpot_s, observed_kv_cache_tokens_ratio=ratio,
            notes=tuple(dict.fromkeys(notes)), evaluated_at=now,
            events=tuple(self.trackers[self.key(spec.url, model_name)].events[-5:]),
            derived=_derived(x) if status != "unavailable" else {})


_SEV = {"critical": 0, "warning": 1, "info": 2}


def _order(f: Finding) -> tuple:
    return (_SEV.get(f.severity, 3), -f.score, f.finding)


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    if v == "fp8":
        return 1.0
    if v == "auto":
        return 0.0
    return None


def _configured(x: DriftInput) -> dict[str, float]:
    """Configured values where observable (kv_cache_dtype: 1 = fp8, 0 = model dtype;
    enable_prefix_caching: 1/0; speculative_decoding: draft tokens per step, 0 = off)."""
    from exporter.drift.rules import configured_max_num_seqs
    out: dict[str, float] = {}
    mns, _ = configured_max_num_seqs(x)
    if mns:
        out["max_num_seqs"] = float(mns)
    if x.gpu_memory_utilization is not None:
        out["gpu_memory_utilization"] = float(x.gpu_memory_utilization)
    if x.max_model_len:
        out["max_model_len"] = float(x.max_model_len)
    if x.max_num_batched_tokens:
        out["max_num_batched_tokens"] = float(x.max_num_batched_tokens)
    if x.enable_prefix_caching is not None:
        out["enable_prefix_caching"] = 1.0 if x.enable_prefix_caching else 0.0
    if x.cache_dtype:
        out["kv_cache_dtype"] = 1.0 if x.cache_dtype.lower().startswith("fp8") else 0.0
    if x.spec_k is not None:
        out["speculative_decoding"] = float(round(x.spec_k, 2))
    elif "spec_decode_num_drafts_total" in x.families or x.v1:
        out["speculative_decoding"] = 0.0
    return out


def _per_pos(summary: Any) -> tuple[float, ...] | None:
    pp = getattr(summary, "spec_decode_acceptance_per_pos", None)
    return tuple(round(min(1.0, max(0.0, p)), 2) for p in pp) if pp else None


def _rounded(traffic: dict[str, float | None]) -> dict[str, float | None]:
    """Snap the traffic to a geometric grid of 10% steps, so the calculator's caches (tier
    ranking is the costly part) hit across windows of steady traffic."""
    out = {}
    for k, v in traffic.items():
        if v is None or v <= 0:
            out[k] = v
        else:
            out[k] = float(f"{1.1 ** round(math.log(v) / math.log(1.1)):.4g}")
    return out


def _derived(x: DriftInput) -> dict[str, Any]:
    """The intermediate quantities the scores are computed from (docs/scores.md), so a reader can
    check a finding's arithmetic."""
    from exporter.drift.rules import configured_max_num_seqs, kv_bound, queue_share, recompute_share, victim_tokens
    mns, how = configured_max_num_seqs(x)

    def r(v: float | None, nd: int = 4) -> float | None:
        return None if v is None else round(float(v), nd)
    return {"kv_capacity_tokens": r(x.capacity_tokens, 0), "resident_tokens_per_request": r(x.resident_tokens, 1),
            "kv_bound_requests": kv_bound(x), "concurrency": r(x.concurrency, 3),
            "busy_fraction": r(x.busy_fraction), "preempted_tokens_per_preemption": r(victim_tokens(x), 1),
            "recompute_share": r(recompute_share(x)), "queue_share": r(queue_share(x)),
            "max_num_seqs": mns, "max_num_seqs_source": how, "prompt_p25_tokens": r(x.prompt_p25, 1),
            "prompt_plus_output_p99_tokens": r(x.needed_len_p99, 0), "gpu": x.gpu, "model": x.model,
            "missing_hints": list(x.missing_hints)}
