"""The finding rules: one pure function per finding, `DriftInput -> list[Finding]`.

Every score means "fraction of achievable goodput (or money) lost" for that finding, in [0, 1],
0 at the optimum; `docs/scores.md` gives each formula. Severity comes from the score through the
per-finding thresholds in `LEVELS` (one place), so severity is monotonic in the score. A rule
that needs a signal the server does not expose returns an `unavailable` finding naming it, never
a guess from a zero.

Why thresholds are where they are: `warning` starts where the loss is large enough to be worth an
operator's attention on a steady window (a few percent of goodput), `critical` where a large
share of the GPU's work or money is lost. The detection benchmark (`benchmarks/detection.py`)
keeps the simulator's healthy scenario below every `warning` threshold.
"""
from __future__ import annotations

import math
from typing import Callable

from exporter.drift.inputs import DriftInput
from exporter.model.spec_decode import ASSUMED_SPEC
from exporter.report import Finding

# finding -> (warning threshold, critical threshold) on the score
LEVELS: dict[str, tuple[float, float]] = {
    "kv_pressure": (0.02, 0.15),
    "max_num_seqs": (0.05, 0.30),
    "gpu_memory_utilization": (0.02, 0.15),
    "max_model_len": (0.25, 0.75),
    "max_num_batched_tokens": (0.10, 0.40),
    "speculative_decoding": (0.05, 0.25),
    "enable_prefix_caching": (0.05, 0.30),
    "kv_cache_dtype": (0.02, 0.15),
    "idle_capacity": (0.85, 0.97),
    "tier_misplacement": (0.30, 0.60),
    "hint_mismatch": (0.30, 1.0),     # always `warning` (set by the rule): a config fix, not an outage
}

KV_FULL = 0.90          # usage at which new blocks start to run out (a request needs several)
KV_SAFE = 0.90          # share of the pool a recommendation may plan to fill
KV_FREE = 0.80          # below this KV is not what limits admission
QUEUE_MIN = 0.5         # mean waiting requests that count as a sustained queue
# Without a configured TPOT SLO, a batch is only grown while TPOT p99 stays under this
# interactive-chat bound (~7 tokens/s per stream is the slowest comfortable reading speed).
DEFAULT_TPOT_SLO = 0.150
DEFAULT_MAX_NUM_SEQS = 256   # vLLM V1 default on GPUs < 70 GiB (and always before 0.9)
# CUDA-graph capture sizes of vLLM V1 (1, 2, 4, 8, then steps of 8 to 256, then 16): a batch
# between two sizes runs padded to the next one, so recommendations land on these.
CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 257, 8)) + tuple(range(272, 1025, 16))


def grade(finding: str, score: float) -> str:
    warn, crit = LEVELS[finding]
    if score >= crit:
        return "critical"
    if score >= warn:
        return "warning"
    return "info"


def clamp(x: float) -> float:
    if x != x:  # NaN
        return 0.0
    return max(0.0, min(1.0, x))


def ramp(x: float | None, lo: float, hi: float) -> float:
    """0 below lo, 1 above hi, linear between: a weight with no step."""
    if x is None:
        return 0.0
    return clamp((x - lo) / (hi - lo))


def capture_floor(n: float) -> int:
    """The largest CUDA-graph capture size not above n (at least 1)."""
    best = 1
    for s in CAPTURE_SIZES:
        if s <= n:
            best = s
        else:
            break
    return best if n < CAPTURE_SIZES[-1] else int(n)


def capture_ceil(n: float) -> int:
    for s in CAPTURE_SIZES:
        if s >= n:
            return s
    return int(math.ceil(n))


def _fmt(x: float | None, nd: int = 0) -> str:
    if x is None:
        return "?"
    if nd == 0:
        return f"{x:,.0f}"
    return f"{x:,.{nd}f}"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _finding(name: str, score: float, explanation: str, *, parameter: str | None = None,
             configured=None, recommended=None, binding: str | None = None,
             severity: str | None = None) -> Finding:
    score = round(clamp(score), 4)
    return Finding(finding=name, severity=severity or grade(name, score), score=score,
                   parameter=parameter, configured=configured, recommended=recommended,
                   explanation=explanation, binding=binding)


def unavailable(what: str, needs: str, how: str = "") -> Finding:
    return Finding(finding="unavailable", severity="info", score=0.0, parameter=None,
                   explanation=f"{what}: unavailable: needs {needs}{'; ' + how if how else ''}",
                   binding=what)


# ---------------------------------------------------------------- shared estimates
def victim_tokens(x: DriftInput) -> float:
    """Tokens a preemption throws away. V1 preemption is recompute-only and picks the most
    recently admitted request (FCFS): its prompt (less prefix hits) and the output it made so far,
    about 1/(N+1) of an output when N requests run at evenly spread ages."""
    if x.prompt_mean is not None and x.output_mean is not None:
        n = max(x.running_mean or 0.0, 0.0)
        return x.prompt_mean * (1.0 - (x.prefix_hit_ratio or 0.0)) + x.output_mean / (n + 1.0)
    return x.resident_tokens or 0.0


