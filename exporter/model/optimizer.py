"""The optimiser: engine flags for a traffic profile, and the cheapest GPU tier that meets the SLOs.

Why explainable: the daemon turns each recommendation into a finding, and an operator only acts on
"lower max_num_seqs to 96" if it says *why* ("KV capacity: 96 requests of this size fit"). Every
recommended value therefore carries its binding constraint. Rules follow
../shared/reference/perf-model.md section 7.3: max_num_seqs = min(TPOT-SLO batch, KV batch),
rounded to a CUDA-graph capture size; replicas from the per-replica sustainable rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from exporter.errors import InputError
from exporter.model.kv_cache import startup_utilization_cap
from exporter.model.perf import Prediction, kv_pool_tokens, kv_slots, predict
from exporter.model.spec_decode import SpecConfig, gain
from exporter.model.traffic import SLO, Traffic

KV_MARGIN = 0.9          # keep 10% of the pool free: outputs longer than the mean preempt first
LOAD_HEADROOM = 0.85     # run replicas at most at 85% of their SLO-feasible rate
SPEC_MIN_GAIN = 1.05     # turn speculation on only for a clear win


def capture_size_floor(n: float) -> int:
    """Round down to a vLLM CUDA-graph capture size (1, 2, 4, 8, then steps of 8 to 256, then
    steps of 16 to 512), so the running batch replays a graph instead of padding up."""
    n = int(math.floor(n))
    if n < 1:
        return 1
    if n < 8:
        return 1 << (n.bit_length() - 1)
    if n <= 256:
        return n // 8 * 8
    if n <= 512:
        return n // 16 * 16
    return n


def round_model_len(tokens: float) -> int:
    """p99 prompt + output rounded up: to 256 below 4k, to 1024 above (block-aligned, readable)."""
    step = 256 if tokens <= 4096 else 1024
    return int(math.ceil(tokens / step) * step)


@dataclass(frozen=True)
class Recommendation:
    max_num_seqs: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    speculative_decoding: bool
    binding: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"max_num_seqs": self.max_num_seqs,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "max_model_len": self.max_model_len,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "speculative_decoding": self.speculative_decoding,
                "binding": dict(self.binding)}


def _ctx(traffic: Traffic) -> float:
    return traffic.prompt_tokens_mean + traffic.output_tokens_mean / 2.0


def tpot_batch_limit(setup: Any, traffic: Traffic, tpot_slo: float, upper: int,
                     spec: SpecConfig | None = None, calibration: Any = None) -> int:
    """Largest closed-loop batch whose predicted TPOT meets the SLO (0 if even 1 does not).

    TPOT here is the mean; the p99 SLO is met with the mean kept under it, since decode steps of
    a fixed mix vary little (the spread comes from prefill chunks, which the mean includes)."""
    def ok(b: int) -> bool:
        return predict(setup, traffic, concurrency=b, spec=spec, calibration=calibration).tpot_s <= tpot_slo
    if not ok(1):
        return 0
    if ok(upper):
        return upper
    lo, hi = 1, upper
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def recommend(setup: Any, traffic: Traffic, slo: SLO | None = None,
              spec: SpecConfig | None = None, calibration: Any = None) -> Recommendation:
    """Engine flags for `setup` serving `traffic` under `slo`, each with its binding constraint.
    `calibration`: factors fitted on this setup's measured rows (`calc --calibrate`): the pool
    they found and their step times size max_num_seqs and max_num_batched_tokens."""
    slo = slo or SLO()
    binding: dict[str, str] = {}
    m = setup.model
    # max_model_len: the longest request the traffic sends, not the model's maximum
    need = traffic.prompt_p99 + traffic.output_p99
    mml = round_model_len(need)
    if mml >= m.max_position_embeddings:
        mml = m.max_position_embeddings
        binding["max_model_len"] = f"model maximum context ({m.max_position_embeddings})"
    else:
        binding["max_model_len"] = (f"p99 prompt+output: {traffic.prompt_p99:.0f}+"
                                    f"{traffic.output_p99:.0f} tokens, rounded up")
    # gpu_memory_utilization: as much as the runtime allows. Before v0.21 CUDA graphs (0.5-2 GiB
    # on H100) are captured outside the pool, so leave room for them; from v0.21 vLLM subtracts
    # its graph estimate itself.
    if setup.cudagraph_estimate_subtracted:
        util = 0.95
        binding["gpu_memory_utilization"] = "runtime headroom (CUDA graphs already in the budget, v0.21+)"
    else:
        headroom_gib = 2.5
        util = round(min(0.95, 1.0 - headroom_gib / setup.gpu_memory_gib), 2)
        binding["gpu_memory_utilization"] = (f"CUDA-graph + runtime headroom ({headroom_gib} GiB of "
                                             f"{setup.gpu_memory_gib:.0f} GiB outside the budget)")
    cap = startup_utilization_cap(setup)
    if cap is not None and util > cap:
        util = math.floor(cap * 100) / 100
        held = (f": {setup.gpu_memory_in_use_gib:g} GiB held by other processes" if setup.gpu_memory_in_use_gib
                else " after vLLM's own context")
        binding["gpu_memory_utilization"] = (f"free memory at startup ({cap * setup.gpu_memory_gib:.1f} of "
                                             f"{setup.gpu_memory_gib:.0f} GiB{held})")
    tuned = setup.with_(gpu_memory_utilization=util, max_model_len=max(mml, 16))
    # max_num_seqs: KV slots for this traffic vs the TPOT SLO batch
    kv_tokens = kv_pool_tokens(tuned, calibration)
    kv_batch = capture_size_floor(max(kv_slots(traffic, kv_tokens, tuned.block_size) * KV_MARGIN, 1))
    default_seqs = tuned.max_num_seqs
    seqs, why = min(default_seqs, kv_batch), "KV capacity" if kv_batch < default_seqs else "vLLM default"
    if why == "KV capacity":
        why = f"KV capacity: {kv_batch} requests of ~{_ctx(traffic):.0f} resident tokens fit with a 10% margin"
    # speculative decoding, decided at the batch the replica will run: the offered load's, or
    # without one the batch it is sized for
    loaded = traffic.arrival_rate_rps is not None or traffic.concurrency is not None
    use_spec, active = False, None
    if spec is not None and spec.num_tokens > 0:
        b = max(int(round(predict(tuned, traffic, calibration=calibration).running)), 1) if loaded else max(seqs, 1)
        g = gain(tuned, spec, b, _ctx(traffic))
        use_spec = g.speedup >= SPEC_MIN_GAIN
        active = spec if use_spec else None
        binding["speculative_decoding"] = (f"{'gain' if g.helps else 'loss'} x{g.speedup:.2f} at batch {b} "
                                           f"(k={spec.num_tokens}, {g.tokens_per_step:.2f} tokens/step)")
    else:
        binding["speculative_decoding"] = "no draft method or acceptance rate given"
    if slo.tpot_p99_s is not None:
        lim = tpot_batch_limit(tuned.with_(max_num_seqs=max(seqs, 1)), traffic, slo.tpot_p99_s, seqs,
                               spec=active, calibration=calibration)
        if lim == 0:
            seqs, why = 1, f"TPOT SLO unreachable on this setup ({slo.tpot_p99_s * 1000:.0f} ms even at batch 1)"
        elif lim < seqs:
            seqs = capture_size_floor(lim)
            why = f"TPOT SLO: batch {seqs} keeps TPOT under {slo.tpot_p99_s * 1000:.0f} ms"
    seqs = max(seqs, 1)
    binding["max_num_seqs"] = why
    # max_num_batched_tokens: big enough to prefill the p99 prompt in one step (TTFT), small
    # enough that a full chunk step does not blow the TPOT SLO for the decodes riding with it
    want = max(2048, int(math.ceil((traffic.prompt_p99 + seqs) / 1024) * 1024))
    mnbt, why = min(want, 16384), f"p99 prompt ({traffic.prompt_p99:.0f}) + running batch in one step"
    if want > 16384:
        why = "16384 cap: longer prompts are chunked (keeps decode steps short)"
    if slo.tpot_p99_s is not None:
        from exporter.model.perf import step_time_s
        ctx = _ctx(traffic)
        while mnbt > 512 and step_time_s(tuned, decode_seqs=seqs, decode_context_tokens=int(seqs * ctx),
                                         prefill_tokens=max(mnbt - seqs, 1),
                                         calibration=calibration) > 3.0 * slo.tpot_p99_s:
            mnbt //= 2
            why = (f"TPOT SLO: a full {mnbt}-token chunk step stays under 3x the "
                   f"{slo.tpot_p99_s * 1000:.0f} ms target")
    if mnbt < seqs:
        mnbt, why = seqs, "must be >= max_num_seqs"
    binding["max_num_batched_tokens"] = why
    final = tuned.with_(max_num_seqs=seqs, max_num_batched_tokens=mnbt)
    if loaded:
        at_load = predict(final, traffic, spec=active, calibration=calibration)
        if at_load.saturated:
            binding["max_num_seqs"] += (f"; the offered load needs more than {seqs} running requests:"
                                        " add replicas (see tiers)")
    return Recommendation(max_num_seqs=int(seqs), gpu_memory_utilization=util,
                          max_model_len=int(mml), max_num_batched_tokens=int(mnbt),
                          speculative_decoding=use_spec, binding=binding)


# ---------------------------------------------------------------------------------------------
# Tier ranking


@dataclass(frozen=True)
class Tier:
    gpu: str
    tp: int
    replicas: int
    dollars_per_hour: float
    dollars_per_million_tokens: float | None
    meets_slo: bool | None       # None: no SLO was given, so nothing to meet
    max_num_seqs: int
    replica_rate_rps: float      # SLO-feasible requests/s of one replica
    why: str
    current: bool = False        # the GPU x TP the question was asked about

    def as_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "tp": self.tp, "replicas": self.replicas,
                "dollars_per_hour": round(self.dollars_per_hour, 4),
                "dollars_per_million_tokens": (None if self.dollars_per_million_tokens is None
                                               else round(self.dollars_per_million_tokens, 4)),
                "meets_slo": self.meets_slo, "max_num_seqs": self.max_num_seqs,
                "replica_rate_rps": round(self.replica_rate_rps, 4), "why": self.why,
                "current": self.current}


def replica_capacity(setup: Any, traffic: Traffic, slo: SLO,
                     calibration: Any = None) -> tuple[float, int, Prediction | None, str]:
    """(SLO-feasible requests/s of one replica, its max_num_seqs, the prediction there, why).
    `calibration`: step-time factors fitted to this server (`exporter.model.calibrate`).

    The batch is the largest meeting the TPOT SLO and fitting the KV pool; at that batch the
    closed-loop throughput is the replica's rate, provided the TTFT SLO holds there (else the
    batch is halved until it does)."""
    kv_tokens = kv_pool_tokens(setup, calibration)
    if kv_tokens <= 0:
        return 0.0, 0, None, "no KV cache left"
    kv_b = int(kv_slots(traffic, kv_tokens, setup.block_size) * KV_MARGIN)
    if kv_b < 1:
        return 0.0, 0, None, "one request does not fit the KV pool"
    b = min(kv_b, setup.max_num_seqs)
    why = "KV capacity" if kv_b < setup.max_num_seqs else "max_num_seqs"
    if slo.tpot_p99_s is not None:
        lim = tpot_batch_limit(setup, traffic, slo.tpot_p99_s, b, calibration=calibration)
        if lim == 0:
            return 0.0, 0, predict(setup, traffic, concurrency=1, calibration=calibration), "TPOT SLO missed at batch 1"
        if lim < b:
            b, why = lim, "TPOT SLO"
    p = predict(setup, traffic, concurrency=b, calibration=calibration)
    while slo.ttft_p99_s is not None and p.ttft_p99_s > slo.ttft_p99_s and b > 1:
        b = max(b // 2, 1)
        why = "TTFT SLO"
        p = predict(setup, traffic, concurrency=b, calibration=calibration)
    if slo.ttft_p99_s is not None and p.ttft_p99_s > slo.ttft_p99_s:
        return 0.0, b, p, "TTFT SLO missed at batch 1"
    return p.requests_per_s, b, p, why


def _load_rps(traffic: Traffic) -> float | None:
    if traffic.arrival_rate_rps is not None:
        return traffic.arrival_rate_rps
    return None


def rank_tiers(model: Any, traffic: Traffic, slo: SLO | None = None, *,
               gpus: Iterable[str] | None = None, tps: Iterable[int] = (1, 2, 4, 8),
               prices: Mapping[str, float] | None = None, quantization: str | None = None,
               kv_cache_dtype: str = "auto", vllm_version: Any = None, max_model_len: int | None = None,
               concurrency_rate: float | None = None, limit: int | None = None,
               current: tuple[str, int] | None = None) -> list[Tier]:
    """Every GPU x TP that holds the model, sorted by $/million output tokens (tiers that miss a
    given SLO last). `meets_slo` is None when no SLO was given. `current` (GPU name, TP) is always
    a row, marked, even past `limit` or when it cannot hold the model.

    Load: the traffic's arrival rate (or `concurrency_rate`, a rate derived elsewhere from an
    observed concurrency). Without one, each tier is sized for one replica and compared by
    $/million output tokens at its SLO-feasible rate. `prices` ($/GPU-hour) override the catalog."""
    from exporter.model.gpus import GPUS, resolve_gpu, tier_names
    from exporter.model.setup import Setup

    slo = slo or SLO()
    prices = {resolve_gpu(k).name: float(v) for k, v in (prices or {}).items()}
    names = [resolve_gpu(g).name for g in gpus] if gpus is not None else tier_names()
    has_slo = slo.ttft_p99_s is not None or slo.tpot_p99_s is not None
    cur = (resolve_gpu(current[0]).name, int(current[1])) if current else None
    extra_gpu = bool(cur and cur[0] not in names)
    if extra_gpu:
        names.append(cur[0])
    tps = tuple(tps)
    load = concurrency_rate if concurrency_rate is not None else _load_rps(traffic)
    mml = max_model_len or round_model_len(traffic.prompt_p99 + traffic.output_p99)
    out: list[Tier] = []
    for name in names:
        gpu = GPUS[name]
        price = prices.get(name, gpu.dollars_per_hour)
        if cur and name == cur[0]:
            tp_list = [cur[1]] if extra_gpu else sorted(set(tps) | {cur[1]})
        else:
            tp_list = list(tps)
        for tp in tp_list:
            is_cur = cur == (name, tp)
            try:
                setup = Setup.build(model, gpu, tp=tp, quantization=quantization,
                                    kv_cache_dtype=kv_cache_dtype, vllm_version=vllm_version,
                                    max_model_len=min(mml, _arch(model).max_position_embeddings))
            except InputError as exc:   # incl. a TP vLLM refuses (heads not divisible by it)
                if is_cur:
                    out.append(Tier(name, tp, 0, 0.0, None, False, 0, 0.0, str(exc), current=True))
                continue
            rate, b, p, why = replica_capacity(setup, traffic, slo)
            if rate <= 0:
                if p is None and not is_cur:
                    continue  # does not hold the model with room for one request
                out.append(Tier(name, tp, 0, 0.0, None, False, b, 0.0, why, current=is_cur))
                continue
            replicas = max(1, math.ceil(load / (rate * LOAD_HEADROOM))) if load else 1
            dph = price * tp * replicas
            served = (load if load else rate) * traffic.output_tokens_mean
            dpm = dph / (served * 3600.0) * 1e6 if served > 0 else None
            out.append(Tier(name, tp, replicas, dph, dpm, True if has_slo else None, b, rate,
                            f"batch {b} bound by {why}; {rate:.2f} req/s per replica", current=is_cur))
    # cheapest per million output tokens first; with a load, $/Mtok is $/hour over the same
    # tokens, so the order is also the cheapest per hour. Tiers that cannot serve come last.
    out.sort(key=lambda t: (t.meets_slo is False, t.dollars_per_million_tokens is None,
                            t.dollars_per_million_tokens or math.inf, t.dollars_per_hour))
    if limit and len(out) > limit:
        head = out[:limit]
        head += [t for t in out[limit:] if t.current]
        return head
    return out


def _arch(model: Any) -> Any:
    from exporter.model.architectures import resolve_model
    return resolve_model(model) if isinstance(model, str) else model
