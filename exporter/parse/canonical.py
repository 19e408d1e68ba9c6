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
from exporter.parse.exposition import Family, Reader, decode_payload
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
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

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
    """Per-model accumulation over one scrape."""

    __slots__ = ("gauges", "counters", "reasons", "per_pos", "hists", "engines", "created")

    def __init__(self) -> None:
        self.gauges: dict[str, list[float]] = {}
        self.counters: dict[str, float] = {}
        self.reasons: dict[str, float] = {}
        self.per_pos: dict[str, float] = {}
        # exposed -> engine -> [buckets {le: count}, sum, count]
        self.hists: dict[str, dict[str, list]] = {}
        self.engines: set[str] = set()
        self.created: float | None = None


def parse_vllm(payload: str | bytes | bytearray | memoryview, *, target: str, timestamp: float,
               reader: Reader | None = None) -> list[Snapshot]:
    """A vLLM `/metrics` body -> one Snapshot per served model. Raises ParseError (or
    NotAnEngineError) with the reason when the body is not a vLLM engine's exposition."""
    text = decode_payload(payload)
    start = text[:512].lstrip()
    if start.startswith("<"):
        raise ParseError("not Prometheus metrics: looks like an HTML page (an error page or a proxy?)")
    if start.startswith(("{", "[")):
        raise ParseError("not Prometheus metrics: looks like JSON (wrong path or an API error?)")
    families = (reader or READER).parse(text)
    return canonicalise(families, target=target, timestamp=timestamp)


def canonicalise(families: Iterable[Family], *, target: str, timestamp: float) -> list[Snapshot]:
    """Parsed families (any may be present; non-`vllm:` ones are ignored) -> Snapshots."""
    parts = _PARTS
    models: dict[str, _Acc] = {}
    names: set[str] = set()
    cache_rows: list[dict[str, str]] = []
    running_help = None
    has_engine_label = False
    complete = True
    ray = False
    for fam in families:
        fname = fam.name
        if not fname.startswith("vllm:"):
            ray = ray or fname.startswith("ray_vllm")
            continue
        if fname in eras.ROUTER_ONLY or (fam.samples and eras.ROUTER_LABEL in fam.samples[0][1]):
            raise NotAnEngineError(
                "not a vLLM engine: looks like the production-stack router (it re-exports "
                f"vllm: metrics with a `server` label and router-only ones such as {fname}); "
                "scrape the engines behind it instead")
        if fname == _RUNNING:
            running_help = fam.documentation
        samples = fam.samples
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
        for name, labels, value, _ts in samples:
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
                if engine not in acc.engines:
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
                        slot = per_engine[engine] = [{}, None, None]
                    slot_key = (exposed, engine)
                if part == "b":
                    le = labels.get("le")
                    if le is None:
                        raise ParseError(f"{name}: bucket sample without an `le` label")
                    buckets = slot[0]
                    buckets[le] = buckets[le] + value if le in buckets else value
                elif part == "s":
                    slot[1] = (slot[1] or 0.0) + value
                else:
                    slot[2] = (slot[2] or 0.0) + value
                continue
            if part == "t":
                if acc.created is None or value < acc.created:
                    acc.created = value
                continue
            exposed = m.exposed
            if part == "c":
                counters = acc.counters
                if exposed in counters:
                    counters[exposed] += value
                else:
                    counters[exposed] = value
                    names.add(exposed)
                if exposed == _SUCCESS:
                    reason = labels.get("finished_reason", "")
                    acc.reasons[reason] = acc.reasons.get(reason, 0.0) + value
                elif exposed == _PER_POS:
                    pos = labels.get("position", "")
                    acc.per_pos[pos] = acc.per_pos.get(pos, 0.0) + value
            else:
                gauges = acc.gauges
                if exposed in gauges:
                    gauges[exposed].append(value)
                else:
                    gauges[exposed] = [value]
                    names.add(exposed)

    if not names and not models:
        if ray:
            raise NoVllmMetricsError(
                "no vllm: metrics, only Ray-exported ray_vllm* copies: scrape the vLLM server's "
                "own /metrics (Ray-sanitised names are not supported)")
        raise NoVllmMetricsError("no vllm: metrics (is --disable-log-stats set, or is this not vLLM?)")

    era = _detect_era(names, running_help, has_engine_label)
    cache_config, notes = _cache_config(cache_rows)
    if _CACHE_CONFIG not in names:
        complete = False
    # drop unlabeled per-model samples when real models exist (a foreign or edited exposition)
    if "" in models and len(models) > 1:
        del models[""]
        notes.append("samples without model_name ignored")
    if not models:
        models[""] = _Acc()

    snaps: list[Snapshot] = []
    built = {model: _build_histograms(acc) for model, acc in models.items()}
    for hists, _ in built.values():
        if any(h.bounds and not math.isinf(h.bounds[-1]) for h in hists.values()):
            complete = False
    version = eras.guess_version(frozenset(names), era, frozenset(cache_config) if cache_rows else None,
                                 complete)
    version_str = str(version) or None
    family_set = _shared(_FAMILY_SETS, frozenset(names), frozenset(names))
    cache_config = _shared(_CONFIGS, tuple(cache_config.items()), cache_config)
    for model, acc in models.items():
        hists, hist_notes = built[model]
        gauges: dict[str, float] = {}
        for key in GAUGES:
            for exposed in _KEY_NAMES.get(key, ()):
                vals = acc.gauges.get(exposed)
                if vals:
                    gauges[key] = max(vals) if key in _MAX_GAUGES else sum(vals)
                    break
        counters: dict[str, float] = {}
        for key in COUNTERS:
            for exposed in _KEY_NAMES.get(key, ()):
                if exposed in acc.counters:
                    counters[key] = acc.counters[exposed]
                    break
        per_pos = ()
        if acc.per_pos:
            try:
                order = sorted(acc.per_pos, key=int)
            except ValueError:
                order = sorted(acc.per_pos)
            per_pos = tuple(acc.per_pos[p] for p in order)
        snaps.append(Snapshot(
            target=target, model_name=model, timestamp=timestamp, engine_era=era,
            engines=max(1, len(acc.engines)), gauges=gauges, counters=counters,
            finished_by_reason=dict(acc.reasons), histograms=hists, cache_config=cache_config,
            spec_accepted_per_pos=per_pos, start_time=acc.created, families=family_set,
            version_guess=version_str, notes=tuple(notes + hist_notes)))
    return snaps


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


