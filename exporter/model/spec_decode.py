"""Speculative decoding: does it help this setup at this batch size, and by how much?

Why a model and not a flag: speculation trades extra FLOPs (verifying k draft tokens per request
per step, plus the drafter's own steps) for fewer target steps. While decode is memory-bound the
verify step costs about as much as a plain step and the gain is the expected accepted length; as
the batch grows the verify step turns compute-bound and grows with 1 + k, and the gain becomes a
loss (vLLM docs: spec decode is for "medium-to-low QPS, memory-bound workloads"; SmartSpec,
arXiv 2406.14066). Formulas: Leviathan et al., arXiv 2211.17192 (i.i.d. acceptance alpha).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.errors import InputError

# Cost of one drafter step relative to one target step at the same batch. EAGLE heads are one
# transformer layer (~1/layers of the target plus the shared lm_head), so a few percent; n-gram
# lookup is CPU-side and free on the GPU. [derived; EAGLE paper arXiv 2401.15077 reports the
# head at a few percent of the target's cost]
DRAFT_COST = {"eagle": 0.06, "eagle3": 0.06, "mtp": 0.08, "ngram": 0.0, "draft_model": 0.15}


@dataclass(frozen=True)
class SpecConfig:
    """k draft tokens per step with per-token acceptance `alpha` (or measured per-position
    acceptance `per_position[i]` = P(draft i accepted), vLLM's accepted_per_pos / num_drafts)."""

    num_tokens: int
    alpha: float = 0.0
    per_position: tuple[float, ...] | None = None
    method: str = "eagle"
    draft_cost: float | None = None   # overrides DRAFT_COST[method]

    def __post_init__(self) -> None:
        if self.num_tokens < 0:
            raise InputError(f"speculative tokens must be >= 0 (got {self.num_tokens})")
        if not 0.0 <= self.alpha <= 1.0:
            raise InputError(f"spec acceptance must be in [0, 1] (got {self.alpha})")
        if self.per_position is not None:
            if any(not 0.0 <= p <= 1.0 for p in self.per_position):
                raise InputError("spec per-position acceptance rates must be in [0, 1]")
        if self.method not in DRAFT_COST and self.draft_cost is None:
            raise InputError(f"unknown speculative method {self.method!r}; one of "
                             + ", ".join(sorted(DRAFT_COST)))

    @property
    def expected_tokens(self) -> float:
        """Expected output tokens per target step (accepted drafts + the bonus token)."""
        return expected_tokens(self.num_tokens, self.alpha, self.per_position)

    @property
    def cost_ratio(self) -> float:
        return self.draft_cost if self.draft_cost is not None else DRAFT_COST[self.method]


def expected_tokens(k: int, alpha: float, per_position: tuple[float, ...] | None = None) -> float:
    """E[tokens per target step]: 1 + sum_i P(first i+1 drafts accepted).

    With per-position rates (already cumulative in vLLM's counters) that is 1 + sum(p_i); under
    the i.i.d. model p_i = alpha^(i+1) and the sum is (1 - alpha^(k+1)) / (1 - alpha)."""
    if k <= 0:
        return 1.0
    if per_position:
        return 1.0 + sum(per_position[:k])
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_draft_acceptance(rate: float, k: int) -> float:
    """Invert vLLM's "draft acceptance rate" (accepted / drafted tokens) to the per-token alpha:
    rate = alpha (1 - alpha^k) / (k (1 - alpha)) under the i.i.d. model (bisection; monotone)."""
    if k <= 0:
        raise InputError("speculative tokens must be >= 1 to convert an acceptance rate")
    if not 0.0 <= rate <= 1.0:
        raise InputError(f"draft acceptance rate must be in [0, 1] (got {rate})")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        r = mid * (1 - mid ** k) / (k * (1 - mid)) if mid < 1 else 1.0
        lo, hi = (mid, hi) if r < rate else (lo, mid)
    return (lo + hi) / 2.0


def alpha_from_per_position(per_position: tuple[float, ...]) -> float:
    """alpha ~ p_{i}/p_{i-1} averaged (p_0 itself is alpha)."""
    if not per_position:
        raise InputError("no per-position acceptance rates")
    ratios = [per_position[0]] + [b / a for a, b in zip(per_position, per_position[1:]) if a > 0]
    return sum(ratios) / len(ratios)


@dataclass(frozen=True)
class SpecGain:
    batch: int
    speedup: float          # > 1: faster per output token; < 1: slower
    tokens_per_step: float
    plain_step_s: float
    spec_step_s: float      # verify step + k drafter steps

    @property
    def helps(self) -> bool:
        return self.speedup > 1.0


def gain(setup: Any, spec: SpecConfig, batch: int, context_tokens: float) -> SpecGain:
    """Speed-up of per-token latency at `batch` running requests of mean context `context_tokens`:
    E[tokens] x t_step(B) / (t_verify(B, 1+k tokens each) + k x draft_cost x t_step(B))."""
    from exporter.model.perf import calibration_for, shape_for, step_time_shape

    shape = shape_for(setup)
    cal = calibration_for(shape.gpu_name, shape.gpu_vendor)
    b = max(int(batch), 1)
    plain = step_time_shape(shape, cal, b, b * context_tokens, 0.0)
    if spec.num_tokens <= 0:
        return SpecGain(b, 1.0, 1.0, plain, plain)
    verify = step_time_shape(shape, cal, b, b * context_tokens, 0.0,
                             tokens_per_seq=1.0 + spec.num_tokens)
    spec_step = verify + spec.num_tokens * spec.cost_ratio * plain
    e = spec.expected_tokens
    return SpecGain(b, e * plain / spec_step, e, plain, spec_step)


def gain_table(setup: Any, spec: SpecConfig, context_tokens: float,
               batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[SpecGain]:
    """`gain` per batch size: where speculation stops paying off."""
    return [gain(setup, spec, b, context_tokens) for b in batches]


def break_even_batch(setup: Any, spec: SpecConfig, context_tokens: float, limit: int = 1024) -> int:
    """Largest batch at which speculation still helps (0 if it never does)."""
    if not gain(setup, spec, 1, context_tokens).helps:
        return 0
    lo, hi = 1, limit
    if gain(setup, spec, hi, context_tokens).helps:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gain(setup, spec, mid, context_tokens).helps else (lo, mid)
    return lo
