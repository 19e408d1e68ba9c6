"""From parsed `vllm:` families to one era-independent `Snapshot` per served model.

Why one place: vLLM renamed, deprecated, hid and re-labelled its metrics across 0.5 -> 0.33 and
between its V0 and V1 engines (`exporter.parse.eras` lists them). Everything downstream reads
canonical keys only, so a mixed fleet is compared like with like:

* several names for one signal (`kv_cache_usage_perc` / `gpu_cache_usage_perc`): the newest
  present wins, the others are ignored - never added together;
* data-parallel engines (`engine` label): counters, running and waiting are summed, KV usage is
  the max, histograms are summed bucket by bucket when the engines' bucket layouts agree;
* `_created` series only give `start_time` (the earliest among canonical series), a reset
  signal for windows;
* `cache_config_info` has no `model_name`: its labels go to every model of the target;
* bucket bounds come from the scrape (`--custom-histogram-buckets`, old caps, CUDA-graph sizes);
* the production-stack router and endpoints without `vllm:` metrics are refused with a reason.
"""
from __future__ import annotations

import math
from typing import Iterable

from exporter.errors import ParseError
from exporter.parse import eras
from exporter.parse.exposition import Family, Reader, decode_payload, picker
from exporter.parse.snapshot import COUNTERS, GAUGES, HISTOGRAMS, Histogram, Snapshot

__all__ = ["NotAnEngineError", "NoVllmMetricsError", "canonicalise", "parse_vllm", "READER"]


class NotAnEngineError(ParseError):
    """The endpoint answers with metrics, but they are not a vLLM engine's."""

    reason = "router"


class NoVllmMetricsError(NotAnEngineError):
    """No `vllm:` metric at all: stats disabled, or not a vLLM server."""

    reason = "not_vllm"


# sample name -> (MetricName, part); part: g(auge) c(ounter) b(ucket) s(um) n (count) t (created)
_PARTS: dict[str, tuple[eras.MetricName, str]] = {}
for _m in eras.V0_NAMES + eras.V1_NAMES:
    if _m.kind == "gauge":
        _PARTS[_m.exposed] = (_m, "g")
    elif _m.kind == "counter":
        _PARTS[_m.exposed] = (_m, "c")
        _PARTS[_m.exposed[:-len("_total")] + "_created"] = (_m, "t")
    else:
        for _suffix, _part in (("_bucket", "b"), ("_sum", "s"), ("_count", "n"), ("_created", "t")):
            _PARTS[_m.exposed + _suffix] = (_m, _part)
# canonical key -> exposed names, preferred first. A name's rank is its highest in any era:
# `gpu_cache_usage_perc` is V0's only name (rank 0) but V1's deprecated one (rank 1).
_RANK: dict[tuple[str, str], int] = {}
for _m in eras.V0_NAMES + eras.V1_NAMES:
    if _m.key:
        _RANK[(_m.key, _m.exposed)] = max(_RANK.get((_m.key, _m.exposed), 0), _m.rank)
_KEY_NAMES: dict[str, tuple[str, ...]] = {}
for (_key, _exposed), _rank in sorted(_RANK.items(), key=lambda kv: kv[1]):
    _KEY_NAMES[_key] = _KEY_NAMES.get(_key, ()) + (_exposed,)
_MAX_GAUGES = frozenset(("kv_cache_usage", "prefix_cache_hit_rate"))
_CACHE_CONFIG = "vllm:cache_config_info"
_RUNNING = "vllm:num_requests_running"
_SUCCESS = "vllm:request_success_total"
_SLEEP = "vllm:engine_sleep_state"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# families whose samples are also kept apart by one label's value (family -> that label)
_SPLIT_BY = {_SUCCESS: "finished_reason", _PER_POS: "position", _SLEEP: "sleep_state",
             _WAITING_BY_REASON: "reason"}

# Families nothing canonical is read from: the reader returns them without samples (they still
# count in `Snapshot.families` and the version guess). `_created` only of canonical metrics.
_NAMES_ONLY: set[str] = set()
# family name as a HELP/TYPE line or prometheus_client gives it -> exposed name
_FAMILY_EXPOSED: dict[str, str] = {}
for _m in eras.V0_NAMES + eras.V1_NAMES:
    _FAMILY_EXPOSED[_m.exposed] = _m.exposed
    _FAMILY_EXPOSED[_m.exposed.removesuffix("_total")] = _m.exposed
    if _m.key is None and _m.exposed != "vllm:cache_config_info":
        base = _m.exposed.removesuffix("_total") if _m.kind == "counter" else _m.exposed
        _NAMES_ONLY.update((_m.exposed, base, base + "_created"))
