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


# ---------------------------------------------------------------------------------------------
# The one assumption calc, scan and the daemon share when no acceptance rate was measured

ACCEPTANCE_RANGE = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_SPEC_TOKENS = 3    # vLLM's EAGLE examples use num_speculative_tokens 3 [vLLM docs, spec decode]
# The single point a yes/no needs when the acceptance is unknown: 0.6 per token, a middling figure
# for chat traffic [assumed]. The same as the daemon's "missed speed-up" (drift/predict.ASSUMED_SPEC).
ASSUMED_ACCEPTANCE = 0.6
ASSUMED_SPEC = {"num_tokens": DEFAULT_SPEC_TOKENS, "alpha": ASSUMED_ACCEPTANCE, "method": "eagle"}
ASSUMPTION = (f"acceptance unknown: shown for 0.3-0.9 (i.i.d. per-token model), "
              f"yes/no at the assumed {ASSUMED_ACCEPTANCE}")


def break_even_acceptance(setup: Any, batch: int, context_tokens: float, *,
                          num_tokens: int = DEFAULT_SPEC_TOKENS, method: str = "eagle") -> float | None:
    """Smallest per-token acceptance alpha at which speculation speeds decoding at `batch`
    (speed-up = 1), or None when even alpha = 1 does not pay off."""
    def speed(a: float) -> float:
        return gain(setup, SpecConfig(num_tokens=num_tokens, alpha=a, method=method), batch,
                    context_tokens).speedup
    if speed(1.0) <= 1.0:
        return None
    if speed(0.0) > 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if speed(mid) <= 1.0 else (lo, mid)
    return round(hi, 4)


def spec_verdict(setup: Any, batch: int, context_tokens: float, *, acceptance: float | None = None,
                 num_tokens: int = DEFAULT_SPEC_TOKENS, method: str = "eagle",
                 min_gain: float = 1.05) -> dict[str, Any]:
    """Does speculative decoding pay at this batch? The shared answer for calc, scan and daemon.

    With a measured `acceptance` the verdict is for that rate; without, for each rate in
    ACCEPTANCE_RANGE, plus the break-even acceptance at this batch, and `assumption` says so.
    `recommended` is true only for a clear win (speed-up >= min_gain) at the given rate, or,
    without one, at ASSUMED_ACCEPTANCE (the point the daemon assumes too)."""
    k = max(int(num_tokens), 1)
    b = max(int(batch), 1)
    rates = (acceptance,) if acceptance is not None else ACCEPTANCE_RANGE
    rows = []
    for a in rates:
        g = gain(setup, SpecConfig(num_tokens=k, alpha=float(a), method=method), b, context_tokens)
        rows.append({"acceptance": round(float(a), 4), "speedup": round(g.speedup, 4),
                     "tokens_per_step": round(g.tokens_per_step, 4), "helps": g.speedup >= min_gain})
    be = break_even_acceptance(setup, b, context_tokens, num_tokens=k, method=method)
    if acceptance is not None:
        recommended = rows[0]["helps"]
        basis = f"measured/given acceptance {acceptance:g}"
        at_point = rows[0]["speedup"]
    else:
        at_point = gain(setup, SpecConfig(num_tokens=k, alpha=ASSUMED_ACCEPTANCE, method=method), b,
                        context_tokens).speedup
        recommended = at_point >= min_gain
        basis = ASSUMPTION
    point = acceptance if acceptance is not None else ASSUMED_ACCEPTANCE
    word = "a clear win" if recommended else ("a small gain" if at_point > 1.0 else "a loss")
    if be is None:
        text = f"loses at batch {b} at any acceptance (the verify step is compute-bound)"
    else:
        text = (f"break-even acceptance {be:.2f} at batch {b}; at {'the assumed ' if acceptance is None else ''}"
                f"{point:g}: x{at_point:.2f}, {word}")
    return {"batch": b, "num_speculative_tokens": k, "method": method, "assumption": basis,
            "by_acceptance": rows, "break_even_acceptance": be, "recommended": recommended,
            "verdict": text}
