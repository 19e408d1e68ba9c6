"""The evaluation result for one served model on one target: what the daemon exports, what
`/api/v1/findings` and `scan --json` print. Built by the drift engine, read by the exporters.
"""
from __future__ import annotations

from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Fixed label values (bounded cardinality).
PARAMETERS = ("max_num_seqs", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
              "speculative_decoding", "enable_prefix_caching", "kv_cache_dtype")
FINDINGS = ("kv_pressure", "max_num_seqs", "gpu_memory_utilization", "max_model_len",
            "max_num_batched_tokens", "speculative_decoding", "enable_prefix_caching",
            "kv_cache_dtype", "idle_capacity", "tier_misplacement", "hint_mismatch",
            # no longer emitted as findings (each finding's status says it): kept for old readers
            "insufficient_data", "unavailable")
STATUSES = ("ok", "insufficient_data", "unavailable")
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True, slots=True)
class Finding:
    finding: str                      # one of FINDINGS
    severity: str                     # one of SEVERITIES
    score: float                      # [0, 1]: fraction of achievable goodput or money lost
    parameter: str | None = None      # one of PARAMETERS, when the fix is a setting
    configured: Any = None
    recommended: Any = None
    explanation: str = ""
    binding: str | None = None        # the constraint that sets the recommendation
    since: float | None = None        # unix time the finding became active
    # [0, 1]: how much data backs it; instant findings (one snapshot proves them) start low and
    # grow as the window fills, rate-based ones are reported only with a filled window
    confidence: float | None = None

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar (the values a setting takes): a flat copy is what asdict
        # gives, at a fraction of its cost (the stability tracker keeps one per evaluation)
        d = {name: getattr(self, name) for name in _FINDING_FIELDS}
        for key in ("configured", "recommended"):
            if isinstance(d[key], (dict, list, tuple)):
                d[key] = deepcopy(d[key])
        return d


_FINDING_FIELDS = tuple(f.name for f in fields(Finding))


@dataclass(frozen=True, slots=True)
class TierAdvice:
    current_gpu: str
    recommended_gpu: str
    score: float
    waste_dollars_per_hour: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelReport:
    target: str
    model_name: str
    vllm_version: str | None = None
    engine_era: str | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    status: str = "ok"                                   # ok | insufficient_data | unavailable
    misconfiguration: dict[str, float] = field(default_factory=dict)   # parameter -> score
    configured: dict[str, float] = field(default_factory=dict)         # parameter -> value
    recommended: dict[str, float] = field(default_factory=dict)        # parameter -> value
    kv_pressure_score: float | None = None
    idle_capacity_ratio: float | None = None
    tier: TierAdvice | None = None
    waste_dollars_per_hour: float | None = None
    predicted_kv_cache_tokens: float | None = None
    predicted_tpot_seconds: float | None = None          # at the observed load, on `prediction_basis`
    predicted_ttft_seconds: float | None = None
    prior_tpot_seconds: float | None = None              # the a-priori model's, beside it
    prior_ttft_seconds: float | None = None
    prediction_basis: str = "prior"                      # prior | unprofiled | calibrated
    calibration: dict[str, Any] | None = None            # pool, factors, fit_error, updates, rejected
    observed_kv_cache_tokens_ratio: float | None = None  # observed / predicted capacity
    notes: tuple[str, ...] = ()
    evaluated_at: float | None = None
    events: tuple[dict[str, Any], ...] = ()                # recent config-change events
    derived: dict[str, Any] = field(default_factory=dict)  # quantities the scores come from
    # finding -> {"status": ok|insufficient_data|unavailable, "reason": str}: why a finding is
    # absent (not judged yet, and how long until it is; or a signal the server lacks)
    finding_status: dict[str, dict[str, str]] = field(default_factory=dict)
    slo_seconds: dict[str, float] = field(default_factory=dict)   # "ttft"/"tpot" -> p99 target
    slo_source: dict[str, str] = field(default_factory=dict)      # "ttft"/"tpot" -> configured|default

    def to_json(self) -> dict[str, Any]:
        out = {
            "target": self.target,
            "vllm_version": self.vllm_version,
            "model_name": self.model_name,
            "engine_era": self.engine_era,
            "status": self.status,
            "observed": self.observed,
            "findings": [f.to_json() for f in self.findings],
            "scores": {
                "misconfiguration": self.misconfiguration,
                "kv_pressure": self.kv_pressure_score,
                "idle_capacity_ratio": self.idle_capacity_ratio,
                "tier_misplacement": None if self.tier is None else asdict(self.tier),
                "estimated_waste_dollars_per_hour": self.waste_dollars_per_hour,
            },
            "configured": self.configured,
            "recommended": self.recommended,
            "predicted": {"kv_cache_tokens": self.predicted_kv_cache_tokens,
                          "basis": self.prediction_basis,
                          "tpot_seconds": self.predicted_tpot_seconds,
                          "ttft_seconds": self.predicted_ttft_seconds,
                          "prior_tpot_seconds": self.prior_tpot_seconds,
                          "prior_ttft_seconds": self.prior_ttft_seconds,
                          "calibration": self.calibration,
                          "observed_to_predicted_kv_ratio": self.observed_kv_cache_tokens_ratio},
            "finding_status": self.finding_status,
            "slo": {"p99_seconds": self.slo_seconds, "source": self.slo_source},
            "notes": list(self.notes),
            "events": list(self.events),
            "derived": self.derived,
            "evaluated_at": self.evaluated_at,
        }
        return out
