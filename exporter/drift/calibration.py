"""Online self-calibration: the step-time model learns each server's speed from its own window.

Why here: the drift engine's scores are distances from the predicted optimum, so a server whose
GPU, driver, kernels or build differ from the catalog would be scored against a wrong optimum
forever. Every evaluation, the observed mean TPOT at the observed load (running batch, request
shape) is one measurement for an extended Kalman filter over the step-time model's free factors
(`exporter.model.calibrate.OnlineCalibration`), and the observed mean TTFT, where it is the
prefill path's (not a queue for a slot), one for the TTFT factors. Servers that share model,
GPU, TP, weight format and vLLM version share one filter — a pool — so a fleet teaches the model
faster than one server, and a new replica starts from what its peers taught.

The basis of a prediction is `prior` until the pool's posterior pins the predicted TPOT at this
load to within `CONFIDENT_SIGMA` (log scale), then `calibrated`; scores and recommendations use
the calibrated factors from then on. Offline measurements (`calibration_files:`, the CSV that
`sweep --out` writes) seed a pool's filter before any live data. Pools are saved in the state
file and survive restarts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import structlog

from exporter.model.calibrate import Measurement, OnlineCalibration, Row, apply, factor_values, fit_setup
from exporter.model.perf import (Calibration, Prediction as PerfPrediction, calibration_for, predict, shape_for,
                                 step_time_shape)
from exporter.model.setup import Setup
from exporter.model.traffic import Traffic

log = structlog.get_logger("vllm_drift")

# Posterior spread of log TPOT at the observed load below which predictions are "calibrated"
# (5 %: the same size as the goal the calibrated model is held to).
CONFIDENT_SIGMA = 0.05
# A window needs this many requests behind its TPOT mean to be a measurement.
MIN_REQUESTS = 20
# Each target contributes at most one measurement per this many seconds, and a pool folds in at
# most POOL_UPDATES_PER_INTERVAL per interval (an update costs a few dozen model evaluations; a
# large pool has more data than it needs, and the CPU goes to the fleet's scrapes instead).
UPDATE_INTERVAL_S = 30.0
POOL_UPDATES_PER_INTERVAL = 8
# The answers of a target's last evaluation are kept with it: every evaluation of a hinted target
# asked the model ~7 times (prior, calibrated, a numeric gradient for the spread) at its observed
# load, 37 % of a soak daemon's CPU. The load is read on a grid of 3 significant digits (<= 0.5 %,
# inside the window's own noise); the predictions are reused only at the same grid point (a
# window's means move by more than that between evaluations of a busy server), the spread, which
# only decides whether the calibrated prediction is confident, while the load stays within 15 %
# and the pool has taken fewer than 8 updates.
SIGMA_REUSE_UPDATES = 8
SIGMA_REUSE_LOAD = 0.15
# A window's mean TTFT is a measurement of the prefill path only while nothing queues for a slot:
# no preemption in the window, fewer than WAITING_LIMIT requests waiting on average (per engine),
# and the requests' mean time queued (vLLM's request_queue_time_seconds) under QUEUE_SHARE of
# their mean TTFT. The simulated kv-pressure server (78 waiting, 0.4 preemptions/s, KV 98 %) has
# 49 % of its 159 s TTFT in that queue; learned from, it would have taught its pool a TTFT 30x
# the healthy replicas' (healthy: nothing waiting, 17 % of 0.21 s queued while a step finishes).
QUEUE_SHARE = 0.5
WAITING_LIMIT = 1.0


class _Answers(NamedTuple):
    """A target's last evaluation, kept for the next one."""

    point: tuple                     # (setup, gridded traffic, gridded concurrency)
    prior: PerfPrediction            # the a-priori prediction there
    calibration: Calibration | None  # the calibration in use
    calibrated: PerfPrediction | None  # its prediction there, when confident
    sigma: float | None              # the posterior spread of log TPOT
    sigma_at: tuple                  # (pool updates, operating point) when sigma was computed