def recompute_share(x: DriftInput) -> float | None:
    """Share of the engine's token work spent recomputing preempted requests."""
    if x.preemptions_ps is None or x.prompt_tps is None or x.generation_tps is None:
        return None
    lost = x.preemptions_ps * victim_tokens(x)
    useful = x.prompt_tps + x.generation_tps
    if lost <= 0:
        return 0.0
    return lost / (useful + lost)


def queue_share(x: DriftInput) -> float:
    """Share of the requests in the system that wait instead of being served."""
    if not x.waiting_mean or x.waiting_mean <= 0:
        return 0.0
    running = x.running_mean or 0.0
    return x.waiting_mean / (running + x.waiting_mean)


# KV-blocked queue weight: ramps of the window's mean KV usage and of its peak. Both must be high for
# a queue to be KV's doing; the mean ramp saturates early because on a small pool the usage swings
# by whole requests (0.34 to 1.0 on a 48-block pool, mean ~0.8) and daemons sampling the swing at
# different instants see means 0.74 to 0.80: a ramp that ends at 0.70 gives them all 1.
KV_MEAN_RAMP = (0.40, 0.70)
KV_PEAK_RAMP = (0.80, 0.90)


def kv_level(x: DriftInput) -> float | None:
    """How clearly KV is the limit, 0 to 1: the product of the two ramps (continuous in both)."""
    if x.kv_usage_max is None:
        return None
    mean = x.kv_usage_mean if x.kv_usage_mean is not None else x.kv_usage_max
    return ramp(mean, *KV_MEAN_RAMP) * ramp(x.kv_usage_max, *KV_PEAK_RAMP)


def kv_blocked_share(x: DriftInput) -> float:
    """The queue share weighted by how clearly KV is full: 0 with a free pool (the queue is then
    another limit's), the whole queue share with a full one, linear between. Continuous in every
    input, so daemons scraping one server at different instants agree."""
    return queue_share(x) * (kv_level(x) or 0.0)


def kv_score(x: DriftInput) -> float:
    """The KV pressure score: goodput lost to recomputation after preemption (V1 preempts only
    when KV runs out) or to requests waiting while KV is full, whichever is larger."""
    if x.kv_usage_max is None:
        return 0.0
    return max(recompute_share(x) or 0.0, kv_blocked_share(x))


def kv_bound(x: DriftInput) -> int | None:
    """The largest batch the KV pool holds at the observed per-request footprint."""
    cap, resident = x.capacity_tokens, x.resident_tokens
    if not cap or not resident:
        return None
    return max(1, int(cap * KV_SAFE / resident))


def configured_max_num_seqs(x: DriftInput) -> tuple[int | None, str]:
    """max_num_seqs is not exported by vLLM: a hint, else a plateau of the running count that
    holds while requests wait and KV is free (then it is the limit), else unknown."""
    if x.max_num_seqs:
        return x.max_num_seqs, "hint"
    if (x.running_max is not None and x.waiting_mean is not None and x.waiting_mean >= QUEUE_MIN
            and x.kv_usage_max is not None and x.kv_usage_max < KV_FREE and x.running_max >= 1
            and x.running_mean is not None and x.running_mean >= 0.8 * x.running_max):
        return int(round(x.running_max)), "inferred from the running-count plateau"
    return None, "unknown"


def seqs_in_use(x: DriftInput) -> int:
    """max_num_seqs as best known: hint, inferred plateau, vLLM's default for the GPU and
    version (calculator), else the default on GPUs under 70 GiB."""
    return (x.max_num_seqs or configured_max_num_seqs(x)[0] or x.prediction.default_max_num_seqs
            or DEFAULT_MAX_NUM_SEQS)


def tpot_bound(x: DriftInput) -> int | None:
    """The largest batch whose predicted TPOT stays under the TPOT SLO (needs the calculator)."""
    if x.slo_tpot_s is None or not x.prediction.tpot_at:
        return None
    ok = [b for b, t in sorted(x.prediction.tpot_at.items()) if t <= x.slo_tpot_s]
    return max(ok) if ok else 1


