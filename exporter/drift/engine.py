"""The drift engine: one `DriftInput` (with its prediction) in, one `Judgement` out.

It decides whether the data suffices, runs the rules, folds their raw findings into the stable
(hysteresis) set of the (target, model) and derives every score a report carries from the rules'
own results: nothing outside this module re-runs a rule or recomputes a score.

The engine keeps one `Tracker` per (target, model) across calls, so findings need a minimum
duration to raise and clear (`exporter.drift.stability`); `to_dict`/`restore` carry that state
across daemon restarts (`exporter.drift.state`). A one-shot diagnosis (`scan`) has no history to
confirm against: it raises and clears at once and judges from any pair of snapshots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from exporter.config import Config
from exporter.drift.inputs import DriftInput
from exporter.drift.observe import low_traffic, sufficiency
from exporter.drift.rules import (RULES, configured_max_num_seqs, idle_ratio, kv_bound, queue_share,
                                  recompute_share, rule_idle_capacity, rule_kv_pressure, victim_tokens)
from exporter.drift.stability import Tracker
from exporter.report import PARAMETERS, Finding, TierAdvice


@dataclass(frozen=True)
class Judgement:
    """What the engine concluded about one (target, model) at one evaluation."""

    status: str                                   # ok | insufficient_data | unavailable
    findings: tuple[Finding, ...]                 # stable findings, most severe first
    misconfiguration: dict[str, float] = field(default_factory=dict)
    configured: dict[str, float] = field(default_factory=dict)
    recommended: dict[str, float] = field(default_factory=dict)
    kv_pressure_score: float | None = None
    idle_capacity_ratio: float | None = None
    tier: TierAdvice | None = None
    waste_dollars_per_hour: float | None = None
    observed_kv_cache_tokens_ratio: float | None = None
    events: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    derived: dict[str, Any] = field(default_factory=dict)


class DriftEngine:
    def __init__(self, cfg: Config, *, raise_after: int = 2, clear_after: int = 2,
                 one_shot: bool = False, previous: "DriftEngine | None" = None) -> None:
        self.cfg = cfg
        self.one_shot = one_shot
        if one_shot:
            raise_after = clear_after = 1
        self.raise_after, self.clear_after = raise_after, clear_after
        # stable state survives a config reload (`previous`: the engine being replaced)
        self.trackers: dict[str, Tracker] = previous.trackers if previous is not None else {}
        self.seen: dict[str, float] = previous.seen if previous is not None else {}
        self.last_prune = 0.0

    # ------------------------------------------------------------------ state
    @staticmethod
    def key(target: str, model_name: str) -> str:
        return f"{target}|{model_name}"

    def tracker(self, target: str, model_name: str, now: float | None = None) -> Tracker:
        k = self.key(target, model_name)
        if now is not None:
            self.seen[k] = now
            self.prune(now)
        t = self.trackers.get(k)
        if t is None:
            t = self.trackers[k] = Tracker(raise_after=self.raise_after, clear_after=self.clear_after)
        return t

    def prune(self, now: float) -> None:
        """Forget targets not evaluated for three windows (they left discovery)."""
        if now - self.last_prune < 60.0:
            return
        self.last_prune = now
        horizon = max(3 * self.cfg.evaluation.window, 3600.0)
        for k in list(self.trackers):
            seen = self.seen.setdefault(k, now)   # restored from state: counts from now
            if now - seen > horizon:
                del self.trackers[k]
                del self.seen[k]

    def to_dict(self) -> dict[str, Any]:
        return {k: t.to_dict() for k, t in self.trackers.items()}

    def restore(self, data: Mapping[str, Any]) -> int:
        n = 0
        for k, v in (data or {}).items():
            if isinstance(v, Mapping) and "|" in k:
                self.trackers[k] = Tracker.from_dict(v)
                n += 1
        return n

    # ------------------------------------------------------------------ judging
    def observe_config(self, target: str, model_name: str, cache_config: Mapping[str, str],
                       now: float) -> dict[str, Any] | None:
        """Record the served cache config; returns the config-change event, if it changed."""
        return self.tracker(target, model_name, now).observe_config(cache_config, now)

    def judge(self, x: DriftInput, now: float, notes: tuple[str, ...] = ()) -> Judgement:
        tracker = self.tracker(x.target, x.model_name, now)
        ok, why = sufficiency(x, one_shot=self.one_shot)
        status = "ok"
        quiet = low_traffic(x) if ok else ""
        blind = ok and x.kv_usage_max is None and x.running_mean is None and x.prompt_tps is None
        raw: list[Finding] = []
        kv_raw: list[Finding] = []
        if blind:
            # e.g. --disable-log-stats: vLLM then exports its config but no load at all
            status = "unavailable"
            findings = [Finding("unavailable", "info", 0.0, explanation=(
                "unavailable: needs vLLM's load metrics (kv_cache_usage, num_requests_running, "
                "prompt_tokens_total); the server exports none (started with --disable-log-stats?)"))]
            findings += tracker.hold(now, x.window_s)
        elif ok and not quiet:
            for rule in RULES:
                got = rule(x)
                if rule is rule_kv_pressure:
                    kv_raw = got
                raw += got
            findings = tracker.update(raw, now)
        elif ok:
            # too little traffic to judge settings; an idle server is still an observation
            status = "insufficient_data"
            raw = rule_idle_capacity(x)
            findings = tracker.update(raw, now) + [Finding("insufficient_data", "info", 0.0, explanation=quiet)]
        else:
            status = "insufficient_data"
            findings = [Finding("insufficient_data", "info", 0.0, explanation=why)]
            findings += tracker.hold(now, x.window_s)
        findings = sorted(findings, key=_order)
        return self._scores(x, raw, kv_raw, findings, status, notes, tracker)

    def _scores(self, x: DriftInput, raw: list[Finding], kv_raw: list[Finding], findings: list[Finding],
                status: str, notes: tuple[str, ...], tracker: Tracker) -> Judgement:
        pred = x.prediction
        active = {f.finding: f for f in findings if f.severity in ("warning", "critical")}
        allf = {f.finding: f for f in findings}
        mis: dict[str, float] = {}
        configured = _configured(x)
        recommended: dict[str, float] = {}
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
            kvf = [f for f in kv_raw if f.finding == "kv_pressure"]
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
        return Judgement(
            status=status, findings=tuple(findings), misconfiguration=mis, configured=configured,
            recommended=recommended, kv_pressure_score=kv_score,
            idle_capacity_ratio=None if idle is None else round(idle, 4), tier=tier,
            waste_dollars_per_hour=waste, observed_kv_cache_tokens_ratio=ratio,
            events=tuple(tracker.events[-5:]), notes=tuple(dict.fromkeys(notes)),
            derived=_derived(x) if status != "unavailable" else {})


_SEV = {"critical": 0, "warning": 1, "info": 2}


def _order(f: Finding) -> tuple[int, float, str]:
    return (_SEV.get(f.severity, 3), -f.score, f.finding)


def _num(v: object) -> float | None:
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


def _derived(x: DriftInput) -> dict[str, Any]:
    """The intermediate quantities the scores are computed from (docs/scores.md), so a reader can
    check a finding's arithmetic."""
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