def _near(then: tuple, updates: int, point: tuple) -> bool:
    """Whether a spread computed at `then` (pool updates, operating point) still stands."""
    (u0, (setup0, t0, c0)), (setup, t, c) = then, point
    if setup0 != setup or not 0 <= updates - u0 < SIGMA_REUSE_UPDATES:
        return False
    if abs(t.prefix_hit_ratio - t0.prefix_hit_ratio) > SIGMA_REUSE_LOAD:
        return False
    return all(abs(a - b) <= SIGMA_REUSE_LOAD * b for a, b in (
        (c, c0), (t.prompt_tokens_mean, t0.prompt_tokens_mean), (t.output_tokens_mean, t0.output_tokens_mean)))


def _grid(v: float) -> float:
    """`v` to 3 significant digits."""
    return float(f"{v:.3g}")


def pool_key(setup: Setup) -> str:
    """Servers alike enough to share a step-time calibration. An --enforce-eager server waits on
    its kernel launches, which no fitted factor describes: it pools only with eager servers; an
    MoE model's expert shards follow its data / expert parallelism."""
    version = ".".join(str(v) for v in setup.vllm_version) if setup.vllm_version else "?"
    moe = (f"|dp{setup.dp}" + ("ep" if setup.expert_parallel else "")
           if setup.model.is_moe and (setup.dp > 1 or setup.expert_parallel) else "")
    return (f"{setup.model.name}|{setup.gpu.name}|tp{setup.tp}|pp{setup.pp}|{setup.quantization or 'native'}|{version}"
            + moe + ("|eager" if setup.enforce_eager else ""))


@dataclass(frozen=True)
class Calibrated:
    """What calibration says about one target's prediction."""

    basis: str                                  # "prior" | "calibrated"
    calibration: Calibration | None             # the factors in use when calibrated
    tpot_s: float | None                        # at the observed load, on `basis`
    ttft_s: float | None
    prior_tpot_s: float | None
    prior_ttft_s: float | None
    factors: Mapping[str, float]                # calibrated factor values (empty on prior)
    fit_error: float | None                     # |relative TPOT error| of the last measurement
    updates: int = 0                            # measurements folded into the pool
    rejected: int = 0                           # measurements refused for breaking physics
    pool: str = ""
    sigma: float | None = None                  # posterior spread of log TPOT at this load
    itl_p99_s: float | None = None              # expected p99 gap between tokens at this load
    ttft_p99_s: float | None = None             # expected p99 TTFT at this load


