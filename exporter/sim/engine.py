"""A discrete-event model of one vLLM V1 engine core, so the simulator's metrics come from the
same mechanisms as a real server's (paged KV blocks, continuous batching, chunked prefill,
recompute preemption, prefix caching, speculative decoding) rather than from random numbers.

What is modelled, after `vllm/v1/core/sched/scheduler.py` and `kv_cache_manager.py` (read, not
copied):
- One scheduling step: RUNNING requests first, in order, each given its new tokens (1 + draft
  tokens when decoding, a chunk of the remaining prompt when prefilling) within the step's token
  budget `max_num_batched_tokens`. When the KV pool cannot hold a request's new tokens, the newest
  running request is preempted (its blocks freed, its progress reset to zero: recompute) until the
  allocation fits or the request itself is the victim.
- WAITING requests are admitted (FCFS, a preempted request goes back to the front) only if nothing
  was preempted in this step, while fewer than `max_num_seqs` run and budget is left; a prompt
  larger than the remaining budget is chunked. The head of the queue blocks the rest when its
  blocks do not fit.
- KV pool: `num_gpu_blocks - 1` usable blocks of `block_size` tokens (block 0 is vLLM's null
  block). With prefix caching, full blocks keep a hash after release and stay reusable until
  evicted (LRU); shared prompt prefixes and a preempted request's own blocks can be hit.
  `kv_usage` = referenced blocks / usable blocks, as `BlockPool.get_usage` reports it, taken
  (with running/waiting) at the end of the step, after finished requests freed their blocks, as
  the scheduler's stats are made in `update_from_output`.
- Step time comes from an injected callable (the calculator's step-time model), so the engine
  itself is pure: no clock, no I/O; randomness only from the seeded `random.Random`.
"""
from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

# step_time(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
#           chunks) -> s; chunks: each request's (prefill or draft tokens, context already cached)
StepTimeFn = Callable[[int, int, int, int, Sequence[tuple[int, int]]], float]

FINISHED_REASONS = ("stop", "length", "abort")

# listener(t, new_tokens, finish_reason): called with each step's new tokens of an externally
# submitted request (finish_reason None), then once when it finishes (new_tokens 0)
TokenListener = Callable[[float, int, "str | None"], None]


@dataclass(frozen=True)
class EngineConfig:
    """The vLLM knobs the engine behaviour depends on."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    spec_tokens: int = 0              # num_speculative_tokens (0 = off)
    spec_acceptance: float = 0.0      # per-position conditional acceptance probability
    spec_draft_cost: float = 0.0      # drafter cost per draft token, as a fraction of a step
    # iteration_tokens per step = prompts whose first token came out in it (whole prompt; 0.23+
    # without cache hits, as real 0.32 captures show: sum = local_compute prompt + generated
    # tokens, recomputation after preemption not counted) + tokens generated in the step
    iteration_tokens_computed_only: bool = False

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: `fixed`, `uniform` (min..max), `lognormal` (mean, cv) or
    `exponential` (mean), clipped to [min, max]."""

    mean: float
    kind: str = "lognormal"
    cv: float = 0.5
    min: int = 1
    max: int = 1 << 30

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.mean
        elif self.kind == "uniform":
            v = rng.uniform(self.min, self.max)
        elif self.kind == "exponential":
            v = rng.expovariate(1.0 / self.mean)
        else:  # lognormal with the given mean and coefficient of variation
            s2 = math.log(1.0 + self.cv * self.cv)
            v = rng.lognormvariate(math.log(self.mean) - s2 / 2.0, math.sqrt(s2))
        return max(self.min, min(self.max, int(round(v))))


