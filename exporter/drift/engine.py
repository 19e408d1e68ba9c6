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
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from exporter.config import Config
from exporter.drift.inputs import DriftInput
from exporter.drift.observe import MIN_COVER, low_traffic, sufficiency
from exporter.drift.rules import (INSTANT, LEVELS, OBSERVATION_RULES, RULES, STEP_TIME_BINDINGS, clamp,
                                  configured_max_num_seqs, idle_ratio, kv_bound, kv_level, queue_share,
                                  recompute_share, victim_tokens)
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
    statuses: dict[str, dict[str, str]] = field(default_factory=dict)   # finding -> status, reason


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

    # Finding state of a target that left discovery is kept this many windows (1 h with the
    # default 10 min window): one that comes back (a rescheduled pod, a flapping endpoint)
    # resumes its hysteresis. In windows, not wall seconds, so that a compressed soak (a
    # shorter window) sees the steady state a production fleet reaches after an hour.
    PRUNE_WINDOWS = 6

    def prune(self, now: float) -> None:
        """Forget targets not evaluated for PRUNE_WINDOWS windows (they left discovery)."""
        if now - self.last_prune < min(60.0, self.cfg.evaluation.window / 10):
            return
        self.last_prune = now
        horizon = self.PRUNE_WINDOWS * self.cfg.evaluation.window
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
        """One evaluation of one (target, model).

        A window with rates runs every rule; a window without them yet (a new target, a counter
        reset, one snapshot given to `scan`) still runs the rules whose findings one snapshot
        proves (`INSTANT`: KV pool full with a queue, the GPU hint against the pool, a risky
        memory setting, max_model_len against the server's lifetime request shapes); every other
        finding says how much more data it needs (`finding_status`)."""
        tracker = self.tracker(x.target, x.model_name, now)
        rules = OBSERVATION_RULES if x.observation_only else RULES
        names = _names(rules)
        ok, why = sufficiency(x, one_shot=self.one_shot)
        asleep = _asleep(x)
        awake = ok and not asleep       # a window whose load can be judged
        quiet = low_traffic(x) if awake else ""
        blind = (x.kv_usage_max is None and x.running_mean is None and x.waiting_mean is None
                 and x.prompt_tps is None)
        if blind:
            # e.g. --disable-log-stats: vLLM then exports its config but no load at all
            status = "unavailable"
            reason = ("needs vLLM's load metrics (kv_cache_usage, num_requests_running, prompt_tokens_total); "
                      "the server exports none (started with --disable-log-stats?)")
            statuses = {n: {"status": "unavailable", "reason": reason} for n in names}
            findings = tracker.hold(now, x.window_s)
            return self._scores(x, [], findings, status, notes, tracker, statuses)
        ran = _per_engine([f for rule in rules for f in rule(x)], x.engines)
        if awake and not quiet:
            status = "ok"
            raw = _step_time_capped(x, [f for f in ran if f.finding in LEVELS])
            findings = tracker.update(raw, now)
            judged = set(names)
            pending = ""
        else:
            status = "insufficient_data"
            # max_model_len only against the lifetime's request shapes (>= 50 requests), never a
            # short or quiet window's handful
            scope = tuple(n for n in INSTANT if n != "max_model_len" or x.lifetime_shapes)
            scope += ("idle_capacity",) if awake else ()
            ran = [f for f in ran if _instant(f, scope) or (f.finding == "unavailable" and
                                                             _finding_of(f) in scope)]
            raw = _step_time_capped(x, [f for f in ran if f.finding in LEVELS])
            if awake:      # a quiet server: idleness and instant findings; the rest clear
                findings = tracker.update(raw, now)
            else:
                # the gauge means behind kv_pressure already span every scrape in the window:
                # with raise_after of them, its minimum duration is met
                confirmed = frozenset({"kv_pressure"}) if x.samples >= self.raise_after else frozenset()
                findings = tracker.partial(raw, now, scope, x.window_s, confirmed)
            judged = {n for n in names if n in scope}
            pending = asleep or quiet or (why if self.one_shot else _needs_more(x, why))
        statuses: dict[str, dict[str, str]] = {}
        for n in names:
            if n in judged:
                statuses[n] = {"status": "ok", "reason": ""}
            else:
                statuses[n] = {"status": "insufficient_data", "reason": pending}
        if "hint_mismatch" in statuses and x.prediction.hint_mismatch is None and not (
                x.kv_cache_tokens and x.prediction.kv_cache_tokens):
            statuses["hint_mismatch"] = {"status": "unavailable", "reason": (
                "needs the model and GPU hints and the server's KV pool (cache_config_info)")}
        real = {f.finding for f in ran if f.finding in LEVELS}
        for f in ran:
            if f.finding == "unavailable":
                n = _finding_of(f)
                if n in statuses and n not in real:
                    statuses[n] = {"status": "unavailable", "reason": f.explanation}
        if x.observation_only:
            for n in LEVELS:
                if n not in statuses:
                    statuses[n] = {"status": "unavailable", "reason": (
                        f"not judged on vLLM's {x.backend} backend (no GPU model for it)")}
        findings = sorted(findings, key=_order)
        return self._scores(x, raw, findings, status, notes, tracker, statuses)

    def _scores(self, x: DriftInput, raw: list[Finding], findings: list[Finding], status: str,
                notes: tuple[str, ...], tracker: Tracker, statuses: dict[str, dict[str, str]]) -> Judgement:
        pred = x.prediction
        # a scan's window spans whatever pair it was given: confidence is measured against the
        # window the daemon judges on
        ref = min(x.window_s, self.cfg.evaluation.window) if x.window_s > 0 else self.cfg.evaluation.window
        findings = [replace(f, confidence=_confidence(x, f, ref)) for f in findings]
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
            # a parameter judged without a finding is recommended as configured; while data are
            # insufficient nothing is recommended (absent, not a copy of the configured value)
            for param, value in configured.items():
                if statuses.get(param, {}).get("status") == "ok":
                    recommended.setdefault(param, value)
        kv_score = None
        idle = None
        if statuses.get("kv_pressure", {}).get("status") == "ok":
            kvf = [f for f in raw if f.finding == "kv_pressure"]
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
            derived=_derived(x) if status != "unavailable" else {}, statuses=statuses)