for _m in eras.V0_NAMES + eras.V1_NAMES:  # a name canonical in either era is read in full
    if _m.key is not None:
        _NAMES_ONLY.discard(_m.exposed)
        _NAMES_ONLY.discard(_m.exposed.removesuffix("_total"))
_NAMES_ONLY.difference_update(_SPLIT_BY)   # read by label (the sleep level, waiting by reason) too

READER = Reader(("vllm:", "ray_vllm"), names_only=_NAMES_ONLY)

# Snapshots of one target repeat the same family set and cache_config every scrape: share one
# (read-only) object instead of holding a copy per snapshot in every window.
_FAMILY_SETS: dict = {}
_CONFIGS: dict = {}


def _shared(cache: dict, key, value):
    hit = cache.get(key)
    if hit is None:
        if len(cache) > 4096:
            cache.clear()
        cache[key] = hit = value
    return hit


class _Acc:
    """Per-model accumulation of where a scrape's values go: lists of indices into the flat
    list of sample values (families in order, samples in order)."""

    __slots__ = ("gauges", "counters", "split", "hists", "engines", "created")

    def __init__(self) -> None:
        self.gauges: dict[str, list[int]] = {}
        self.counters: dict[str, list[int]] = {}
        # a _SPLIT_BY family -> its label's value -> indices (every engine)
        self.split: dict[str, dict[str, list[int]]] = {}
        # exposed -> engine -> [buckets {le: [indices]}, [sum indices], [count indices]]
        self.hists: dict[str, dict[str | None, list]] = {}
        self.engines: set[str] = set()
        self.created: list[int] = []


def parse_vllm(payload: str | bytes | bytearray | memoryview, *, target: str, timestamp: float,
               reader: Reader | None = None) -> list[Snapshot]:
    """A vLLM `/metrics` body -> one Snapshot per served model. Raises ParseError (or
    NotAnEngineError) with the reason when the body is not a vLLM engine's exposition.

    A body shaped like one read before (the reader's shape cache: same lines, new values) skips
    the parse and the canonical mapping both: the mapping of that shape (`_Plan`) is kept with
    the shape and run on the new values."""
    text = decode_payload(payload)
    start = text[:512].lstrip()
    if start.startswith("<"):
        raise ParseError("not Prometheus metrics: looks like an HTML page (an error page or a proxy?)")
    if start.startswith(("{", "[")):
        raise ParseError("not Prometheus metrics: looks like JSON (wrong path or an API error?)")
    families, shape, values = (reader or READER).parse_shaped(text, key=target)
    if shape is None:
        return canonicalise(families, target=target, timestamp=timestamp)
    plan = shape.memo
    if plan is None:
        plan = shape.memo = _Plan.of(families if families is not None else shape.families(values))
    return plan.run(values, target, timestamp)


def canonicalise(families: Iterable[Family], *, target: str, timestamp: float) -> list[Snapshot]:
    """Parsed families (any may be present; non-`vllm:` ones are ignored) -> Snapshots."""
    families = list(families)
    return _Plan.of(families).run([s[2] for f in families for s in f.samples], target, timestamp)


def _total(values: list, idx: tuple[int, ...]):
    """values[i] summed in order, as `+=` from the first one does."""
    t = values[idx[0]]
    for i in idx[1:]:
        t += values[i]
    return t


def _from_zero(values: list, idx: tuple[int, ...]):
    """`(t or 0.0) + v` in order: the reasons', positions' and histogram sums' accumulation."""
    t = None
    for i in idx:
        t = (t or 0.0) + values[i]
    return t