# ---------------------------------------------------------------- rules
def rule_kv_pressure(x: DriftInput) -> list[Finding]:
    if x.kv_usage_max is None:
        return [unavailable("kv_pressure", "kv_cache_usage (vllm:kv_cache_usage_perc or "
                                           "vllm:gpu_cache_usage_perc)")]
    out: list[Finding] = []
    if x.preemptions_ps is None and x.samples >= 2:
        out.append(unavailable("kv_pressure preemption share", "num_preemptions_total "
                                                               "(vllm:num_preemptions_total, vLLM >= 0.8)"))
    rec = recompute_share(x) or 0.0
    blocked = kv_blocked_share(x)
    score = max(rec, blocked)
    if score <= 0 and x.kv_usage_max < KV_FULL:
        return out
    per_req = (x.preemptions_ps / x.arrival_rps) if (x.preemptions_ps and x.arrival_rps) else None
    one = x.samples <= 1
    parts = [f"KV cache usage {'is' if one else 'peaked at'} {_pct(x.kv_usage_max)}"
             + ("" if one else f" (mean {_pct(x.kv_usage_mean)})")]
    if x.preemptions_ps:
        parts.append(f"{x.preemptions_ps * 60:.1f} preemptions/min"
                     + (f" ({per_req:.2f} per request)" if per_req is not None else "")
                     + f" recompute {_pct(rec)} of the token work")
    if blocked:
        parts.append(f"{x.waiting_mean:.1f} requests {'wait' if one else 'wait on average'} beside "
                     f"{x.running_mean or 0:.1f} running with KV full ({_pct(queue_share(x))} of the "
                     f"requests in the system)")
    if score <= 0:
        parts.append("no preemptions or KV-blocked queue yet")
    cap = x.capacity_tokens
    kb = kv_bound(x)
    expl = "; ".join(parts) + (f"; the {_fmt(cap)}-token pool holds about {kb} requests of "
                               f"{_fmt(x.resident_tokens)} tokens" if cap and kb else "") + (
        f"; the pool is sized by {x.pool_fixed_by}, not gpu_memory_utilization" if x.pool_fixed_by and score > 0
        else "") + "."
    out.append(_finding("kv_pressure", score, expl, binding="kv_cache"))
    return out


def rule_max_num_seqs(x: DriftInput) -> list[Finding]:
    configured, how = configured_max_num_seqs(x)
    kb, tb = kv_bound(x), tpot_bound(x)
    out: list[Finding] = []
    # too high: the admitted batch needs more KV than the pool holds (preemption churn) ...
    rec_share = recompute_share(x) or 0.0
    if (x.kv_usage_max or 0.0) >= KV_FULL and rec_share > 0 and kb is not None \
            and x.running_max is not None and x.running_max > kb:
        rec = capture_floor(kb)
        conf = configured or x.max_num_seqs
        expl = (f"up to {x.running_max:.0f} requests were admitted but the KV pool holds about {kb} "
                f"at {_fmt(x.resident_tokens)} tokens each, so {_pct(rec_share)} of the token work "
                f"is recomputation after preemption; cap max_num_seqs at {rec}.")
        out.append(_finding("max_num_seqs", rec_share, expl, parameter="max_num_seqs",
                            configured=conf, recommended=rec, binding="kv_cache"))
        return out
    # ... or the TPOT SLO is missed at the running batch without preemptions
    if (x.slo_tpot_s is not None and x.tpot_p99 is not None and x.tpot_p99 > x.slo_tpot_s
            and not (x.preemptions_ps or 0) and x.running_mean and x.running_mean >= 2):
        score = 1.0 - x.slo_tpot_s / x.tpot_p99
        rec = tb if tb is not None else capture_floor(max(1.0, x.running_mean * x.slo_tpot_s / x.tpot_p99))
        expl = (f"TPOT p99 is {x.tpot_p99 * 1000:.0f} ms against a {x.slo_tpot_s * 1000:.0f} ms SLO "
                f"at {x.running_mean:.1f} running requests; a batch of {rec} meets it (or scale out).")
        out.append(_finding("max_num_seqs", score, expl, parameter="max_num_seqs",
                            configured=configured, recommended=rec, binding="tpot_slo"))
        return out
    # too low: a queue while KV is free, no preemption and TPOT within its SLO (without an SLO,
    # within the interactive default); not while harmful speculation explains the slow batch
    if (x.waiting_mean is not None and x.waiting_mean >= QUEUE_MIN and x.kv_usage_max is not None
            and x.kv_usage_max < KV_FREE and not (x.preemptions_ps or 0) and configured):
        slo_tpot = x.slo_tpot_s if x.slo_tpot_s is not None else DEFAULT_TPOT_SLO
        if x.tpot_p99 is not None and x.tpot_p99 > 0.9 * slo_tpot:
            return out
        sp = spec_speedup_estimate(x) if x.spec_k else None
        if sp is not None and sp < 1.0:
            return out
        demand = (x.running_mean or 0.0) + x.waiting_mean
        bounds = [b for b in (kb, tb) if b is not None]
        limit = min(bounds) if bounds else None
        want = capture_ceil(max(demand * 1.5, configured + 1))
        rec = min(want, capture_floor(limit)) if limit is not None else want
        if rec <= configured:
            return out
        score = min(queue_share(x), 1.0 - configured / rec)
        binding = "kv_cache" if limit is not None and rec == capture_floor(limit) and kb == limit else (
            "tpot_slo" if tb is not None and limit == tb and rec == capture_floor(tb) else "demand")
        expl = (f"{x.waiting_mean:.1f} requests wait on average while {_fmt(x.running_max)} run "
                f"(max_num_seqs {configured}, {how}), KV usage peaks at {_pct(x.kv_usage_max)} and "
                f"nothing is preempted; max_num_seqs {rec} serves the observed demand of "
                f"{demand:.1f} concurrent requests"
                + (f" within the KV pool (about {kb} requests)" if kb else "")
                + ("" if tb is not None or x.slo_tpot_s is None else "; TPOT at that batch is not "
                   "predicted without the GPU and model hints") + ".")
        out.append(_finding("max_num_seqs", score, expl, parameter="max_num_seqs",
                            configured=configured, recommended=rec, binding=binding))
    return out