def _names(rules: tuple) -> list[str]:
    """The findings a rule set can raise, in LEVELS order."""
    owned = {RULE_FINDING.get(r.__name__) for r in rules}
    return [n for n in LEVELS if n in owned]


RULE_FINDING = {"rule_kv_pressure": "kv_pressure", "rule_max_num_seqs": "max_num_seqs",
                "rule_gpu_memory_utilization": "gpu_memory_utilization", "rule_max_model_len": "max_model_len",
                "rule_max_num_batched_tokens": "max_num_batched_tokens",
                "rule_speculative_decoding": "speculative_decoding",
                "rule_enable_prefix_caching": "enable_prefix_caching", "rule_kv_cache_dtype": "kv_cache_dtype",
                "rule_idle_capacity": "idle_capacity", "rule_tier_misplacement": "tier_misplacement",
                "rule_hint_mismatch": "hint_mismatch"}


def _per_engine(found: list[Finding], engines: int) -> list[Finding]:
    """Findings of a server with several data-parallel engines say that their counts, rates and
    recommended values are one engine's (vLLM applies max_num_seqs, the token budget and the KV
    pool per engine, and the rules judged one engine's share of the load)."""
    if engines <= 1:
        return found
    note = f" Figures are per engine: {engines} data-parallel engines serve behind this server, each with these settings."
    return [f if f.finding == "unavailable" else replace(f, explanation=f.explanation + note) for f in found]