@dataclass(frozen=True)
class Traffic:
    """Offered load: an arrival process and request shapes."""

    rate: float                          # mean requests per second
    arrival: str = "poisson"             # poisson | bursty | diurnal | constant
    burst_factor: float = 4.0            # bursty: rate multiplier inside a burst
    burst_fraction: float = 0.2          # bursty: share of each period spent bursting
    burst_period_s: float = 30.0
    diurnal_period_s: float = 600.0      # diurnal: one sine period
    diurnal_amplitude: float = 0.5
    prompt: LengthDist = LengthDist(512)
    output: LengthDist = LengthDist(128)  # natural length at which the request stops (EOS)
    max_tokens: int | None = None         # request parameter; None = vLLM default (fill context)
    shared_prefix_tokens: int = 0         # length of a shared system prompt ...
    prefix_groups: int = 1                # ... out of this many distinct ones ...
    prefix_share: float = 0.0             # ... used by this share of requests
    concurrency: int = 0                  # >0: closed loop, this many clients send back to back
    client_timeout_s: float = 600.0       # a client gives up on a request still queued this long

    def rate_at(self, t: float) -> float:
        if self.arrival == "bursty":
            period = max(self.burst_period_s, 1e-9)
            frac = min(max(self.burst_fraction, 0.0), 1.0)
            high = self.rate * self.burst_factor
            low = max(0.0, self.rate * (1.0 - frac * self.burst_factor) / max(1e-9, 1.0 - frac))
            return high if (t % period) < frac * period else low
        if self.arrival == "diurnal":
            return max(0.0, self.rate * (1.0 + self.diurnal_amplitude
                                         * math.sin(2.0 * math.pi * t / self.diurnal_period_s)))
        return self.rate

    def peak_rate(self) -> float:
        if self.concurrency:
            return 0.0
        if self.arrival == "bursty":
            return self.rate * max(1.0, self.burst_factor)
        if self.arrival == "diurnal":
            return self.rate * (1.0 + abs(self.diurnal_amplitude))
        return self.rate


@dataclass(frozen=True)
class Phase:
    """From sim time `at_s` on, the offered load is `traffic`."""

    at_s: float
    traffic: Traffic


