"""A sliding window of one served model's Snapshots, and what it says about traffic.

Why a window: vLLM exports cumulative counters and histograms, so load, latency and request
shape over "the last 10 minutes" are differences between the newest snapshot and the oldest one
still in the window, like PromQL's `rate()` / `histogram_quantile(rate(...))`.

* Bounded: at most `max_samples` snapshots in a ring allocated once, and none older than
  `duration` seconds; gauge means and maxima are kept incrementally (running sums and monotonic
  queues), so `observe()` costs the same whatever the window size; intermediate snapshots are
  thinned to their gauges (memory: ~10 whole snapshots per window, not one per scrape).
* Resets: a counter or histogram count that went down, a new `_created` start time, a changed
  engine count or bucket layout all mean the server restarted (or its aggregation changed). A
  restart is not a negative rate: the window starts afresh from that snapshot and the summary
  says `reset=True` while the reset lies inside the window.
"""
from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from exporter.parse.snapshot import Histogram, Snapshot

__all__ = ["Window", "Observed", "Quantiles", "TRACKED_GAUGES"]

TRACKED_GAUGES = ("kv_cache_usage", "num_requests_running", "num_requests_waiting",
                  "num_requests_waiting_deferred")
_START_TIME_TOLERANCE_S = 1.0


def _tracked(gauges) -> tuple:
    """The window's gauge values of one snapshot, in TRACKED_GAUGES order. Its waiting count is the
    requests waiting for capacity (a batch slot, KV blocks) where vLLM says so (0.20+,
    num_requests_waiting_by_reason): the deferred ones wait on a LoRA slot, a KV transfer or a
    block that no setting judged here changes, and are tracked apart."""
    waiting = gauges.get("num_requests_waiting_capacity")
    return (gauges.get("kv_cache_usage"), gauges.get("num_requests_running"),
            waiting if waiting is not None else gauges.get("num_requests_waiting"),
            gauges.get("num_requests_waiting_deferred"))