def default_gpu_memory_utilization(x: DriftInput) -> float:
    return 0.92 if x.vllm_version and x.vllm_version >= (0, 20, 0) else 0.90


def rule_gpu_memory_utilization(x: DriftInput) -> list[Finding]:
    util = x.gpu_memory_utilization
    if util is None or x.pool_fixed_by:
        # a pool given in bytes or blocks ignores gpu_memory_utilization: raising it frees nothing
        # (kv_pressure still says the pool is full, and names the flag that sized it)
        return []
    kv = kv_score(x)
    target = default_gpu_memory_utilization(x)
    if kv > 0 and util < target - 0.02:
        gain = None
        pool_gib = x.kv_cache_memory_gib or x.prediction.kv_cache_gib
        mem = x.prediction.gpu_memory_gib
        if pool_gib and mem:
            gain = (target - util) * mem / pool_gib          # relative growth of the KV pool
        # share of the pressure the extra memory relieves: the pool grows by `gain`; the
        # observed need is the admitted batch at the observed footprint
        need = None
        if x.capacity_tokens and x.resident_tokens and x.running_max:
            need = x.running_max * x.resident_tokens / (x.capacity_tokens * KV_SAFE) - 1.0
        relief = 1.0 if gain is None or need is None or need <= 0 else min(1.0, gain / need)
        score = kv * relief
        expl = (f"gpu_memory_utilization is {util:g} while the KV pool is full "
                f"(usage peak {_pct(x.kv_usage_max)}, {_pct(kv)} of goodput lost to preemption or "
                f"KV-blocked queueing); raising it to {target:g} grows the pool"
                + (f" by {_pct(gain)}" if gain is not None else
                   " by the freed memory (size not predicted: GPU or model hint missing)") + ".")
        return [_finding("gpu_memory_utilization", score, expl, parameter="gpu_memory_utilization",
                         configured=util, recommended=target, binding="kv_cache")]
    if util >= 0.95:
        score = clamp((util - 0.95) / 0.05) * 0.2
        sev = "warning" if util >= 0.98 else "info"
        expl = (f"gpu_memory_utilization {util:g} leaves {100 * (1 - util):.0f}% of the GPU for CUDA "
                f"graphs, NCCL buffers and other processes: startup or an activation spike may run "
                f"out of memory; {target:g} is the vLLM default.")
        return [_finding("gpu_memory_utilization", score, expl, parameter="gpu_memory_utilization",
                         configured=util, recommended=target, binding="oom_risk", severity=sev)]
    return []


def _round_len(n: float) -> int:
    """Round a context length up to the next multiple of 1024 (at least 1024)."""
    return max(1024, int(math.ceil(n / 1024.0)) * 1024)


def rule_max_model_len(x: DriftInput) -> list[Finding]:
    mml = x.max_model_len
    if mml is None:
        return []
    need = x.needed_len_p99
    coarse = f" ({', '.join(x.coarse)}: the bucket is too coarse to tell more)" if x.coarse else ""
    # too small: requests stop on the context limit. `finished_reason="length"` also counts
    # requests that stopped at their own max_tokens; only the part prompt+output could push to
    # max_model_len is blamed on it (context_length_share, from request_params_max_tokens).
    share = x.context_length_share if x.context_length_share is not None else x.length_share
    if (share is not None and share >= 0.01 and need is not None and need >= 0.9 * mml):
        rec = _round_len(need * 1.25)
        expl = (f"{_pct(share)} of requests stop on the length limit and prompt+output p99 "
                f"reaches about {_fmt(need)} tokens of the {_fmt(mml)}-token context{coarse}; "
                f"max_model_len {rec} would let them finish.")
        sev = "critical" if share >= 0.10 else ("warning" if share >= 0.02 else "info")
        return [_finding("max_model_len", share, expl, parameter="max_model_len",
                         configured=mml, recommended=rec, binding="length_truncation", severity=sev)]
    if x.length_share is None and need is not None and need >= mml:
        return [unavailable("max_model_len too small", "request_success_total{finished_reason}")]
    if need is None:
        if {"prompt_tokens", "generation_tokens"} <= set(x.families):
            return []            # the histograms exist; no request finished in the window yet
        return [unavailable("max_model_len", "request_prompt_tokens and request_generation_tokens "
                                             "histograms")]
    rec = _round_len(need * 1.25)
    cap = x.capacity_tokens
    if mml >= 2 * rec and cap:
        score = clamp((mml - rec) / cap)
        expl = (f"max_model_len is {_fmt(mml)} but prompt+output p99 is at most {_fmt(need)} tokens{coarse}: "
                f"one request left without max_tokens may claim {_pct(min(1.0, mml / cap))} of the "
                f"{_fmt(cap)}-token KV pool (max concurrency {cap / mml:.1f}x); {rec} covers the "
                f"observed traffic with margin.")
        return [_finding("max_model_len", score, expl, parameter="max_model_len", configured=mml,
                         recommended=rec, binding="observed_length_p99")]
    return []


