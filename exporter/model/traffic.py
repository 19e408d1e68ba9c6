"""Traffic profile and service-level objectives: the workload side of the performance model.

Kept apart from `Setup` (the engine side) because the same traffic is evaluated against many setups
(the tier ranking tries every GPU x TP), and the daemon fills it from observed counters while the
CLI fills it from flags.
"""
from __future__ import annotations

from dataclasses import dataclass

from exporter.errors import InputError


@dataclass(frozen=True)
class Traffic:
    """What the clients send. Token counts are per request; rates are per second.

    `concurrency` is set for closed-loop load (a fixed number of clients, as in benchmark sweeps);
    `arrival_rate_rps` for open-loop load. Both may be absent (then the optimiser picks the
    operating point). Percentiles default to the mean when unknown.
    """

    prompt_tokens_mean: float
    output_tokens_mean: float
    prompt_tokens_p50: float | None = None
    prompt_tokens_p99: float | None = None
    output_tokens_p99: float | None = None
    arrival_rate_rps: float | None = None
    concurrency: int | None = None
    prefix_hit_ratio: float = 0.0
    spec_acceptance_rate: float | None = None  # per-token alpha (Leviathan), not vLLM's "draft acceptance rate"
    spec_per_position: tuple[float, ...] | None = None  # p_i = P(draft i accepted), vLLM accepted_per_pos / drafts
    spec_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_tokens_mean >= 1:
            raise InputError(f"traffic: prompt tokens must be >= 1 (got {self.prompt_tokens_mean})")
        if not self.output_tokens_mean >= 1:
            raise InputError(f"traffic: output tokens must be >= 1 (got {self.output_tokens_mean})")
        if not 0.0 <= self.prefix_hit_ratio < 1.0:
            raise InputError(f"traffic: prefix hit ratio must be in [0, 1) (got {self.prefix_hit_ratio})")
        if self.arrival_rate_rps is not None and not self.arrival_rate_rps > 0:
            raise InputError(f"traffic: rate must be > 0 requests/s (got {self.arrival_rate_rps})")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError(f"traffic: concurrency must be >= 1 (got {self.concurrency})")
        if self.spec_acceptance_rate is not None and not 0.0 <= self.spec_acceptance_rate < 1.0:
            raise InputError(f"traffic: spec acceptance must be in [0, 1) (got {self.spec_acceptance_rate})")
        if self.spec_tokens < 0:
            raise InputError(f"traffic: spec tokens must be >= 0 (got {self.spec_tokens})")

    @property
    def prompt_p99(self) -> float:
        return self.prompt_tokens_p99 if self.prompt_tokens_p99 is not None else self.prompt_tokens_mean

    @property
    def output_p99(self) -> float:
        return self.output_tokens_p99 if self.output_tokens_p99 is not None else self.output_tokens_mean


@dataclass(frozen=True)
class SLO:
    """Latency targets at the 99th percentile; None means no target."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("ttft", self.ttft_p99_s), ("tpot", self.tpot_p99_s)):
            if v is not None and not v > 0:
                raise InputError(f"slo: {name} target must be > 0 seconds (got {v})")