class _ModelPlan:
    """Where one served model's canonical values come from."""

    __slots__ = ("model", "engines", "gauges", "counters", "reasons", "per_pos", "hists", "created", "notes",
                 "sleep", "waiting_split")

    def __init__(self, model: str, acc: _Acc, hists: list, notes: tuple[str, ...]) -> None:
        self.model = model
        self.engines = max(1, len(acc.engines))
        self.gauges: list[tuple[str, bool, tuple[int, ...]]] = []     # (key, max?, indices)
        for key in GAUGES:
            for exposed in _KEY_NAMES.get(key, ()):
                idx = acc.gauges.get(exposed)
                if idx:
                    self.gauges.append((key, key in _MAX_GAUGES, tuple(idx)))
                    break
        self.counters: list[tuple[str, tuple[int, ...]]] = []
        for key in COUNTERS:
            for exposed in _KEY_NAMES.get(key, ()):
                if exposed in acc.counters:
                    self.counters.append((key, tuple(acc.counters[exposed])))
                    break
        split = acc.split
        self.reasons = tuple((r, tuple(idx)) for r, idx in split.get(_SUCCESS, {}).items())
        self.sleep = tuple((state, tuple(idx)) for state, idx in split.get(_SLEEP, {}).items())
        # vLLM 0.20+: waiting requests by reason; `capacity` waits for a batch slot or KV blocks,
        # every other reason (`deferred`: LoRA budget, KV transfer, blocked) on something else
        reasons = split.get(_WAITING_BY_REASON, {})
        self.waiting_split = (
            (tuple(reasons.get("capacity", ())),
             tuple(i for r, idx in reasons.items() if r != "capacity" for i in idx))
            if "capacity" in reasons else None)
        per_pos = split.get(_PER_POS, {})
        try:
            order = sorted(per_pos, key=int)
        except ValueError:
            order = sorted(per_pos)
        self.per_pos = tuple(tuple(per_pos[p]) for p in order)
        self.hists = hists
        self.created = tuple(acc.created)
        self.notes = notes