class Histogram:
    """Bucket counts for fixed upper bounds (the last, implicit bucket is +Inf)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


# Histogram keys the engine records (the exposition maps them to each era's names).
HISTOGRAM_KEYS = (
    "ttft", "itl", "tpot", "e2e", "queue", "inference", "prefill", "decode",
    "prompt_tokens", "generation_tokens", "max_num_generation_tokens", "params_n",
    "params_max_tokens", "prefill_kv_computed", "iteration_tokens", "num_preemptions",
    "http_highr", "http_few",
)


class Metrics:
    """Everything an exposition needs, as plain numbers: the engine writes, renderers read."""

    def __init__(self, bounds: Mapping[str, Sequence[float]], spec_tokens: int = 0):
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.counters: dict[str, float] = {
            "preemptions": 0, "prompt_tokens": 0, "generation_tokens": 0,
            "prefix_queries": 0, "prefix_hits": 0, "prompt_tokens_cached": 0,
            "prompt_tokens_computed": 0, "spec_drafts": 0, "spec_draft_tokens": 0,
            "spec_accepted": 0, "steps": 0, "http_request_bytes": 0, "http_response_bytes": 0,
        }
        self.finished = {r: 0 for r in FINISHED_REASONS}
        self.spec_accepted_per_pos = [0] * spec_tokens
        self.hist = {k: Histogram(bounds.get(k, ())) for k in HISTOGRAM_KEYS}


class _Request:
    __slots__ = ("rid", "arrival", "prompt_len", "max_tokens", "stop_len", "group",
                 "prefix_tokens", "num_computed", "outputs", "blocks", "scheduled_at",
                 "first_token_at", "last_token_at", "preemptions", "counted_prompt",
                 "cached_first", "listener")

    def __init__(self, rid: int, arrival: float, prompt_len: int, max_tokens: int,
                 stop_len: int, group: int, prefix_tokens: int):
        self.rid = rid
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.stop_len = stop_len
        self.group = group
        self.prefix_tokens = prefix_tokens
        self.num_computed = 0
        self.outputs = 0
        self.blocks: list = []
        self.scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.preemptions = 0
        self.counted_prompt = False
        self.cached_first = -1
        self.listener: TokenListener | None = None

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.outputs


class BlockPool:
    """Paged KV blocks with reference counts and an LRU of evictable cached blocks."""

    def __init__(self, num_gpu_blocks: int, caching: bool):
        self.capacity = num_gpu_blocks - 1       # block 0 is the null block
        self.caching = caching
        self.used = 0                            # blocks referenced by live requests
        self.ref: dict = {}
        self.evictable: OrderedDict = OrderedDict()

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def usage(self) -> float:
        return self.used / self.capacity

    def cost(self, keys: Sequence) -> int:
        """Free blocks needed to reference all `keys` (already-referenced ones are shared)."""
        ref = self.ref
        return sum(1 for k in keys if k not in ref)

    def acquire(self, key) -> None:
        ref = self.ref
        if key in ref:
            ref[key] += 1
            return
        if key in self.evictable:
            del self.evictable[key]
        elif self.capacity - self.used - len(self.evictable) <= 0:
            self.evictable.popitem(last=False)   # evict the least recently freed
        ref[key] = 1
        self.used += 1

    def release(self, key, cacheable: bool) -> None:
        c = self.ref[key] - 1
        if c:
            self.ref[key] = c
            return
        del self.ref[key]
        self.used -= 1
        if cacheable and self.caching:
            self.evictable[key] = None

    def cached_prefix(self, keys: Sequence) -> int:
        """How many leading keys are resident (referenced or evictable)."""
        if not self.caching:
            return 0
        n = 0
        for k in keys:
            if k in self.ref or k in self.evictable:
                n += 1
            else:
                break
        return n


class Engine:
    """One engine core. Drive it with `advance_to(t)`; read `metrics` at any time."""

    def __init__(self, config: EngineConfig, phases: Sequence[Phase], step_time: StepTimeFn,
                 *, seed: int = 0, histogram_bounds: Mapping[str, Sequence[float]] | None = None):
        if not phases:
            raise ValueError("at least one traffic phase is needed")
        self.cfg = config
        self.phases = tuple(sorted(phases, key=lambda p: p.at_s))
        self.step_time = step_time
        self.rng = random.Random(seed)
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.metrics = Metrics(histogram_bounds or {}, config.spec_tokens)
        self.now = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self._next_id = 0
        self._peak = max(p.traffic.peak_rate() for p in self.phases)
        self._next_arrival = self._draw_arrival(0.0)
        self.last_step: dict = {}
        self._admitted = 0
        self._last_expiry = -1.0

    # ---- traffic ---------------------------------------------------------------------------
    def traffic_at(self, t: float) -> Traffic:
        cur = self.phases[0].traffic
        for p in self.phases:
            if p.at_s <= t:
                cur = p.traffic
            else:
                break
        return cur

    def _draw_arrival(self, t: float) -> float:
        """Next arrival after t by thinning a Poisson process at the peak rate."""
        if self._peak <= 0:
            return math.inf
        rng = self.rng
        for _ in range(100000):
            tr = self.traffic_at(t)
            if tr.arrival == "constant" and tr.rate > 0 and not tr.concurrency:
                return t + 1.0 / tr.rate
            t += rng.expovariate(self._peak)
            tr = self.traffic_at(t)
            if not tr.concurrency and rng.random() * self._peak <= tr.rate_at(t):
                return t
        return math.inf

    def _new_request(self, t: float) -> _Request | None:
        tr = self.traffic_at(t)
        rng = self.rng
        cfg = self.cfg
        prompt = tr.prompt.sample(rng)
        group, prefix = -1, 0
        if tr.shared_prefix_tokens > 0 and rng.random() < tr.prefix_share:
            group = rng.randrange(max(1, tr.prefix_groups))
            prefix = tr.shared_prefix_tokens
            prompt += prefix
        stop_len = tr.output.sample(rng)
        rid = self._next_id
        self._next_id += 1
        # the frontend rejects prompts that do not fit max_model_len (HTTP 400); vLLM refuses to
        # start when the KV pool cannot hold one max_model_len request, so a bare engine given
        # such a pool caps requests at the pool's size instead of livelocking
        cap = min(cfg.max_model_len, (cfg.num_gpu_blocks - 1) * cfg.block_size)
        if prompt >= cap:
            return None
        room = cap - prompt
        max_tokens = min(tr.max_tokens, room) if tr.max_tokens else room
        return _Request(rid, t, prompt, max_tokens, stop_len, group, prefix)

    # ---- KV keys ---------------------------------------------------------------------------
    def _key(self, req: _Request, i: int):
        bs = self.cfg.block_size
        if req.group >= 0 and (i + 1) * bs <= req.prefix_tokens and self.cfg.enable_prefix_caching:
            return ("p", req.group, i)
        return (req.rid, i)

    def _keys(self, req: _Request, start: int, stop: int) -> list:
        return [self._key(req, i) for i in range(start, stop)]

    def _allocate(self, req: _Request, total_tokens: int) -> bool:
        need = -(-total_tokens // self.cfg.block_size)
        have = len(req.blocks)
        if need <= have:
            return True
        keys = self._keys(req, have, need)
        pool = self.pool
        if pool.cost(keys) > pool.free:
            return False
        for k in keys:
            pool.acquire(k)
        req.blocks.extend(keys)
        return True

    def _free(self, req: _Request) -> None:
        bs = self.cfg.block_size
        full = req.num_computed // bs
        pool = self.pool
        for i in range(len(req.blocks) - 1, -1, -1):   # tail first, so the tail is evicted first
            pool.release(req.blocks[i], i < full)
        req.blocks = []

    def _preempt(self, req: _Request) -> None:
        self._free(req)
        req.num_computed = 0
        req.preemptions += 1
        self.metrics.counters["preemptions"] += 1
        self.waiting.appendleft(req)

    # ---- one step --------------------------------------------------------------------------
    def _schedule(self) -> tuple[list, int]:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        scheduled: list = []
        preempted = 0
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.num_computed >= req.num_tokens - 1 and req.outputs > 0:
                k = min(cfg.spec_tokens, cfg.max_model_len - req.num_tokens,
                        req.max_tokens - req.outputs - 1)
                n_new = 1 + max(0, k)
            else:
                n_new = req.num_tokens - req.num_computed
            n_new = min(n_new, budget)
            victim = None
            while not self._allocate(req, req.num_computed + n_new):
                victim = running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    break
            if victim is req:
                break
            scheduled.append((req, n_new))
            budget -= n_new
            i += 1
        self._admitted = 0
        if not preempted:
            pool = self.pool
            bs = cfg.block_size
            while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                req = self.waiting[0]
                total = req.num_tokens
                hit_blocks = min(pool.cached_prefix(self._keys(req, 0, (total - 1) // bs)),
                                 (total - 1) // bs)
                hit = hit_blocks * bs
                n_new = min(total - hit, budget)
                need = -(-(hit + n_new) // bs)
                keys = self._keys(req, 0, need)
                if pool.cost(keys) > pool.free:
                    break
                for k in keys:
                    pool.acquire(k)
                req.blocks = keys
                req.num_computed = hit
                self.waiting.popleft()
                running.append(req)
                req.scheduled_at = self.now
                if req.cached_first < 0:
                    # vLLM keeps a preempted request's re-lookup out of the exported prefix-cache
                    # counters (PrefixCacheStats.preempted_*): the real 0.32 KV-pressure capture
                    # shows queries == prompt tokens despite 154 preemptions.
                    req.cached_first = hit
                    if cfg.enable_prefix_caching:
                        self.metrics.counters["prefix_queries"] += total
                        self.metrics.counters["prefix_hits"] += hit
                scheduled.append((req, n_new))
                budget -= n_new
                self._admitted += 1
        return scheduled, preempted

    def step(self) -> float:
        """Run one scheduling step and its model execution; return its duration."""
        cfg = self.cfg
        m = self.metrics
        scheduled, preempted = self._schedule()
        m.running = len(self.running)
        m.waiting = len(self.waiting)
        m.kv_usage = self.pool.usage()
        decode_seqs = decode_ctx = prefill_tokens = prefill_ctx = draft = 0
        chunks: list[tuple[int, int]] = []
        for req, n in scheduled:
            if req.outputs > 0 and req.num_computed >= req.num_tokens - 1:
                decode_seqs += 1
                decode_ctx += req.num_computed
                draft += n - 1
                if n > 1:
                    chunks.append((n - 1, req.num_computed))
            else:
                prefill_tokens += n
                prefill_ctx += req.num_computed
                chunks.append((n, req.num_computed))
        if not scheduled:   # nothing fits (cannot happen with a sane pool); idle a moment
            self.now += 0.001
            return 0.001
        dt = self.step_time(decode_seqs, decode_ctx, prefill_tokens + draft, prefill_ctx, chunks)
        if draft:
            dt *= 1.0 + cfg.spec_draft_cost * cfg.spec_tokens
        dt = max(dt, 1e-5)
        t_end = self.now + dt
        self.now = t_end
        gen_total = 0
        iter_prompt = 0
        iter_prompt_computed = 0
        rng = self.rng
        finished: list[_Request] = []
        c = m.counters
        h = m.hist
        for req, n in scheduled:
            decoding = req.outputs > 0 and req.num_computed >= req.num_tokens - 1
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue                            # a prefill chunk; no token yet
            if decoding and n > 1:                 # speculative: verify n-1 draft tokens
                k = n - 1
                acc = 0
                while acc < k and rng.random() < cfg.spec_acceptance:
                    acc += 1
                c["spec_drafts"] += 1
                c["spec_draft_tokens"] += k
                c["spec_accepted"] += acc
                for p in range(acc):
                    m.spec_accepted_per_pos[p] += 1
                new = 1 + acc
                req.num_computed = req.num_tokens + acc
            else:
                new = 1
                req.num_computed = req.num_tokens
            new = min(new, req.max_tokens - req.outputs)
            req.outputs += new
            req.num_computed = min(req.num_computed, req.num_tokens - 1)
            gen_total += new
            if req.first_token_at is None:
                req.first_token_at = t_end
                h["ttft"].observe(t_end - req.arrival)
            else:
                h["itl"].observe(t_end - req.last_token_at)
            if not req.counted_prompt:
                req.counted_prompt = True
                c["prompt_tokens"] += req.prompt_len
                iter_prompt += req.prompt_len
                cached = max(0, req.cached_first)
                c["prompt_tokens_cached"] += cached
                c["prompt_tokens_computed"] += req.prompt_len - cached
                iter_prompt_computed += req.prompt_len - cached
            req.last_token_at = t_end
            if req.listener is not None:
                req.listener(t_end, new, None)
            if (req.outputs >= req.max_tokens or req.num_tokens >= cfg.max_model_len
                    or req.outputs >= req.stop_len):
                finished.append(req)
        c["generation_tokens"] += gen_total
        c["steps"] += 1
        h["iteration_tokens"].observe(
            (iter_prompt_computed if cfg.iteration_tokens_computed_only else iter_prompt)
            + gen_total)
        if finished:
            done = set(id(r) for r in finished)
            self.running = [r for r in self.running if id(r) not in done]
            for req in finished:
                self._finish(req, t_end)
        # the gauges as vLLM's scheduler reports them: stats are made after the step's output is
        # processed (finished requests freed, before the next step admits anyone), so a poll can
        # catch the pool right after requests left it -- the dips a real small pool shows
        m.running = len(self.running)
        m.waiting = len(self.waiting)
        m.kv_usage = self.pool.usage()
        self.last_step = {"preempted": preempted, "admitted": self._admitted,
                          "scheduled": len(scheduled),
                          "prefill_tokens": prefill_tokens, "decode_seqs": decode_seqs,
                          "tokens": prefill_tokens + decode_seqs + draft, "dt": dt}
        return dt

    def _finish(self, req: _Request, t: float) -> None:
        m = self.metrics
        h = m.hist
        cfg = self.cfg
        if req.outputs >= req.max_tokens or req.num_tokens >= cfg.max_model_len:
            reason = "length"
        else:
            reason = "stop"
        m.finished[reason] += 1
        self._free(req)
        if req.listener is not None:
            req.listener(t, 0, reason)
        sched = req.scheduled_at if req.scheduled_at is not None else req.arrival
        first = req.first_token_at if req.first_token_at is not None else t
        h["e2e"].observe(t - req.arrival)
        h["queue"].observe(max(0.0, sched - req.arrival))
        h["prefill"].observe(max(0.0, first - sched))
        h["decode"].observe(max(0.0, t - first))
        h["inference"].observe(max(0.0, t - sched))
        h["tpot"].observe((t - first) / (req.outputs - 1) if req.outputs > 1 else 0.0)
        h["prompt_tokens"].observe(req.prompt_len)
        h["generation_tokens"].observe(req.outputs)
        h["max_num_generation_tokens"].observe(req.outputs)
        h["params_n"].observe(1)
        h["params_max_tokens"].observe(req.max_tokens)
        h["prefill_kv_computed"].observe(req.prompt_len - max(0, req.cached_first))
        h["num_preemptions"].observe(req.preemptions)
        # the API server's HTTP instrumentation (a non-streaming /v1/completions call; body sizes
        # per token as a real 0.32 server showed them)
        h["http_highr"].observe(t - req.arrival)
        h["http_few"].observe(t - req.arrival)
        m.counters["http_request_bytes"] += 150 + int(4.6 * req.prompt_len)
        m.counters["http_response_bytes"] += 300 + int(6.5 * req.outputs)

    def _expire_waiting(self) -> None:
        """Drop never-scheduled requests whose client gave up (a real server sees the
        disconnect and frees them; vLLM does not count them as finished). Checked once per
        simulated second, so an overloaded scenario's queue stays bounded."""
        if not self.waiting or self.now - self._last_expiry < 1.0:
            return
        self._last_expiry = self.now
        limit = self.traffic_at(self.now).client_timeout_s
        if limit <= 0:
            return
        cutoff = self.now - limit
        if any(r.arrival < cutoff and r.scheduled_at is None for r in self.waiting):
            self.waiting = deque(r for r in self.waiting
                                 if r.arrival >= cutoff or r.scheduled_at is not None)

    # ---- external requests (the simulator's OpenAI endpoints) --------------------------------
    def submit(self, prompt_len: int, max_tokens: int, listener: TokenListener, *,
               stop_len: int | None = None, at: float | None = None) -> object | None:
        """Queue one request from outside the traffic model, arriving at `at` (default now);
        `listener` hears its tokens. None when the prompt does not fit (the frontend's 400)."""
        cfg = self.cfg
        cap = min(cfg.max_model_len, (cfg.num_gpu_blocks - 1) * cfg.block_size)
        if prompt_len < 1 or prompt_len >= cap or max_tokens < 1:
            return None
        rid = self._next_id
        self._next_id += 1
        req = _Request(rid, self.now if at is None else min(at, self.now), prompt_len,
                       min(max_tokens, cap - prompt_len), stop_len or max_tokens, -1, 0)
        req.listener = listener
        self.waiting.append(req)
        return req

    def cancel(self, req: object) -> None:
        """The client went away: drop the request (vLLM aborts it and frees its blocks)."""
        if not isinstance(req, _Request) or req.listener is None:
            return
        req.listener = None
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self._free(req)
        else:
            return
        self.metrics.finished["abort"] += 1

    # ---- driving ---------------------------------------------------------------------------
    def advance_to(self, t_target: float, max_steps: int = 1_000_000) -> int:
        """Simulate until sim time reaches `t_target` (the last step may end a little later).
        Returns the number of steps run."""
        steps = 0
        while steps < max_steps:
            while self._next_arrival <= self.now:
                req = self._new_request(self._next_arrival)
                if req is not None:
                    self.waiting.append(req)
                self._next_arrival = self._draw_arrival(self._next_arrival)
            self._expire_waiting()
            closed = self.traffic_at(self.now).concurrency
            if closed:
                while len(self.waiting) + len(self.running) < closed:
                    req = self._new_request(self.now)
                    if req is not None:
                        self.waiting.append(req)
            if not self.running and not self.waiting:
                m = self.metrics
                m.running = m.waiting = 0
                m.kv_usage = self.pool.usage()
                if self._next_arrival > t_target:
                    self.now = max(self.now, t_target)
                    break
                self.now = self._next_arrival
                continue
            if self.now >= t_target:
                break
            self.step()
            steps += 1
        return steps
