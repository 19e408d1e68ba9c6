"""`DriftInput`: everything the finding rules read about one (target, model) at one evaluation.

Why a separate plain value: the rules must be pure and testable without a scraper, a window or a
calculator, and the window and model modules are free to change shape. `exporter.drift.observe`
builds a `DriftInput` from the window summary, the latest snapshot, `/v1/models` and the target's
`Identity`; the pipeline adds the calculator's `Prediction`; the rules see only this. `None` always means "not
observed" (a family the server does not expose, a hint nobody gave), never zero.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from exporter.model.optimizer import Tier
from exporter.parse.version import Version


@dataclass(frozen=True)
class Prediction:
    """What the calculator says about the target's setup (needs a known model and GPU)."""

    kv_cache_tokens: float | None = None        # predicted "GPU KV cache size" for this setup
    kv_bytes_per_token: float | None = None     # per GPU
    kv_cache_gib: float | None = None           # predicted KV pool per GPU
    gpu_memory_gib: float | None = None         # device memory per GPU
    tpot_s: float | None = None                 # predicted TPOT at the observed load
    tpot_at: dict[int, float] = field(default_factory=dict)   # running batch -> TPOT seconds
    spec_speedup: float | None = None           # predicted speed-up of the configured spec decode
    spec_speedup_at_capacity: float | None = None  # ... at the SLO-feasible batch
    capacity_batch: int | None = None           # SLO-feasible running batch of this replica
    spec_missed_speedup: float | None = None    # speed-up speculation would plausibly give (off now)
    default_max_num_seqs: int | None = None     # vLLM's default for this GPU and version
    fp8_kv_supported: bool | None = None        # the GPU has an fp8 path
    tiers: tuple[Tier, ...] = ()                # cheapest first, meeting the SLOs at the observed load
    current_cost_per_hour: float | None = None  # $/h of the current replica (GPUs x price)
    current_max_rps: float | None = None        # sustainable request rate at the SLOs
    # -- calibration (exporter.drift.calibration): which model the latencies come from
    # prior (catalogued GPU) | unprofiled (a generic or described device, not yet calibrated) |
    # calibrated
    basis: str = "prior"
    ttft_s: float | None = None                 # predicted TTFT at the observed load
    prior_tpot_s: float | None = None           # the a-priori model's TPOT / TTFT there
    prior_ttft_s: float | None = None
    calibration_factors: Mapping[str, float] = field(default_factory=dict)
    fit_error: float | None = None              # |relative TPOT error| of the last measurement
    calibration_updates: int = 0                # measurements the target's pool has folded in
    calibration_rejected: int = 0               # ... and refused for breaking physics
    calibration_pool: str | None = None
    expected_itl_p99_s: float | None = None      # p99 inter-token gap this server should show here
    expected_ttft_p99_s: float | None = None     # p99 TTFT this server should show here
    # the GPU hint contradicts what the server shows: (GPUs the pool fits, best first; observed /
    # predicted pool)
    hint_mismatch: tuple[tuple[str, ...], float] | None = None
    hinted_gpu: str | None = None               # the hint the mismatch is about
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriftInput:
    target: str
    model_name: str
    era: str = "v1"                              # "v0" | "v1"
    vllm_version: Version | None = None

    # -- the window
    window_s: float = 600.0
    covered_s: float = 0.0                       # seconds of data the window holds
    history_s: float = 0.0                       # seconds it has been filling (since creation or a reset)
    samples: int = 0
    reset: bool = False                          # a counter reset happened inside the window

    # -- load: one data-parallel engine's (the server's totals over `engines`: vLLM applies
    # max_num_seqs, the token budget and the KV pool per engine); rates per second over the
    # window; None: family missing
    engines: int = 1                             # data-parallel engines behind the exposition
    sleep_level: int | None = None               # vLLM sleep mode at the latest scrape (0 awake)
    arrival_rps: float | None = None             # finished requests / s (all reasons)
    prompt_tps: float | None = None              # prompt tokens / s
    generation_tps: float | None = None          # generated tokens / s
    preemptions_ps: float | None = None
    steps_ps: float | None = None                # engine steps / s (iteration_tokens count)

    # -- request shapes
    prompt_mean: float | None = None
    prompt_p50: float | None = None
    prompt_p99: float | None = None
    prompt_p25: float | None = None              # lower quartile of prompt length
    output_mean: float | None = None
    output_p99: float | None = None              # bounded by the requested max_tokens and max_model_len
    length_share: float | None = None            # finished_reason="length" / all finished
    # the part of length_share that max_model_len can explain: 0 when every request stopped at its
    # own max_tokens (request_params_max_tokens) and none could reach the context; None: unknown
    context_length_share: float | None = None
    max_tokens_mean: float | None = None          # request_params_max_tokens over the window
    max_tokens_top: float | None = None           # upper bound of its highest populated bucket
    coarse: tuple[str, ...] = ()                  # quantiles read from a bucket too wide to tell
    lifetime_shapes: bool = False                 # request shapes from the server's lifetime (no window yet)
    prefix_hit_ratio: float | None = None
    spec_acceptance: float | None = None         # accepted / draft tokens
    spec_mean_accepted: float | None = None      # accepted tokens per draft (excl. bonus)
    spec_k: float | None = None                  # draft tokens per draft
    iteration_tokens_max: float | None = None    # highest populated iteration_tokens bucket

    # -- behaviour (gauges over the window)
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p99: float | None = None
    queue_p99: float | None = None
    e2e_mean: float | None = None
    itl_mean: float | None = None                 # ~ the engine step time while decoding

    # -- configuration the server reports
    block_size: float | None = None
    kv_cache_tokens: float | None = None          # one engine's pool (Snapshot.kv_cache_tokens)
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    cache_dtype: str | None = None
    mamba_cache_dtype: str | None = None          # the Mamba / linear-attention state's dtypes
    mamba_ssm_cache_dtype: str | None = None
    max_model_len: float | None = None
    kv_cache_memory_gib: float | None = None      # kv_cache_memory_bytes label (0.10.2-0.11.0)
    pool_fixed_by: str | None = None              # the flag that set the pool instead of gpu_memory_utilization

    # -- the target's identity (exporter.drift.predict.Identity: hints resolved once)
    gpu: str | None = None                        # resolved catalog name
    tp: int = 1
    pp: int = 1
    dp: int = 1                                   # data-parallel ranks a MoE layer's experts spread over
    model: str | None = None                      # resolved catalog id / path
    max_num_seqs: int | None = None               # hint
    max_num_batched_tokens: int | None = None     # hint
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    missing_hints: tuple[str, ...] = ()           # "gpu", "model"
    backend: str = "unknown"                      # exporter.model.backends.Backend.kind
    backend_evidence: tuple[str, ...] = ()
    observation_only: bool = False                # CPU/TPU/XPU/HPU/Neuron: no GPU-model findings
    max_running_seen: float | None = None         # highest running count since start/reset

    prediction: Prediction = field(default_factory=Prediction)
    families: frozenset[str] = frozenset()        # canonical signals present

    # ---------------------------------------------------------------- derived
    @property
    def v1(self) -> bool:
        return self.era != "v0"

    @property
    def capacity_tokens(self) -> float | None:
        """KV tokens the recommendations use: observed beats predicted (learning from the fleet)."""
        if self.kv_cache_tokens:
            return self.kv_cache_tokens
        return self.prediction.kv_cache_tokens

    @property
    def resident_tokens(self) -> float | None:
        """Mean KV tokens one running request holds: measured (usage x pool / running) when the
        server is busy enough, else from the request shape (prompt x (1 - hit) + output / 2)."""
        cap = self.capacity_tokens
        if cap and self.kv_usage_mean is not None and self.running_mean and self.running_mean >= 1.0:
            measured = self.kv_usage_mean * cap / self.running_mean
            if measured > 0:
                return measured
        if self.prompt_mean is not None and self.output_mean is not None:
            hit = self.prefix_hit_ratio or 0.0
            bs = self.block_size or 16.0
            return self.prompt_mean * (1.0 - hit) + self.output_mean / 2.0 + bs / 2.0
        return None

    @property
    def concurrency(self) -> float | None:
        """Mean requests in service: the running gauge's mean, or Little's law (finished
        requests/s x mean end-to-end time) when that is larger; gauges sampled at scrape
        instants can miss short requests entirely."""
        little = None
        if self.arrival_rps is not None and self.e2e_mean is not None:
            # e2e includes the queue: requests in the system minus those waiting
            little = max(0.0, self.arrival_rps * self.e2e_mean - (self.waiting_mean or 0.0))
        vals = [v for v in (self.running_mean, little) if v is not None]
        return max(vals) if vals else None

    @property
    def busy_fraction(self) -> float | None:
        """Share of the time the engine is stepping: steps/s x step time (~ inter-token latency)."""
        if self.steps_ps is None or self.itl_mean is None:
            return None
        return min(1.0, self.steps_ps * self.itl_mean)

    @property
    def needed_len_p99(self) -> float | None:
        """An upper bound of the p99 of prompt + output: the sum of the two p99s."""
        if self.prompt_p99 is None or self.output_p99 is None:
            return None
        return self.prompt_p99 + self.output_p99


def with_prediction(x: DriftInput, prediction: Prediction) -> DriftInput:
    """`x` with its prediction: a copy of the instance's fields (`dataclasses.replace` passes
    every one of DriftInput's fields through __init__ again: ~60 us per evaluation)."""
    new = object.__new__(DriftInput)
    new.__dict__.update(x.__dict__)
    new.__dict__["prediction"] = prediction
    return new