_SLEEP_LEVELS = {1: "level 1: weights offloaded to CPU memory, KV cache discarded",
                 2: "level 2: weights and KV cache discarded"}


def _asleep(x: DriftInput) -> str:
    """Why nothing load-based is judged while the engine sleeps (vLLM sleep mode), or ""."""
    if not x.sleep_level:
        return ""
    what = _SLEEP_LEVELS.get(x.sleep_level, f"level {x.sleep_level}")
    return (f"the engine is asleep (vLLM sleep mode, {what}): no load reaches it by design, so its "
            "load says nothing about its settings; load findings resume a window after it wakes")


def _finding_of(f: Finding) -> str:
    """The finding an `unavailable` note is about (its binding's first word)."""
    return (f.binding or "").split(" ")[0]


def _instant(f: Finding, scope: tuple[str, ...]) -> bool:
    """A finding one snapshot proves: in scope, and for the memory setting only the risk of the
    setting itself (the too-low case needs KV pressure over time)."""
    if f.finding not in scope:
        return False
    return f.finding != "gpu_memory_utilization" or f.binding == "oom_risk"


def _step_time_capped(x: DriftInput, raw: list[Finding]) -> list[Finding]:
    """On an unprofiled device (a generic prior, not yet calibrated) findings scored from the
    step-time model stay `info`: the model may be off by more than the finding's margin."""
    if x.prediction.basis != "unprofiled":
        return raw
    return [replace(f, severity="info", explanation=f.explanation + " (info only: step times on this "
                    "device are an unprofiled prior until calibrated)")
            if f.binding in STEP_TIME_BINDINGS and f.severity != "info" else f for f in raw]


def _needs_more(x: DriftInput, why: str) -> str:
    """`why` plus how long until rate-based findings can be judged."""
    need = MIN_COVER * x.window_s
    missing = max(0.0, need - x.covered_s)
    if missing <= 0:
        return why
    minutes = max(1, math.ceil(missing / 60.0))
    return f"needs {minutes} more minute{'s' if minutes > 1 else ''} of data ({why})"


# the findings' confidence: config-proven ones are as good as the config (and the model behind
# the comparison); gauge-proven ones grow with the scrapes agreeing and the window filling;
# rate-based ones with the share of the window covered
CONFIG_PROVEN = {"hint_mismatch": 0.8}


def _confidence(x: DriftInput, f: Finding, window_s: float) -> float:
    # how full the window is: how long it has been filling, not the span of what it holds now
    # (a whole window's span moves between 7/8 of it and all of it with the scrape times and the
    # baselines it keeps; the confidence of a steady server's findings must not move with them)
    fill = clamp(max(x.covered_s, x.history_s) / window_s) if window_s > 0 else 0.0
    if f.finding in CONFIG_PROVEN:
        return CONFIG_PROVEN[f.finding]
    if f.finding == "gpu_memory_utilization" and f.binding == "oom_risk":
        return 1.0
    if f.finding in INSTANT:
        n = max(x.samples, 1)
        return round(1.0 - (1.0 - fill) * 2.0 / (n + 2.0), 3)
    return round(fill, 3)


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
            "max_num_seqs": mns, "max_num_seqs_source": how, "max_running_seen": r(x.max_running_seen, 0),
            "kv_level": r(kv_level(x)), "prompt_p25_tokens": r(x.prompt_p25, 1),
            "prompt_plus_output_p99_tokens": r(x.needed_len_p99, 0), "length_share": r(x.length_share),
            "context_length_share": r(x.context_length_share), "max_tokens_mean": r(x.max_tokens_mean, 1),
            "max_tokens_top_bucket": x.max_tokens_top, "coarse_quantiles": list(x.coarse),
            "gpu": x.gpu, "model": x.model, "backend": x.backend, "backend_evidence": list(x.backend_evidence),
            "observation_only": x.observation_only, "prediction_basis": x.prediction.basis,
            "missing_hints": list(x.missing_hints)}