def rule_max_num_batched_tokens(x: DriftInput) -> list[Finding]:
    """Long prompts chunked by a small token budget make TTFT high with a short queue."""
    if x.slo_ttft_s is None or x.ttft_p99 is None or x.ttft_p99 <= x.slo_ttft_s:
        return []
    budget = x.max_num_batched_tokens
    if budget is None and x.iteration_tokens_max is not None:
        budget = int(x.iteration_tokens_max)
    if budget is None or x.prompt_p50 is None:
        return [unavailable("max_num_batched_tokens", "the max_num_batched_tokens hint or the "
                                                      "iteration_tokens_total histogram")]
    queued = x.queue_p99 is not None and x.queue_p99 > 0.5 * x.ttft_p99
    if queued or x.prompt_p50 <= budget:
        return []
    score = 1.0 - x.slo_ttft_s / x.ttft_p99
    rec = int(2 ** math.ceil(math.log2(max(x.prompt_p50, budget + 1))))
    expl = (f"TTFT p99 is {x.ttft_p99:.2f} s against a {x.slo_ttft_s:.2f} s SLO with a short queue, "
            f"and the median prompt ({_fmt(x.prompt_p50)} tokens) takes several steps at "
            f"{_fmt(budget)} tokens per step; {rec} prefills it in one (TPOT rises during prefills).")
    return [_finding("max_num_batched_tokens", score, expl, parameter="max_num_batched_tokens",
                     configured=budget, recommended=rec, binding="ttft_slo")]


SPEC_LOW_ACCEPTANCE = 0.5   # accepted tokens per draft below which speculation is judged at capacity


def spec_batch(x: DriftInput) -> tuple[float, str]:
    """The batch speculation is judged at: the running batch when acceptance is healthy; with low
    acceptance (< 0.5 tokens gained per step, at most a 1.5x gain even at batch 1) the batch the
    replica runs at capacity, because that is where the achievable goodput is decided and where
    verification of rejected drafts costs most."""
    low = x.spec_mean_accepted is not None and x.spec_mean_accepted < SPEC_LOW_ACCEPTANCE
    if not low:
        return max(1.0, x.running_mean or 1.0), "running"
    cap = x.prediction.capacity_batch
    if cap is None:
        seqs = seqs_in_use(x)
        kb = kv_bound(x)
        cap = min(seqs, kb) if kb else seqs
    return max(float(cap), x.running_mean or 1.0), "capacity"


def spec_speedup_estimate(x: DriftInput) -> float | None:
    """Leviathan's improvement factor E[tokens] / (k c + verify) at the batch `spec_batch`
    chooses: from the calculator when it knows the setup, else from the batch: k extra tokens
    per request cost about min(1, b / 64) / 2 of a step each (decode turns compute-bound near 64
    sequences on current GPUs) plus a drafter cost of 0.05 per token [derived, perf-model.md
    section 5]."""
    _, where = spec_batch(x)
    p = x.prediction
    if where == "capacity" and p.spec_speedup_at_capacity is not None:
        return p.spec_speedup_at_capacity
    if where == "running" and p.spec_speedup is not None:
        return p.spec_speedup
    if x.spec_mean_accepted is None or not x.spec_k:
        return None
    b, _ = spec_batch(x)
    k = x.spec_k
    tokens = 1.0 + x.spec_mean_accepted
    verify = 1.0 + k * min(1.0, b / 64.0) * 0.5
    draft = 0.05 * k
    return tokens / (verify + draft)


SPEC_MIN_GAIN = 1.15      # a missed gain worth mentioning


def rule_speculative_decoding(x: DriftInput) -> list[Finding]:
    if x.spec_k is None or x.spec_k <= 0:
        return rule_speculative_missed(x)
    sp = spec_speedup_estimate(x)
    if sp is None:
        return [unavailable("speculative_decoding", "spec_decode_num_accepted_tokens_total and "
                                                    "spec_decode_num_drafts_total")]
    if sp >= 1.0:
        return []
    b, where = spec_batch(x)
    score = 1.0 - sp
    expl = (f"{x.spec_k:.0f} speculative tokens per step are accepted at "
            f"{_pct(x.spec_acceptance)} ({x.spec_mean_accepted:.2f} tokens per draft); at "
            + (f"the running batch of {b:.0f}" if where == "running" else
               f"the batch of {b:.0f} this replica runs at capacity")
            + f" verification costs more than it saves (estimated speed-up {sp:.2f}x); "
              f"turn speculative decoding off or lower k.")
    return [_finding("speculative_decoding", score, expl, parameter="speculative_decoding",
                     configured=x.spec_k, recommended=0,
                     binding="verify_cost" if where == "running" else "low_acceptance")]