class FleetCalibration:
    """The pools of a fleet, and per target what it has already contributed."""

    def __init__(self, rows: Sequence[Row] = ()) -> None:
        self.pools: dict[str, OnlineCalibration] = {}
        self.rows: list[Row] = list(rows)
        self.seen: dict[tuple[str, str], float] = {}        # (target, model) -> lifetime TPOT count
        self.last_update: dict[tuple[str, str], float] = {}  # (target, model) -> its last update
        self.recent: dict[str, list[float]] = {}             # pool -> times of its recent updates
        self.memo: dict[tuple[str, str], _Answers] = {}     # (target, model) -> its last answers
        # (target, model) whose refused fit was logged at warning: its next refusals (every
        # UPDATE_INTERVAL_S while the contradiction lasts) go to debug, until a fit is accepted
        self.warned: set[tuple[str, str]] = set()

    def set_rows(self, rows: Sequence[Row]) -> None:
        """New offline rows (a config reload): pools not yet seeded by live data are re-seeded."""
        self.rows = list(rows)
        for key in [k for k, f in self.pools.items() if f.updates == 0]:
            del self.pools[key]

    def _pool(self, key: str, setup: Setup, prior: Calibration) -> OnlineCalibration:
        filt = self.pools.get(key)
        if filt is None:
            filt = OnlineCalibration()
            if self.rows:
                fit, notes = fit_setup(setup, self.rows, quantization=setup.quantization,
                                       vllm_version=setup.vllm_version)
                if fit.below_floor or fit.outliers:
                    # rows of the calibration files the seed left out, once per pool
                    log.info("calibration rows set aside", pool=key,
                             notes=[n for n in notes if "set aside" in n])
                if fit.rows_used and not fit.rejected:
                    # start from the measured runs: their fitted factors, with the fit's spread
                    names = list(fit.names)
                    idx = [names.index(n) for n in filt.names]
                    filt.mean = [fit.logm[i] for i in idx]
                    filt.cov = [[fit.covariance[i][j] for j in idx] for i in idx]
            self.pools[key] = filt
        return filt

    def evaluate(self, setup: Setup, *, target: str, model_name: str, prompt_mean: float | None,
                 output_mean: float | None, prefix_hit_ratio: float | None, running_mean: float | None,
                 tpot_mean: float | None, window_requests: float, lifetime_requests: float | None,
                 now: float, one_shot: bool = False, ttft_mean: float | None = None,
                 ttft_requests: float = 0.0, queue_mean: float | None = None,
                 waiting_mean: float | None = None, preemptions_ps: float | None = None) -> Calibrated | None:
        """Fold this window in (when it holds new requests) and say what the prediction's basis
        is at the observed load. None when the load cannot be described to the model.

        The window's mean TTFT joins the measurement when it is the prefill path's: enough
        requests behind it, the model not saturated at this load, no preemption, fewer than
        WAITING_LIMIT waiting and the requests' time queued (`queue_mean`) under QUEUE_SHARE of
        it; a TTFT made of waiting for KV blocks or a slot is what the KV findings score, not a
        speed to learn."""
        if not prompt_mean or not output_mean or prompt_mean < 1 or output_mean < 1:
            return None
        if not running_mean or running_mean < 0.5:
            return None
        traffic = Traffic(prompt_tokens_mean=_grid(prompt_mean), output_tokens_mean=_grid(output_mean),
                          prefix_hit_ratio=round(min(0.99, max(0.0, prefix_hit_ratio or 0.0)), 3))
        conc = max(1.0, _grid(running_mean))
        shape = shape_for(setup)
        prior = calibration_for(shape.gpu_name, shape.gpu_vendor)
        key = pool_key(setup)
        filt = self._pool(key, setup, prior)

        def at(cal: Calibration | None) -> PerfPrediction:
            return predict(setup, traffic, concurrency=conc, calibration=cal)

        new = self._new_requests(target, model_name, window_requests, lifetime_requests)
        recent = [t for t in self.recent.get(key, ()) if now - t < UPDATE_INTERVAL_S]
        self.recent[key] = recent
        due = one_shot or (now - self.last_update.get((target, model_name), -math.inf) >= UPDATE_INTERVAL_S
                           and len(recent) < POOL_UPDATES_PER_INTERVAL)
        point = (setup, traffic, conc)
        last = self.memo.get((target, model_name))
        same = last is not None and last.point == point
        p0 = last.prior if same else at(None)
        if tpot_mean and tpot_mean > 0 and new >= MIN_REQUESTS and due:
            ttft = None
            if (ttft_mean and ttft_mean > 0 and ttft_requests >= MIN_REQUESTS and not p0.saturated
                    and math.isfinite(p0.ttft_s) and (queue_mean or 0.0) <= QUEUE_SHARE * ttft_mean
                    and (waiting_mean or 0.0) < WAITING_LIMIT and not (preemptions_ps or 0.0) > 0.0):
                ttft = float(ttft_mean)
            meas = Measurement(at, float(tpot_mean), ttft, weight=min(new, window_requests or new))
            before = filt.rejected
            if filt.update(prior, meas):
                self.seen[(target, model_name)] = lifetime_requests if lifetime_requests is not None else 0.0
                self.last_update[(target, model_name)] = now
                recent.append(now)
                if target not in filt.targets:
                    filt.targets.append(target)
                self.warned.discard((target, model_name))
            elif filt.rejected > before:
                first = (target, model_name) not in self.warned
                self.warned.add((target, model_name))
                (log.warning if first else log.debug)(
                    "calibration rejected", target=target, model_name=model_name, pool=key,
                    observed_tpot_s=round(tpot_mean, 5),
                    reason="the fit would leave the physical range of the step-time factors",
                    **({"repeats": "counted in vllm_drift_model_calibration_rejections, logged at debug"}
                       if first else {}))
        # the factors on a 1 % grid: the costly predictions (capacity, TPOT table) are cached per
        # calibration, and a converged pool's posterior wanders by less than that
        cal = (apply(prior, filt.names, [round(m / 0.01) * 0.01 for m in filt.mean])
               if filt.updates or self.rows else None)
        sigma, sigma_at = None, (filt.updates, point)
        if cal is not None:
            # the spread of the prediction (5 model runs: a numeric gradient) says only whether
            # it is confident; it moves slowly with the load and the pool: computed again after
            # SIGMA_REUSE_UPDATES updates of the pool or a load SIGMA_REUSE_LOAD away
            if last is not None and last.sigma is not None and _near(last.sigma_at, filt.updates, point):
                sigma, sigma_at = last.sigma, last.sigma_at
            else:
                sigma = filt.tpot_sigma(prior, Measurement(at, None, None))
        confident = cal is not None and sigma is not None and sigma <= CONFIDENT_SIGMA
        p1 = p0
        if confident:
            p1 = last.calibrated if same and last.calibration == cal and last.calibrated is not None else at(cal)
        self.memo[(target, model_name)] = _Answers(point, p0, cal, p1 if confident else None, sigma, sigma_at)
        # what this server should show at this load: the p99 inter-token gap is a decode step that
        # also carries a full prefill budget (the slowest step continuous batching schedules)
        used = cal if confident and cal is not None else prior
        ctx = float(prompt_mean) + float(output_mean) / 2.0
        chunk = max(float(setup.max_num_batched_tokens) - conc, 1.0)
        itl_p99 = step_time_shape(shape, used, conc, conc * ctx, chunk, 0.0)
        return Calibrated(
            itl_p99_s=_num(itl_p99), ttft_p99_s=_num(p1.ttft_p99_s),
            basis="calibrated" if confident else "prior", calibration=cal if confident else None,
            tpot_s=_num(p1.tpot_s), ttft_s=_num(p1.ttft_s), prior_tpot_s=_num(p0.tpot_s),
            prior_ttft_s=_num(p0.ttft_s),
            factors=factor_values(cal, filt.names) if confident and cal is not None else {},
            fit_error=filt.last_error, updates=filt.updates, rejected=filt.rejected, pool=key,
            sigma=sigma)

    def _new_requests(self, target: str, model_name: str, window_requests: float,
                      lifetime_requests: float | None) -> float:
        """Requests not yet folded in: the lifetime TPOT count since this target's last update
        (the whole window after a counter reset or on first sight)."""
        if lifetime_requests is None:
            return window_requests
        last = self.seen.get((target, model_name))
        if last is None or lifetime_requests < last:
            return window_requests
        return min(lifetime_requests - last, window_requests)

    def forget(self, target: str, model_name: str) -> None:
        self.memo.pop((target, model_name), None)
        self.seen.pop((target, model_name), None)
        self.last_update.pop((target, model_name), None)

    # ------------------------------------------------------------------ state
    def to_dict(self) -> dict[str, Any]:
        return {"pools": {k: f.to_dict() for k, f in self.pools.items() if f.updates}}

    def restore(self, doc: Mapping[str, Any]) -> int:
        """Pools from a saved document; raises ValueError/TypeError on an unusable one."""
        pools = doc.get("pools") or {}
        if not isinstance(pools, Mapping):
            raise ValueError("calibration.pools is not a mapping")
        for key, data in pools.items():
            self.pools[str(key)] = OnlineCalibration.from_dict(data)
        return len(pools)


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