def _build_histograms(acc: _Acc) -> tuple[dict[str, Histogram], list[str]]:
    own: list[str] = []
    built: dict[str, Histogram] = {}
    for exposed, per_engine in acc.hists.items():
        layouts = set()
        engines: list[tuple[tuple[float, ...], tuple[float, ...], float | None, float | None]] = []
        for slot in per_engine.values():
            buckets = slot[0]
            bounds, order = _layout(tuple(buckets))
            layouts.add(bounds)
            engines.append((bounds, tuple([buckets[le] for le in order]), slot[1], slot[2]))
        if len(layouts) > 1:
            own.append(f"{exposed}: bucket layouts differ across engines; not summed")
            continue
        bounds = engines[0][0]
        if len(engines) == 1:
            counts = engines[0][1]
        else:
            counts = tuple(map(sum, zip(*(e[1] for e in engines)))) if bounds else ()
        total_sum = sum(e[2] or 0.0 for e in engines)
        counted = [e[3] for e in engines if e[3] is not None]
        count = sum(counted) if counted else (counts[-1] if bounds and math.isinf(bounds[-1]) else 0.0)
        if bounds and not math.isinf(bounds[-1]):
            own.append(f"{exposed}: no +Inf bucket (truncated exposition?)")
        built[exposed] = Histogram(bounds, counts, total_sum, count)
    result: dict[str, Histogram] = {}
    for key in HISTOGRAMS:
        for exposed in _KEY_NAMES.get(key, ()):
            if exposed in built:
                result[key] = built[exposed]
                break
    return result, own
