"""Traffic profile and service-level objectives: the workload side of the performance model.

Kept apart from `Setup` (the engine side) because the same traffic is evaluated against many setups
(the tier ranking tries every GPU x TP), and the daemon fills it from observed counters while the
CLI fills it from flags.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.errors import InputError

# When only means are known, lengths are taken as lognormal with this shape. sigma = 0.6 puts the
# p99 at exp(2.326 sigma - sigma^2 / 2) ~ 3.4x the mean. [assumption: request lengths of chat and
# code traces are right-skewed and roughly lognormal (Splitwise, arXiv 2311.18677, Fig. 3 on the
# Azure LLM inference traces); 0.6 is a middle shape, stated in the output when used]
TAIL_SIGMA = 0.6
Z99 = 2.3263478740408408   # standard normal 99th percentile
TAIL_FACTOR = math.exp(Z99 * TAIL_SIGMA - TAIL_SIGMA**2 / 2.0)


@dataclass(frozen=True)
class Traffic:
    """What the clients send. Token counts are per request; rates are per second.

    `concurrency` is set for closed-loop load (a fixed number of clients, as in benchmark sweeps);
    `arrival_rate_rps` for open-loop load. Both may be absent (then the optimiser picks the
    operating point). Unknown p99 lengths are the mean x TAIL_FACTOR (a documented safety margin,
    see `tail_assumed`), so a max_model_len sized from them does not truncate the stated traffic.
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
        if self.prompt_tokens_p99 is not None:
            return self.prompt_tokens_p99
        return math.ceil(self.prompt_tokens_mean * TAIL_FACTOR)

    @property
    def output_p99(self) -> float:
        if self.output_tokens_p99 is not None:
            return self.output_tokens_p99
        return math.ceil(self.output_tokens_mean * TAIL_FACTOR)

    @property
    def tail_assumed(self) -> list[str]:
        """Which p99 lengths come from the safety margin rather than from the input."""
        return [n for n, v in (("prompt", self.prompt_tokens_p99), ("output", self.output_tokens_p99))
                if v is None]

    def tail_note(self) -> str | None:
        """One sentence saying which tails were assumed and how, or None when all were given."""
        missing = self.tail_assumed
        if not missing:
            return None
        return (f"no p99 given for {' and '.join(missing)} tokens: assumed lognormal lengths "
                f"(sigma {TAIL_SIGMA}), p99 = {TAIL_FACTOR:.2f} x mean "
                f"(prompt p99 {self.prompt_p99:.0f}, output p99 {self.output_p99:.0f}); "
                "pass --prompt-tokens-p99/--output-tokens-p99 to state the tail")


@dataclass(frozen=True)
class SLO:
    """Latency targets at the 99th percentile; None means no target."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("ttft", self.ttft_p99_s), ("tpot", self.tpot_p99_s)):
            if v is not None and not v > 0:
                raise InputError(f"slo: {name} target must be > 0 seconds (got {v})")


def lengths_from_file(path: str) -> dict[str, float]:
    """Mean and p99 prompt/output lengths from a file of requests: CSV with `prompt_tokens` and
    `output_tokens` columns (a benchmark's per-request log, a trace export), or JSON Lines with
    those keys. Errors name the file and line."""
    import csv
    import json
    import statistics
    from pathlib import Path

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--lengths-from {path}: cannot read ({exc.strerror})") from None
    prompts: list[float] = []
    outputs: list[float] = []
    lines = text.splitlines()
    if lines and lines[0].lstrip().startswith("{"):
        rows = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except ValueError:
                    raise InputError(f"--lengths-from {path}:{n}: not a JSON object") from None
    else:
        reader = csv.DictReader(lines)
        missing = {"prompt_tokens", "output_tokens"} - set(reader.fieldnames or [])
        if missing:
            raise InputError(f"--lengths-from {path}: no column {', '.join(sorted(missing))} "
                             "(need prompt_tokens and output_tokens)")
        rows = list(enumerate(reader, 2))
    for n, row in rows:
        try:
            pr, out = float(row["prompt_tokens"]), float(row["output_tokens"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"--lengths-from {path}:{n}: prompt_tokens/output_tokens missing or not numbers") from None
        if not (pr >= 1 and out >= 1):
            raise InputError(f"--lengths-from {path}:{n}: token counts must be >= 1")
        prompts.append(pr)
        outputs.append(out)
    if len(prompts) < 2:
        raise InputError(f"--lengths-from {path}: need at least 2 requests (got {len(prompts)})")

    def p99(xs: list[float]) -> float:
        return float(statistics.quantiles(xs, n=100, method="inclusive")[98])

    return {"prompt_tokens": statistics.fmean(prompts), "prompt_tokens_p99": p99(prompts),
            "output_tokens": statistics.fmean(outputs), "output_tokens_p99": p99(outputs),
            "requests": len(prompts)}