@dataclass(frozen=True, slots=True)
class Quantiles:
    """A distribution over the window from histogram bucket deltas (Prometheus
    `histogram_quantile` interpolation); `count` observations fell in the window."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: float

    @classmethod
    def of(cls, hist: Histogram | None) -> "Quantiles | None":
        if hist is None:
            return None
        total = hist.counts[-1] if hist.counts else hist.count
        if not total or total <= 0:
            return None
        return cls(*hist.quantiles((0.5, 0.9, 0.99)), hist.mean(), hist.count or total)


@dataclass(frozen=True, slots=True)
class Observed:
    """What one model's window shows at `now`. Rates are per second over `duration_s`; None
    where the window has fewer than two snapshots or the server lacks the signal."""

    target: str
    model_name: str
    now: float
    samples: int                       # snapshots in the window
    duration_s: float                  # newest - oldest snapshot time
    reset: bool                        # a restart (counter reset) lies inside the window
    resets: int                        # restarts seen since this window was created
    # newest snapshot time - the first one since the window was made or last reset: how long the
    # window has been filling (it is whole from `duration` on, whatever its span does after)
    history_s: float = 0.0
    # arrival and throughput
    requests_per_s: float | None = None          # finished requests (all reasons)
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    preemptions_per_s: float | None = None
    engine_steps_per_s: float | None = None      # iteration_tokens_total count rate
    finished_length_share: float | None = None   # finished_reason="length" / all finished
    # caches and speculation
    prefix_cache_hit_ratio: float | None = None
    spec_decode_acceptance_rate: float | None = None
    spec_decode_mean_acceptance_length: float | None = None
    spec_decode_acceptance_per_pos: tuple[float, ...] = ()
    spec_decode_draft_length: float | None = None  # draft tokens per draft (the configured k)
    # latency (seconds) and request shape (tokens)
    ttft: Quantiles | None = None
    itl: Quantiles | None = None
    tpot: Quantiles | None = None                # per-request TPOT; ITL when the server lacks it
    tpot_source: str | None = None               # "request_tpot" | "itl"
    queue_time: Quantiles | None = None
    e2e: Quantiles | None = None
    prompt_len: Quantiles | None = None
    generation_len: Quantiles | None = None
    tokens_per_step: Quantiles | None = None
    max_tokens_top: float | None = None          # upper bound of the highest request_params_max_tokens
                                                 # bucket that gained requests: no request could generate more
    # gauges over the window
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    waiting_deferred_mean: float | None = None   # waiting on a LoRA slot, a KV transfer...: not in waiting_*
    max_running_seen: float | None = None        # since creation or the last reset: <= max_num_seqs


class Window:
    """The last `duration` seconds (and at most `max_samples` snapshots) of one served model.

    Every snapshot's gauges count towards the window's means and maxima, but only some
    snapshots are kept whole: the newest, and one at least every `keep_every` seconds (default
    duration / 8) as baselines for rates and quantiles. A 10-minute window of 15 s scrapes thus
    holds ~10 full snapshots instead of 40, and its rates cover between 7/8 of the window and
    all of it (`Observed.duration_s` says how much). `keep_every=0` keeps every snapshot whole.
    """

    __slots__ = ("duration", "max_samples", "keep_every", "_ring", "_head", "_size", "_seq",
                 "_sums", "_counts", "_maxq", "_last", "_last_keeper", "_reset_at", "resets",
                 "_max_running_seen", "_since")

    def __init__(self, duration: float, max_samples: int = 256, keep_every: float | None = None) -> None:
        if duration <= 0 or max_samples < 2:
            raise ValueError("a window needs a positive duration and room for two snapshots")
        self.duration = float(duration)
        self.max_samples = int(max_samples)
        self.keep_every = self.duration / 8 if keep_every is None else float(keep_every)
        # entries: (timestamp, tracked gauge values, Snapshot or None once thinned, keeper)
        self._ring: list[tuple | None] = [None] * self.max_samples
        self._head = 0                      # index of the oldest entry
        self._size = 0
        self._seq = 0                       # entries ever added; the oldest has seq _seq - _size
        n = len(TRACKED_GAUGES)
        self._sums = [0.0] * n
        self._counts = [0] * n
        self._maxq: list[deque[tuple[int, float]]] = [deque() for _ in range(n)]
        self._last: Snapshot | None = None
        self._last_keeper: tuple[float, int] | None = None  # (timestamp, seq) of the last keeper
        self._reset_at: float | None = None
        self.resets = 0
        self._max_running_seen: float | None = None
        # the first snapshot's time since the window was made, reset or drained (None: empty)
        self._since: float | None = None

    def __len__(self) -> int:
        return self._size

    @property
    def seq(self) -> int:
        """Snapshots observed since the window was made (a reset does not go back): changes
        exactly when the window does."""
        return self._seq

    def snapshots(self) -> list[Snapshot]:
        """The whole snapshots kept, oldest first (a copy); the newest is always among them."""
        ring, cap = self._ring, self.max_samples
        entries = (ring[(self._head + i) % cap] for i in range(self._size))
        return [e[2] for e in entries if e[2] is not None]  # type: ignore[index]

    # ------------------------------------------------------------------ updates
    def observe(self, snap: Snapshot) -> bool:
        """Add a snapshot; False (and nothing changes) when it is not newer than the last."""
        last = self._last
        if last is not None:
            if snap.timestamp <= last.timestamp:
                return False
            if is_reset(last, snap):
                self._clear()
                self.resets += 1
                self._reset_at = snap.timestamp
            elif woke(last, snap):
                # what the window saw while the engine slept (no load, by design) says nothing
                # about the awake server: its judgement starts again from the wake-up
                self._clear()
        if self._size == self.max_samples:
            self._evict_oldest()
        if self._since is None:
            self._since = snap.timestamp
        self._push(snap)
        self._last = snap
        self._evict_before(snap.timestamp - self.duration)
        running = snap.gauges.get("num_requests_running")
        if running is not None and not math.isnan(running):
            if self._max_running_seen is None or running > self._max_running_seen:
                self._max_running_seen = running
        return True

    def _push(self, snap: Snapshot) -> None:
        cap = self.max_samples
        if self._size:
            prev_idx = (self._head + self._size - 1) % cap
            prev = self._ring[prev_idx]
            if prev is not None and prev[2] is not None:
                if not prev[3]:
                    self._ring[prev_idx] = (prev[0], prev[1], None, False)  # thin it to its gauges
                else:           # a baseline from now on: its bucket counts in flat arrays
                    self._ring[prev_idx] = (prev[0], prev[1], _compact(prev[2]), True)
        ts = snap.timestamp
        # keepers at least every keep_every seconds and every max_samples/8 entries, so that
        # whichever bound evicts, a whole baseline stays near the oldest end
        keeper = (self._last_keeper is None or ts - self._last_keeper[0] >= self.keep_every
                  or self._seq - self._last_keeper[1] >= max(1, self.max_samples // 8))
        if keeper:
            self._last_keeper = (ts, self._seq)
        gauges = snap.gauges
        values = _tracked(gauges)
        self._ring[(self._head + self._size) % cap] = (ts, values, snap, keeper)
        self._size += 1
        seq = self._seq
        self._seq += 1
        for i, v in enumerate(values):
            if v is None or math.isnan(v):
                continue
            self._sums[i] += v
            self._counts[i] += 1
            q = self._maxq[i]
            while q and q[-1][1] <= v:
                q.pop()
            q.append((seq, v))

    def _evict_oldest(self) -> None:
        entry = self._ring[self._head]
        assert entry is not None
        seq = self._seq - self._size
        for i, v in enumerate(entry[1]):
            if v is None or math.isnan(v):
                continue
            self._sums[i] -= v
            self._counts[i] -= 1
            q = self._maxq[i]
            if q and q[0][0] == seq:
                q.popleft()
        self._ring[self._head] = None
        self._head = (self._head + 1) % self.max_samples
        self._size -= 1
        if self._size == 0:
            self._zero_stats()
            self._since = None          # drained (a long outage): it fills again from the next one

    def _evict_before(self, cutoff: float) -> None:
        while self._size and self._ring[self._head][0] < cutoff:  # type: ignore[index]
            self._evict_oldest()

    def _zero_stats(self) -> None:
        # exact zeros when empty (running sums drift by float rounding otherwise)
        for i in range(len(TRACKED_GAUGES)):
            self._sums[i] = 0.0
            self._counts[i] = 0
            self._maxq[i].clear()

    def _clear(self) -> None:
        while self._size:
            self._evict_oldest()
        self._max_running_seen = None
        self._last_keeper = None

    # ------------------------------------------------------------------ reading
    def summary(self, now: float, hists: dict | None = None) -> Observed:
        """The window as of `now` (snapshots older than now - duration are dropped first).
        `hists`, when given, receives the histogram deltas the summary computed (canonical key
        -> Histogram or None), for a caller that needs buckets, not only quantiles."""
        self._evict_before(now - self.duration)
        last = self._last
        target = last.target if last else ""
        model = last.model_name if last else ""
        reset = self._reset_at is not None and self._reset_at >= now - self.duration
        if self._size == 0:
            return Observed(target, model, now, 0, 0.0, reset, self.resets)
        ring, cap = self._ring, self.max_samples
        first: Snapshot | None = None
        for i in range(self._size):
            candidate = ring[(self._head + i) % cap][2]  # type: ignore[index]
            if candidate is not None:
                if first is None:
                    first = candidate
                # a gauges-only snapshot (restored from a state file) cannot be a baseline
                if candidate.counters or candidate.histograms:
                    first = candidate
                    break
        newest: Snapshot = ring[(self._head + self._size - 1) % cap][2]  # type: ignore[index]
        assert first is not None and newest is not None
        dt = newest.timestamp - first.timestamp
        gauge_stats = {}
        for i, key in enumerate(TRACKED_GAUGES):
            n = self._counts[i]
            gauge_stats[key] = ((self._sums[i] / n, self._maxq[i][0][1]) if n else (None, None))
        kv, running, waiting, deferred = (gauge_stats[k] for k in TRACKED_GAUGES)
        base = dict(target=target, model_name=model, now=now, samples=self._size, duration_s=dt,
                    reset=reset, resets=self.resets, kv_usage_mean=kv[0], kv_usage_max=kv[1],
                    running_mean=running[0], running_max=running[1], waiting_mean=waiting[0],
                    waiting_max=waiting[1], waiting_deferred_mean=deferred[0],
                    max_running_seen=self._max_running_seen,
                    history_s=newest.timestamp - self._since)
        if dt <= 0:
            return Observed(**base)
        return Observed(**base, **_deltas(first, newest, dt, hists))


# the histograms a baseline is differenced for (`_deltas`): the others a scrape parses (vLLM's
# prefill/decode/inference time) are read from the newest snapshot only, never as a baseline
BASELINE_HISTOGRAMS = frozenset(("ttft_seconds", "itl_seconds", "tpot_seconds", "e2e_seconds",
                                 "queue_time_seconds", "prompt_tokens", "generation_tokens",
                                 "iteration_tokens", "max_tokens_param"))


class _Packed(Mapping):
    """A read-only mapping over one `array('d')`: `_layout` (shared by every baseline of the
    same shape) maps each key to where its value lies; subclasses read the value."""

    __slots__ = ("_layout", "_data")

    def __init__(self, layout: dict, data: array) -> None:
        self._layout = layout
        self._data = data

    def get(self, key, default=None):
        # not Mapping.get: that one raises and catches KeyError for every absent key
        return self[key] if key in self._layout else default

    def __contains__(self, key) -> bool:
        return key in self._layout

    def __iter__(self):
        return iter(self._layout)

    def __len__(self) -> int:
        return len(self._layout)


class PackedHistograms(_Packed):
    """A baseline's histograms in one `array('d')`: each histogram's counts, then its sum and
    count, at offsets a layout shared by every baseline of the same shape gives (key -> (bounds,
    offset, number of counts)). A `Histogram` is made on access (a baseline is read once per
    evaluation)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Histogram:
        bounds, off, n = self._layout[key]
        d = self._data
        return Histogram(bounds, d[off:off + n], d[off + n], d[off + n + 1])