def rule_speculative_missed(x: DriftInput) -> list[Finding]:
    """Speculation off at a small, memory-bound batch where it would cut TPOT. The acceptance this
    traffic would reach is unknown until it runs, so this is `info`, unless the TPOT SLO is
    missed now and the assumed gain would meet it (then the loss is measured: the SLO miss)."""
    sp = x.prediction.spec_missed_speedup
    if sp is None or sp < SPEC_MIN_GAIN:
        return []
    score = 1.0 - 1.0 / sp
    sev = "info"
    tail = ""
    if x.slo_tpot_s is not None and x.tpot_p99 is not None and x.tpot_p99 > x.slo_tpot_s:
        if x.tpot_p99 / sp <= x.slo_tpot_s:
            sev = None
            score = max(score, 1.0 - x.slo_tpot_s / x.tpot_p99)
            tail = (f"; TPOT p99 {x.tpot_p99 * 1000:.0f} ms misses the {x.slo_tpot_s * 1000:.0f} ms SLO "
                    f"and would meet it")
    expl = (f"speculative decoding is off at a running batch of {x.running_mean or 0:.0f}, where "
            f"decoding is memory-bound: {ASSUMED_SPEC['num_tokens']} EAGLE draft tokens at an assumed "
            f"{ASSUMED_SPEC['alpha']:.0%} acceptance would "
            f"speed decoding up about {sp:.2f}x{tail} (the real acceptance is known once tried).")
    return [_finding("speculative_decoding", score, expl, parameter="speculative_decoding",
                     configured=0, recommended=ASSUMED_SPEC["num_tokens"], binding="missed_gain", severity=sev)]


def rule_enable_prefix_caching(x: DriftInput) -> list[Finding]:
    """With caching off vLLM counts no prefix queries, so the hit ratio the cache would reach is
    not measurable. What is measurable: caching is off (cache_config_info), on a V1 engine where
    it is the default and costs nothing when nothing hits, with prefill work to save. The
    estimate of the shareable part is the prompt length under which a quarter of the prompts
    fall (a common system prompt lifts the whole distribution's floor), over the mean prompt."""
    if x.enable_prefix_caching is not False:
        return []
    if not x.v1:
        return []   # V0 caching had overhead and was off by default: no policy finding
    if not x.prompt_tps:
        return []
    floor = x.prompt_p25 if x.prompt_p25 is not None else 0.0
    share_est = clamp(floor / x.prompt_mean) if x.prompt_mean else 0.0
    gen = x.generation_tps or 0.0
    # prefill tokens cost a fraction of a decode token each (batched GEMMs); weight 1/4 [derived]
    prefill_work = 0.25 * x.prompt_tps / (0.25 * x.prompt_tps + gen) if (x.prompt_tps + gen) else 0.0
    score = prefill_work * share_est
    expl = (f"enable_prefix_caching is off on a vLLM V1 engine (default on, no cost when nothing "
            f"hits); {_fmt(x.prompt_tps)} prompt tokens/s are prefilled from scratch"
            + (f" and a quarter of prompts are at least {_fmt(floor)} tokens long (mean "
               f"{_fmt(x.prompt_mean)}), consistent with a shared prefix" if floor else "")
            + "; turn it on (the hit ratio cannot be measured while it is off).")
    sev = "critical" if score >= LEVELS["enable_prefix_caching"][1] else "warning"
    return [_finding("enable_prefix_caching", score, expl, parameter="enable_prefix_caching",
                     configured=False, recommended=True, binding="policy", severity=sev)]


def rule_kv_cache_dtype(x: DriftInput) -> list[Finding]:
    kv = kv_score(x)
    if kv <= 0 or (x.cache_dtype or "auto") != "auto":
        return []
    if x.prediction.fp8_kv_supported is False:
        return []
    need = None
    if x.capacity_tokens and x.resident_tokens and x.running_max:
        need = x.running_max * x.resident_tokens / (x.capacity_tokens * KV_SAFE)
    relief = 1.0 if need is None or need <= 2.0 else 1.0 / (need - 1.0)
    score = kv * clamp(relief)
    expl = (f"the KV pool is the bound ({_pct(kv)} of goodput lost) and the cache is stored in the "
            f"model dtype; kv_cache_dtype fp8 doubles it to about "
            f"{_fmt(2 * x.capacity_tokens) if x.capacity_tokens else '2x the'} tokens "
            f"(check accuracy for the model).")
    sev = "warning" if grade("kv_cache_dtype", score) == "critical" else None  # accuracy trade-off
    return [_finding("kv_cache_dtype", score, expl, parameter="kv_cache_dtype", configured="auto",
                     recommended="fp8", binding="kv_cache", severity=sev)]


