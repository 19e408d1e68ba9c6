"""Windows to and from JSON, for the state file.

Why a thinned copy: rates and histogram quantiles need only the oldest and newest snapshot of a
window, gauge means and maxima a sample of the ones between. Saving every snapshot of every
window of a large fleet each evaluation would write megabytes; `MAX_SAVED` evenly spaced
snapshots (always the first and the last, complete; the others with their gauges only) keep
rates and quantiles exact and gauge statistics close. A window
is rebuilt by observing the saved snapshots in order, through the Window's public API only.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from exporter.parse.snapshot import Histogram, Snapshot
from exporter.window.window import TRACKED_GAUGES, Window

MAX_SAVED = 32


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("+Inf" if v > 0 else ("-Inf" if v < 0 else "NaN"))


def _unnum(v: Any) -> float:
    return float(v) if not isinstance(v, str) else float(v.replace("Inf", "inf"))


def snapshot_to_dict(s: Snapshot) -> dict[str, Any]:
    return {
        "target": s.target, "model_name": s.model_name, "timestamp": s.timestamp,
        "engine_era": s.engine_era, "engines": s.engines,
        "gauges": {k: _num(v) for k, v in s.gauges.items()},
        "counters": {k: _num(v) for k, v in s.counters.items()},
        "finished_by_reason": dict(s.finished_by_reason),
        "histograms": {k: [[_num(b) for b in h.bounds], list(h.counts), h.sum, h.count]
                       for k, h in s.histograms.items()},
        "cache_config": dict(s.cache_config),
        "spec_accepted_per_pos": list(s.spec_accepted_per_pos),
        "start_time": s.start_time, "families": sorted(s.families),
        "version_guess": getattr(s, "version_guess", None),
        "sleep_level": s.sleep_level,
    }


def snapshot_from_dict(d: Mapping[str, Any]) -> Snapshot:
    hists = {k: Histogram(tuple(_unnum(b) for b in v[0]), tuple(float(c) for c in v[1]), float(v[2]), float(v[3]))
             for k, v in (d.get("histograms") or {}).items()}
    kwargs: dict[str, Any] = dict(
        target=str(d["target"]), model_name=str(d["model_name"]), timestamp=float(d["timestamp"]),
        engine_era=str(d.get("engine_era") or "v1"), engines=int(d.get("engines") or 1),
        gauges={k: _unnum(v) for k, v in (d.get("gauges") or {}).items()},
        counters={k: _unnum(v) for k, v in (d.get("counters") or {}).items()},
        finished_by_reason={k: float(v) for k, v in (d.get("finished_by_reason") or {}).items()},
        histograms=hists, cache_config={str(k): str(v) for k, v in (d.get("cache_config") or {}).items()},
        spec_accepted_per_pos=tuple(float(x) for x in d.get("spec_accepted_per_pos") or ()),
        start_time=d.get("start_time"), families=frozenset(d.get("families") or ()),
        sleep_level=int(d["sleep_level"]) if d.get("sleep_level") is not None else None,
    )
    if "version_guess" in Snapshot.__dataclass_fields__ and d.get("version_guess") is not None:
        kwargs["version_guess"] = d["version_guess"]
    return Snapshot(**kwargs)


def thin(snaps: list[Snapshot], n: int = MAX_SAVED) -> list[Snapshot]:
    """At most about `n` snapshots: evenly spaced, plus the one holding each gauge's maximum (so
    the window's maxima survive exactly)."""
    if len(snaps) <= n:
        return list(snaps)
    step = (len(snaps) - 1) / (n - 1)
    idx = {round(i * step) for i in range(n)}
    for key in TRACKED_GAUGES:
        vals = [(s.gauges.get(key), i) for i, s in enumerate(snaps) if s.gauges.get(key) is not None]
        if vals:
            idx.add(max(vals)[1])
    return [snaps[i] for i in sorted(idx)]


def _light(s: Snapshot) -> dict[str, Any]:
    """A snapshot between the first and the last: only what gauge statistics need."""
    return {"target": s.target, "model_name": s.model_name, "timestamp": s.timestamp,
            "engine_era": s.engine_era, "engines": s.engines, "start_time": s.start_time,
            "gauges": {k: _num(v) for k, v in s.gauges.items()}}


def window_to_dict(w: Window) -> dict[str, Any]:
    snaps = thin(w.snapshots())
    out = [snapshot_to_dict(s) if i in (0, len(snaps) - 1) else _light(s) for i, s in enumerate(snaps)]
    return {"duration": w.duration, "max_samples": w.max_samples, "resets": w.resets, "snapshots": out}


def window_from_dict(d: Mapping[str, Any], duration: float | None = None) -> Window:
    """Rebuild a window; `duration` (the configured one) wins over the saved one."""
    w = Window(float(duration or d["duration"]), int(d.get("max_samples") or 256))
    for sd in d.get("snapshots") or ():
        w.observe(snapshot_from_dict(sd))
    w.resets = int(d.get("resets") or 0)
    return w