_LAYOUTS: dict[tuple, dict[str, tuple[tuple[float, ...], int, int]]] = {}


class PackedValues(_Packed):
    """A baseline's counters or gauges: the values in one `array('d')`, the keys in an index
    (key -> position) shared by every baseline with the same keys (a dict of ~20 floats is
    ~1.5 KiB of objects, this is ~0.2 KiB)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> float:
        return self._data[self._layout[key]]


_INDEXES: dict[tuple[str, ...], dict[str, int]] = {}


def _pack_values(values: Mapping[str, float]) -> Mapping[str, float]:
    if type(values) is not dict or not values or not all(type(v) is float for v in values.values()):
        return values
    keys = tuple(values)
    index = _INDEXES.get(keys)
    if index is None:
        if len(_INDEXES) > 4096:
            _INDEXES.clear()
        index = _INDEXES[keys] = {k: i for i, k in enumerate(keys)}
    return PackedValues(index, array("d", values.values()))


def _compact(snap: Snapshot) -> Snapshot:
    """The same snapshot with only the histograms a baseline is read for (BASELINE_HISTOGRAMS:
    a quarter of vLLM's are never differenced) packed into one `array('d')` (8 bytes a number)
    instead of Histogram objects holding tuples of float objects (~32 bytes a number plus
    ~250 bytes of objects per histogram), and its counters and gauges alike (`PackedValues`):
    a window's baselines are most of a target's memory at 10,000 targets (docs/scaling.md).
    Read-only like the original."""
    hists = snap.histograms
    packed = dict(counters=_pack_values(snap.counters), gauges=_pack_values(snap.gauges))
    if not hists or type(hists) is PackedHistograms:
        return replace(snap, **packed)
    kept = [(k, h) for k, h in hists.items() if k in BASELINE_HISTOGRAMS]
    shape = tuple((k, h.bounds, len(h.counts)) for k, h in kept)
    layout = _LAYOUTS.get(shape)
    if layout is None:
        layout, off = {}, 0
        for k, bounds, n in shape:
            layout[k] = (bounds, off, n)
            off += n + 2
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        _LAYOUTS[shape] = layout
    data = array("d")
    for _k, h in kept:
        data.extend(h.counts)
        data.append(h.sum)
        data.append(h.count)
    return replace(snap, histograms=PackedHistograms(layout, data), **packed)


def woke(prev: Snapshot, cur: Snapshot) -> bool:
    """The engine came out of vLLM's sleep mode between `prev` and `cur`."""
    return bool(prev.sleep_level) and cur.sleep_level == 0


def is_reset(prev: Snapshot, cur: Snapshot) -> bool:
    """Whether `cur` cannot be differenced against `prev` (restart or changed aggregation)."""
    if prev.engines != cur.engines:
        return True
    if (prev.start_time is not None and cur.start_time is not None
            and abs(cur.start_time - prev.start_time) > _START_TIME_TOLERANCE_S):
        return True
    pc, cc = prev.counters, cur.counters
    for key, value in cc.items():
        old = pc.get(key)
        if old is not None and value < old:
            return True
    for reason, value in cur.finished_by_reason.items():
        old = prev.finished_by_reason.get(reason)
        if old is not None and value < old:
            return True
    ph = prev.histograms
    for key, hist in cur.histograms.items():
        old = ph.get(key)
        if old is not None and (old.bounds != hist.bounds or hist.count < old.count
                                or (hist.counts and old.counts and hist.counts[-1] < old.counts[-1])):
            return True
    return False


def _rate(first: Snapshot, last: Snapshot, key: str, dt: float) -> float | None:
    a = first.counters.get(key)
    b = last.counters.get(key)
    if a is None or b is None:
        return None
    return (b - a) / dt


def _counter_delta(first: Snapshot, last: Snapshot, key: str) -> float | None:
    a = first.counters.get(key)
    b = last.counters.get(key)
    return None if a is None or b is None else b - a


def _hist_delta(first: Snapshot, last: Snapshot, key: str, keep: dict) -> Histogram | None:
    b = last.histograms.get(key)
    a = first.histograms.get(key)
    d = None if a is None or b is None else b.delta(a)
    keep[key] = d
    return d


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _deltas(first: Snapshot, last: Snapshot, dt: float, keep: dict | None = None) -> dict:
    """Rates, ratios and quantiles between two snapshots `dt` apart; `keep` receives the
    histogram deltas computed on the way."""
    if keep is None:
        keep = {}
    out: dict = {}
    out["prompt_tokens_per_s"] = _rate(first, last, "prompt_tokens_total", dt)
    out["generation_tokens_per_s"] = _rate(first, last, "generation_tokens_total", dt)
    out["preemptions_per_s"] = _rate(first, last, "num_preemptions_total", dt)
    finished = _counter_delta(first, last, "request_success_total")
    out["requests_per_s"] = finished / dt if finished is not None else None
    length_now = last.finished_by_reason.get("length")
    length_then = first.finished_by_reason.get("length")
    if length_now is not None and length_then is not None:
        out["finished_length_share"] = _ratio(length_now - length_then, finished)
    steps = _hist_delta(first, last, "iteration_tokens", keep)
    if steps is not None:
        out["engine_steps_per_s"] = steps.count / dt if steps.count else (
            steps.counts[-1] / dt if steps.counts else None)
        out["tokens_per_step"] = Quantiles.of(steps)
    hits = _counter_delta(first, last, "prefix_cache_hits_total")
    queries = _counter_delta(first, last, "prefix_cache_queries_total")
    out["prefix_cache_hit_ratio"] = _ratio(hits, queries)
    if out["prefix_cache_hit_ratio"] is None and queries is None:
        rate = last.gauges.get("prefix_cache_hit_rate")  # V0 gauge, -1 when disabled
        if rate is not None and rate >= 0:
            out["prefix_cache_hit_ratio"] = rate
    accepted = _counter_delta(first, last, "spec_decode_num_accepted_tokens_total")
    drafted = _counter_delta(first, last, "spec_decode_num_draft_tokens_total")
    drafts = _counter_delta(first, last, "spec_decode_num_drafts_total")
    out["spec_decode_acceptance_rate"] = _ratio(accepted, drafted)
    mean_accepted = _ratio(accepted, drafts)
    out["spec_decode_mean_acceptance_length"] = None if mean_accepted is None else 1.0 + mean_accepted
    out["spec_decode_draft_length"] = _ratio(drafted, drafts)
    if drafts and drafts > 0 and len(first.spec_accepted_per_pos) == len(last.spec_accepted_per_pos):
        out["spec_decode_acceptance_per_pos"] = tuple(
            (b - a) / drafts for a, b in zip(first.spec_accepted_per_pos, last.spec_accepted_per_pos))
    maxtok = _hist_delta(first, last, "max_tokens_param", keep)
    if maxtok is not None:
        out["max_tokens_top"] = maxtok.top_populated()
    for field, key in (("ttft", "ttft_seconds"), ("itl", "itl_seconds"),
                       ("queue_time", "queue_time_seconds"), ("e2e", "e2e_seconds"),
                       ("prompt_len", "prompt_tokens"), ("generation_len", "generation_tokens")):
        out[field] = Quantiles.of(_hist_delta(first, last, key, keep))
    if "tpot_seconds" in last.histograms:
        out["tpot"] = Quantiles.of(_hist_delta(first, last, "tpot_seconds", keep))
        out["tpot_source"] = "request_tpot"
    elif "itl_seconds" in last.histograms:
        out["tpot"] = out["itl"]
        out["tpot_source"] = "itl"
    return out