OFF_CATALOG = 3.0   # calibrated / a-priori TPOT beyond which the catalog row does not describe the device


def off_catalog(x: DriftInput) -> bool:
    """The server steps at least OFF_CATALOG x slower than its catalog row predicts at this load
    (a CPU or emulated device described as a GPU, a throttled or shared GPU): which of the
    model's terms that slowness belongs to is not identifiable from one operating point, so the
    throughput the model extrapolates to other loads is not evidence of headroom."""
    p = x.prediction
    predicted = p.prior_tpot_s or p.tpot_s
    return bool(predicted and x.itl_mean and x.itl_mean >= OFF_CATALOG * predicted)


def idle_ratio(x: DriftInput) -> tuple[float | None, str]:
    """1 - the utilisation of the most used resource: KV (mean usage over the usable share),
    batch slots (concurrency over a known max_num_seqs: hinted, inferred, or vLLM's default for
    the known GPU; never a guessed default), throughput with the calculator (observed request
    rate over the sustainable rate at the SLOs), and on a non-GPU backend the engine's busy time
    (steps/s x step time): a CPU-bound engine stepping all the time is not idle however empty KV
    is."""
    uses: list[tuple[float, str]] = []
    if x.kv_usage_mean is not None:
        uses.append((x.kv_usage_mean / KV_SAFE, "kv_cache"))
    conc = x.concurrency
    seqs = x.max_num_seqs or configured_max_num_seqs(x)[0] or x.prediction.default_max_num_seqs
    if conc is not None and seqs:
        uses.append((conc / seqs, "max_num_seqs"))
    if x.prediction.current_max_rps and x.arrival_rps is not None:
        uses.append((x.arrival_rps / x.prediction.current_max_rps, "throughput"))
    if x.busy_fraction is not None and (x.observation_only or off_catalog(x)):
        # on a CPU (or other non-GPU) backend a step's cost grows with the batch: time busy is
        # capacity used. On a GPU a small batch steps as long as a large one, so busy time says
        # nothing about headroom there (the finding is then only `info`, below) -- unless the
        # device runs far off its catalog row: then the throughput extrapolated from one
        # calibrated operating point is not to be trusted over the engine's own busy time.
        uses.append((x.busy_fraction, "engine_time"))
    if x.waiting_mean and x.waiting_mean >= QUEUE_MIN:
        uses.append((1.0, "queue"))
    if not uses:
        return None, ""
    u, what = max(uses)
    return clamp(1.0 - u), what


def rule_idle_capacity(x: DriftInput) -> list[Finding]:
    ratio, what = idle_ratio(x)
    if ratio is None:
        return [unavailable("idle_capacity", "kv_cache_usage and num_requests_running")]
    warn, _ = LEVELS["idle_capacity"]
    if ratio < 0.5 * warn:
        return []
    # Without the throughput model (no GPU hint) a busy engine's compute headroom is unknown:
    # KV and batch slots may be idle while the device is not. Then only `info`.
    busy = x.busy_fraction
    sev = None
    if x.prediction.current_max_rps is None and ((busy is not None and busy >= 0.9) or x.observation_only):
        sev = "info"      # compute headroom unknown: what is idle may not be the device
    waste = ""
    cost = x.prediction.current_cost_per_hour
    if cost:
        waste = f"; about ${cost * ratio:.2f}/h of the ${cost:.2f}/h replica buys unused capacity"
    expl = (f"{_pct(ratio)} of the sustainable capacity is unused: {x.concurrency or 0:.1f} requests "
            f"run on average, KV usage averages {_pct(x.kv_usage_mean)} (most used resource: "
            f"{what}){waste}; consolidate replicas or move to a smaller tier"
            + (f" (the engine steps {_pct(busy)} of the time: compute headroom unknown without "
               f"a GPU model)" if sev and busy is not None else
               " (compute headroom unknown without a GPU model)" if sev else "") + ".")
    return [_finding("idle_capacity", ratio, expl, binding=what, severity=sev)]