class _Plan:
    """The canonical mapping of one exposition structure (families, names, labels): everything
    `canonicalise` decides without looking at a value, so that a body of the same shape only
    has its values routed (`run`). Raises ParseError/NotAnEngineError as canonicalise does."""

    __slots__ = ("models", "era", "cache_config", "family_set", "version")

    @classmethod
    def of(cls, families: Iterable[Family]) -> "_Plan":
        parts = _PARTS
        models: dict[str, _Acc] = {}
        names: set[str] = set()
        cache_rows: list[dict[str, str]] = []
        running_help = None
        has_engine_label = False
        complete = True
        ray = False
        k = 0                                 # index of the family's first sample in the values
        for fam in families:
            fname = fam.name
            samples = fam.samples
            first, k = k, k + len(samples)
            if not fname.startswith("vllm:"):
                ray = ray or fname.startswith("ray_vllm")
                continue
            if fname in eras.ROUTER_ONLY or (samples and eras.ROUTER_LABEL in samples[0][1]):
                raise NotAnEngineError(
                    "not a vLLM engine: looks like the production-stack router (it re-exports "
                    f"vllm: metrics with a `server` label and router-only ones such as {fname}); "
                    "scrape the engines behind it instead")
            if fname == _RUNNING:
                running_help = fam.documentation
            if not samples:
                exposed = _FAMILY_EXPOSED.get(fname)
                if exposed is not None:
                    names.add(exposed)
                continue
            hit = parts.get(samples[0][0])
            if hit is None or hit[0].exposed == _CACHE_CONFIG or (
                    hit[0].key is None and "model_name" not in samples[0][1]):
                # unknown, target-level (cache_config_info, lora_requests_info) or _created of those
                for name, labels, _value, _ts in samples:
                    if name.endswith("_created"):
                        continue
                    if name == _CACHE_CONFIG:
                        cache_rows.append(labels)
                    names.add(fname if fam.type in ("histogram", "summary") else name)
                    if "engine" in labels:
                        has_engine_label = True
                continue
            last_model = None
            acc: _Acc = None  # type: ignore[assignment]  # set on the first sample
            slot_key = None
            slot: list = [None, None, None]
            for j, (name, labels, _value, _ts) in enumerate(samples, first):
                hit = parts.get(name)
                if hit is None:
                    continue  # an unknown sample inside a known family: ignore
                m, part = hit
                model = labels.get("model_name", "")
                if model != last_model:
                    acc = models.get(model)
                    if acc is None:
                        acc = models[model] = _Acc()
                    last_model = model
                    slot_key = None
                engine = labels.get("engine")
                if engine is not None:
                    acc.engines.add(engine)
                    has_engine_label = True
                if part == "b" or part == "s" or part == "n":
                    exposed = m.exposed
                    if slot_key is None or slot_key[0] is not exposed or slot_key[1] != engine:
                        per_engine = acc.hists.get(exposed)
                        if per_engine is None:
                            per_engine = acc.hists[exposed] = {}
                            names.add(exposed)
                        slot = per_engine.get(engine)
                        if slot is None:
                            slot = per_engine[engine] = [{}, [], []]
                        slot_key = (exposed, engine)
                    if part == "b":
                        le = labels.get("le")
                        if le is None:
                            raise ParseError(f"{name}: bucket sample without an `le` label")
                        slot[0].setdefault(le, []).append(j)
                    else:
                        slot[1 if part == "s" else 2].append(j)
                    continue
                if part == "t":
                    acc.created.append(j)
                    continue
                exposed = m.exposed
                routes = acc.counters if part == "c" else acc.gauges
                if exposed in routes:
                    routes[exposed].append(j)
                else:
                    routes[exposed] = [j]
                    names.add(exposed)
                by = _SPLIT_BY.get(exposed)
                if by is not None:
                    acc.split.setdefault(exposed, {}).setdefault(labels.get(by, ""), []).append(j)

        if not names and not models:
            if ray:
                raise NoVllmMetricsError(
                    "no vllm: metrics, only Ray-exported ray_vllm* copies: scrape the vLLM server's "
                    "own /metrics (Ray-sanitised names are not supported)")
            raise NoVllmMetricsError("no vllm: metrics (is --disable-log-stats set, or is this not vLLM?)")

        plan = cls()
        plan.era = _detect_era(names, running_help, has_engine_label)
        cache_config, notes = _cache_config(cache_rows)
        if _CACHE_CONFIG not in names:
            complete = False
        # drop unlabeled per-model samples when real models exist (a foreign or edited exposition)
        if "" in models and len(models) > 1:
            del models[""]
            notes.append("samples without model_name ignored")
        if not models:
            models[""] = _Acc()
        built = {model: _plan_histograms(acc) for model, acc in models.items()}
        for hists, _ in built.values():
            if any(h[1] and not math.isinf(h[1][-1]) for h in hists):
                complete = False
        version = eras.guess_version(frozenset(names), plan.era,
                                     frozenset(cache_config) if cache_rows else None, complete)
        plan.version = str(version) or None
        plan.family_set = _shared(_FAMILY_SETS, frozenset(names), frozenset(names))
        plan.cache_config = _shared(_CONFIGS, tuple(cache_config.items()), cache_config)
        plan.models = tuple(_ModelPlan(model, acc, built[model][0], tuple(notes + built[model][1]))
                            for model, acc in models.items())
        return plan

    def run(self, values: list, target: str, timestamp: float) -> list[Snapshot]:
        snaps: list[Snapshot] = []
        for mp in self.models:
            gauges: dict[str, float] = {}
            for key, use_max, idx in mp.gauges:
                if len(idx) == 1:
                    gauges[key] = values[idx[0]]
                else:
                    vals = [values[i] for i in idx]
                    gauges[key] = max(vals) if use_max else sum(vals)
            counters = {key: values[idx[0]] if len(idx) == 1 else _total(values, idx)
                        for key, idx in mp.counters}
            if mp.waiting_split is not None:
                capacity, other = mp.waiting_split
                gauges["num_requests_waiting_capacity"] = sum(values[i] for i in capacity)
                gauges["num_requests_waiting_deferred"] = sum(values[i] for i in other)
            created = None
            for i in mp.created:
                v = values[i]
                if created is None or v < created:
                    created = v
            histograms: dict[str, Histogram] = {}
            for key, bounds, get_counts, engines, has_inf in mp.hists:
                if get_counts is not None:           # one engine: the counts in bound order
                    counts = get_counts(values) if bounds else ()
                else:
                    per_engine = [tuple([_total(values, le) for le in e[0]]) for e in engines]
                    counts = tuple(map(sum, zip(*per_engine))) if bounds else ()
                total_sum = sum(_from_zero(values, e[1]) or 0.0 for e in engines)
                counted = [_from_zero(values, e[2]) for e in engines if e[2]]
                count = sum(counted) if counted else (counts[-1] if has_inf else 0.0)
                histograms[key] = Histogram(bounds, counts, total_sum, count)
            snaps.append(Snapshot(
                target=target, model_name=mp.model, timestamp=timestamp, engine_era=self.era,
                engines=mp.engines, gauges=gauges, counters=counters,
                finished_by_reason={r: _from_zero(values, idx) for r, idx in mp.reasons},
                histograms=histograms, cache_config=self.cache_config,
                spec_accepted_per_pos=tuple(_from_zero(values, idx) for idx in mp.per_pos),
                start_time=created, families=self.family_set, version_guess=self.version,
                notes=mp.notes, sleep_level=_sleep_level(values, mp.sleep)))
        return snaps