def rule_tier_misplacement(x: DriftInput) -> list[Finding]:
    p = x.prediction
    if x.observation_only or p.hint_mismatch is not None:
        return []       # no GPU to compare against, or not the one hinted
    if p.basis == "unprofiled":
        return [unavailable("tier_misplacement", "a catalog row for the device (price and profile)",
                            "add it under `gpus:` in the config")]
    if "gpu" in x.missing_hints or "model" in x.missing_hints:
        miss = [h for h in ("gpu", "model") if h in x.missing_hints]
        return [unavailable("tier_misplacement", f"the {' and '.join(miss)} hint",
                            "set targets[].gpu / targets[].model in the config, or the gpu / model "
                            "labels in file_sd (scan: --gpu / --model)")]
    if not p.tiers or p.current_cost_per_hour is None:
        return []
    best = p.tiers[0]
    cur = p.current_cost_per_hour
    # "cannot meet": only against SLOs the operator set, and only when observed (not predicted)
    misses = [1.0 - slo / seen for slo, seen in ((x.slo_tpot_s, x.tpot_p99), (x.slo_ttft_s, x.ttft_p99))
              if slo is not None and seen is not None and seen > slo]
    if misses and (best.gpu != x.gpu or best.tp != x.tp) and best.dollars_per_hour >= cur:
        # the loss is the SLO miss itself: the share of the latency over its target
        expl = (f"{x.gpu} x{x.tp} misses the SLOs at the observed load (by {_pct(max(misses))} of "
                f"its latency); {best.gpu} x{best.tp} x{best.replicas} replicas meets them for "
                f"${best.dollars_per_hour:.2f}/h.")
        return [_finding("tier_misplacement", max(misses), expl, configured=x.gpu, recommended=best.gpu,
                         binding="slo")]
    if best.dollars_per_hour >= cur * 0.95:
        return []
    saving = 1.0 - best.dollars_per_hour / cur
    expl = (f"{best.gpu} x{best.tp} ({best.replicas} replica{'s' if best.replicas > 1 else ''}) meets "
            f"the same SLOs at the observed load for ${best.dollars_per_hour:.2f}/h instead of "
            f"${cur:.2f}/h on {x.gpu} x{x.tp}: ${cur - best.dollars_per_hour:.2f}/h wasted.")
    return [_finding("tier_misplacement", saving, expl, configured=x.gpu, recommended=best.gpu,
                     binding="cost")]


def rule_hint_mismatch(x: DriftInput) -> list[Finding]:
    """The GPU hint contradicts the server's own KV pool: vLLM sizes the pool from the memory it
    profiles, so a pool far from what the hinted GPU would hold for this model means another
    device (or another model). Scored 1 - min(r, 1/r) for the observed/predicted ratio r."""
    mm = x.prediction.hint_mismatch
    if mm is None:
        return []
    likely, ratio = mm
    score = 1.0 - min(ratio, 1.0 / ratio) if ratio > 0 else 1.0
    layout = f"x{x.tp}" if x.pp == 1 else f"x{x.tp * x.pp} (TP {x.tp} x PP {x.pp})"
    if x.dp > 1:
        layout += f" per engine, {x.dp} data-parallel engines"
    expl = (f"the GPU hint says {x.prediction.hinted_gpu or x.gpu} {layout}, but the server's KV pool "
            f"({_fmt(x.kv_cache_tokens)} tokens) is {ratio:.2f}x what that would hold for this model"
            + (f"; it matches {' or '.join(likely)}" if likely else "; no catalogued GPU matches it")
            + ": fix the hint (targets[].gpu, the gpu label, scan --gpu), or the model / quantization / TP-PP hints if the "
              "server runs another one; tier and cost findings are off until then.")
    return [_finding("hint_mismatch", score, expl, configured=x.prediction.hinted_gpu or x.gpu,
                     recommended=likely[0] if likely else None, binding="kv_pool", severity="warning")]


RULES: tuple[Callable[[DriftInput], list[Finding]], ...] = (
    rule_kv_pressure, rule_max_num_seqs, rule_gpu_memory_utilization, rule_max_model_len,
    rule_max_num_batched_tokens, rule_speculative_decoding, rule_enable_prefix_caching,
    rule_kv_cache_dtype, rule_idle_capacity, rule_tier_misplacement, rule_hint_mismatch,
)

# What a server on a non-GPU backend (CPU, TPU, XPU, HPU, Neuron) is judged on: what its metrics
# show directly. No GPU memory, fp8 KV, speculation cost, tier or $/hour finding.
OBSERVATION_RULES: tuple[Callable[[DriftInput], list[Finding]], ...] = (
    rule_kv_pressure, rule_max_num_seqs, rule_max_model_len, rule_max_num_batched_tokens,
    rule_enable_prefix_caching, rule_idle_capacity,
)

# Findings one snapshot (or a window without rates yet) can establish: gauges, configuration, and
# max_model_len against the request shapes of the server's lifetime (its cumulative histograms, from
# 50 finished requests). Everything else needs counter rates over the window and waits for them.
INSTANT = ("kv_pressure", "hint_mismatch", "gpu_memory_utilization", "max_model_len")

# Findings whose score comes from a step-time model: on an unprofiled device they stay `info`
# until calibrated (bindings of the rules above).
STEP_TIME_BINDINGS = ("tpot_slo", "ttft_slo", "verify_cost", "low_acceptance", "missed_gain", "slo",
                      "cost", "throughput")


def run_rules(x: DriftInput) -> list[Finding]:
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(x))
    return out