def _sleep_level(values: list, states: tuple) -> int | None:
    """vLLM's `record_sleep_state` (v1/metrics/loggers.py): `awake` 1 while awake, else 0 with
    `weights_offloaded` 1 (level 1) or `discard_all` 1 (level 2). All engines of a DP server
    sleep together; the deepest level any engine shows is the server's."""
    if not states:
        return None
    level = 0
    for state, idx in states:
        on = any(values[i] >= 0.5 for i in idx)
        if state == "discard_all" and on:
            level = max(level, 2)
        elif state == "weights_offloaded" and on:
            level = max(level, 1)
        elif state == "awake" and any(values[i] < 0.5 for i in idx):
            level = max(level, 1)       # asleep at a level the exposition does not name
    return level


def _detect_era(names: set[str], running_help: str | None, has_engine_label: bool) -> str:
    """V1 has the `engine` label (0.8.3+) and its own HELP for running; V0 has swapped/cpu
    metrics and "currently running on GPU" (vllm-metrics.md §3.1)."""
    if has_engine_label:
        return eras.V1
    if running_help is not None:
        if running_help.startswith(eras.V1_RUNNING_HELP):
            return eras.V1
        if running_help.startswith(eras.V0_RUNNING_HELP):
            return eras.V0
    if names & eras.V0_ONLY:
        return eras.V0
    return eras.V1


def _cache_config(rows: list[dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Labels of `cache_config_info` without `engine`; with several engines, engine 0's (the
    smallest index), noting when engines disagree."""
    notes: list[str] = []
    if not rows:
        return {}, notes

    def engine_key(row: dict[str, str]):
        e = row.get("engine", "")
        return (0, int(e), "") if e.isdigit() else (1, 0, e)

    rows = sorted(rows, key=engine_key)
    chosen = {k: v for k, v in rows[0].items() if k != "engine"}
    for row in rows[1:]:
        other = {k: v for k, v in row.items() if k != "engine"}
        if other != chosen:
            diff = sorted(k for k in set(chosen) | set(other) if chosen.get(k) != other.get(k))
            notes.append(f"cache_config_info differs across engines ({', '.join(diff)}); "
                         f"using engine {rows[0].get('engine', '?')}")
            break
    return chosen, notes


_LAYOUTS: dict[tuple[str, ...], tuple[tuple[float, ...], tuple[str, ...]]] = {}


def _layout(les: tuple[str, ...]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """`le` texts in exposition order -> (sorted bounds, le texts in that order); cached."""
    hit = _LAYOUTS.get(les)
    if hit is None:
        try:
            pairs = sorted((float(le), le) for le in les)
        except ValueError:
            bad = next(le for le in les if not _is_float(le))
            raise ParseError(f"histogram bucket with a non-numeric le={bad!r}") from None
        hit = (tuple(b for b, _ in pairs), tuple(le for _, le in pairs))
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        _LAYOUTS[les] = hit
    return hit


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _plan_histograms(acc: _Acc) -> tuple[list[tuple], list[str]]:
    """Per canonical histogram key: (key, bounds, counts getter for one engine or None,
    per-engine ([index lists per bound], sum indices, count indices), last bound is +Inf)."""
    own: list[str] = []
    built: dict[str, tuple] = {}
    for exposed, per_engine in acc.hists.items():
        layouts = set()
        engines = []
        for slot in per_engine.values():
            buckets = slot[0]
            bounds, order = _layout(tuple(buckets))
            layouts.add(bounds)
            engines.append((bounds, tuple(tuple(buckets[le]) for le in order), tuple(slot[1]), tuple(slot[2])))
        if len(layouts) > 1:
            own.append(f"{exposed}: bucket layouts differ across engines; not summed")
            continue
        bounds = engines[0][0]
        get_counts = None
        if len(engines) == 1:
            single = engines[0][1]
            if all(len(idx) == 1 for idx in single):
                get_counts = picker([idx[0] for idx in single])
            else:
                get_counts = lambda values, single=single: tuple([_total(values, idx) for idx in single])
        has_inf = bool(bounds) and math.isinf(bounds[-1])
        if bounds and not has_inf:
            own.append(f"{exposed}: no +Inf bucket (truncated exposition?)")
        built[exposed] = (bounds, get_counts, tuple((e[1], e[2], e[3]) for e in engines), has_inf)
    result: list[tuple] = []
    for key in HISTOGRAMS:
        for exposed in _KEY_NAMES.get(key, ()):
            if exposed in built:
                result.append((key,) + built[exposed])
                break
    return result, own
