"""Stable findings: hysteresis, minimum durations, clearing and config-change events.

Why: the rules see one window at a time, and a window on the edge of a threshold would raise and
clear a finding every evaluation. A `Tracker` (one per target and served model, kept by the
drift engine across calls and persisted across restarts) turns raw rule output into the findings
the daemon exports:

- a finding at `warning` or above becomes active only after `raise_after` consecutive
  evaluations at that level (a minimum duration); an upgrade to `critical` likewise;
- an active finding holds while its raw score stays above `HOLD` x its warning threshold (the
  hysteresis band) and clears after `clear_after` consecutive evaluations below it, or when its
  rule no longer fires at all (its cause is gone);
- `info` findings pass through unchanged (they never alarm);
- while data are insufficient (too short a window, or a counter reset restarted it) active
  findings are held as they were, and after a whole window of insufficient data they clear;
- a changed `cache_config_info` (new blocks, utilisation, dtype, caching) is recorded as a config
  change event: the pending and active findings about settings are dropped, since the server
  now runs another configuration.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from exporter.drift.rules import LEVELS
from exporter.report import Finding

HOLD = 0.5
LEVEL = {"info": 1, "warning": 2, "critical": 3}
SEVERITY = {1: "info", 2: "warning", 3: "critical"}
MAX_EVENTS = 20
# findings that stay meaningful across a config change (they are about load, not a setting)
LOAD_FINDINGS = ("kv_pressure", "idle_capacity", "tier_misplacement")


def _key(f: Finding) -> str:
    return f.finding if f.parameter is None or f.parameter == f.finding else f"{f.finding}/{f.parameter}"


@dataclass
class Track:
    """The stable state of one finding key."""

    finding: dict[str, Any] | None = None   # the last exported Finding (JSON form) while active
    active: bool = False
    level: int = 0                 # exported level while active
    pending_level: int = 0         # level waiting for confirmation
    pending: int = 0               # consecutive evaluations at pending_level or above
    below: int = 0                 # consecutive evaluations under the hold band
    since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding, "active": self.active, "level": self.level,
                "pending_level": self.pending_level, "pending": self.pending, "below": self.below,
                "since": self.since}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Track":
        return cls(finding=d.get("finding"), active=bool(d.get("active")), level=int(d.get("level", 0)),
                   pending_level=int(d.get("pending_level", 0)), pending=int(d.get("pending", 0)),
                   below=int(d.get("below", 0)), since=d.get("since"))


@dataclass
class Tracker:
    raise_after: int = 2
    clear_after: int = 2
    tracks: dict[str, Track] = field(default_factory=dict)
    cache_config: dict[str, str] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    insufficient_since: float | None = None

    # ------------------------------------------------------------------ config changes
    def observe_config(self, cache_config: Mapping[str, str], now: float) -> dict[str, Any] | None:
        """Record a change of `cache_config_info`; returns the event (or None)."""
        current = {k: str(v) for k, v in cache_config.items()}
        if not current:
            return None
        before, self.cache_config = self.cache_config, current
        if before is None or before == current:
            return None
        changed = {k: [before.get(k), current.get(k)] for k in sorted(set(before) | set(current))
                   if before.get(k) != current.get(k)}
        event = {"at": now, "kind": "config_change", "changed": changed}
        self.events = (self.events + [event])[-MAX_EVENTS:]
        for key in list(self.tracks):
            if key.split("/")[0] not in LOAD_FINDINGS:
                del self.tracks[key]
        return event

    # ------------------------------------------------------------------ updates
    def update(self, raw: list[Finding], now: float) -> list[Finding]:
        """Fold one evaluation's raw findings into the stable set; returns what to export."""
        self.insufficient_since = None
        out: list[Finding] = []
        seen: set[str] = set()
        for f in raw:
            if f.finding in LEVELS:
                key = _key(f)
                if key in seen:
                    continue
                seen.add(key)
                got = self._step(key, f, now)
                if got is not None:
                    out.append(got)
            else:
                out.append(f)        # unavailable / insufficient_data notes pass through
        for key in list(self.tracks):
            if key not in seen:
                got = self._step(key, None, now)
                if got is not None:
                    out.append(got)
        return out

    def _step(self, key: str, f: Finding | None, now: float, confirmed: bool = False) -> Finding | None:
        tr = self.tracks.get(key)
        raw_level = LEVEL.get(f.severity, 0) if f is not None else 0
        if tr is None:
            if raw_level < 2:
                return f               # info (or nothing): pass through, not tracked
            tr = self.tracks[key] = Track()
        warn = LEVELS[key.split("/")[0]][0]
        if not tr.active:
            if raw_level >= 2:
                if confirmed:
                    tr.pending = max(tr.pending, self.raise_after - 1)
                    tr.pending_level = raw_level if tr.pending == 0 else max(tr.pending_level, raw_level)
                tr.pending += 1
                tr.pending_level = raw_level if tr.pending == 1 else min(tr.pending_level, raw_level)
                if tr.pending >= self.raise_after:
                    tr.active, tr.level, tr.since, tr.below = True, tr.pending_level, now, 0
                    tr.pending = tr.pending_level = 0
                    return self._export(tr, f)
                return replace(f, severity="info") if f is not None else None
            del self.tracks[key]
            return f
        # active
        holding = f is not None and (raw_level >= 2 or f.score >= HOLD * warn)
        if holding:
            tr.below = 0
            if raw_level > tr.level:
                tr.pending = tr.pending + 1 if tr.pending_level == raw_level else 1
                tr.pending_level = raw_level
                if tr.pending >= self.raise_after:
                    tr.level, tr.pending, tr.pending_level = raw_level, 0, 0
            elif raw_level < tr.level and raw_level >= 2:
                tr.pending = tr.pending + 1 if tr.pending_level == raw_level else 1
                tr.pending_level = raw_level
                if tr.pending >= self.clear_after:
                    tr.level, tr.pending, tr.pending_level = raw_level, 0, 0
            else:
                tr.pending = tr.pending_level = 0
            return self._export(tr, f)
        tr.below += 1
        tr.pending = tr.pending_level = 0      # an escalation needs consecutive evaluations too
        if tr.below >= self.clear_after:
            del self.tracks[key]
            return f if f is not None and raw_level == 1 else None
        return self._export(tr, None)

    @staticmethod
    def _export(tr: Track, f: Finding | None) -> Finding:
        if f is not None:
            tr.finding = f.to_json()
        d = dict(tr.finding or {})
        d["severity"] = SEVERITY[tr.level]
        d["since"] = tr.since
        return Finding(**d)

    def partial(self, raw: list[Finding], now: float, scope: tuple[str, ...], window_s: float,
                confirmed: frozenset[str] = frozenset()) -> list[Finding]:
        """A window without rates yet (a new target, a counter reset): the findings in `scope`
        (what one snapshot proves) are stepped as in `update`; the others are held as in `hold`
        (active ones exported unchanged, cleared after a whole window without data).

        `confirmed`: finding keys whose raw level is already a mean over at least `raise_after`
        scrapes (the minimum duration is met inside the window), so they raise at once; clearing
        keeps its hysteresis."""
        if self.insufficient_since is None:
            self.insufficient_since = now
        expired = now - self.insufficient_since >= window_s
        out: list[Finding] = []
        seen: set[str] = set()
        for f in raw:
            if f.finding not in LEVELS or f.finding not in scope:
                continue
            key = _key(f)
            if key in seen:
                continue
            seen.add(key)
            got = self._step(key, f, now, confirmed=key in confirmed)
            if got is not None:
                out.append(got)
        for key in list(self.tracks):
            if key in seen:
                continue
            if key.split("/")[0] in scope:
                got = self._step(key, None, now)
                if got is not None:
                    out.append(got)
            elif expired:
                del self.tracks[key]
            elif self.tracks[key].active:
                out.append(self._export(self.tracks[key], None))
        return out

    def hold(self, now: float, window_s: float) -> list[Finding]:
        """Insufficient data: keep the active findings as they are; after a whole window of
        insufficient data, clear them (nothing supports them any more)."""
        if self.insufficient_since is None:
            self.insufficient_since = now
        if now - self.insufficient_since >= window_s:
            self.tracks.clear()
            return []
        out = []
        for tr in self.tracks.values():
            if tr.active:
                out.append(self._export(tr, None))
        return out

    def active(self) -> list[Finding]:
        return [self._export(tr, None) for tr in self.tracks.values() if tr.active]

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        return {"raise_after": self.raise_after, "clear_after": self.clear_after,
                "tracks": {k: t.to_dict() for k, t in self.tracks.items()},
                "cache_config": self.cache_config, "events": self.events,
                "insufficient_since": self.insufficient_since}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Tracker":
        t = cls(raise_after=int(d.get("raise_after", 2)), clear_after=int(d.get("clear_after", 2)))
        for k, v in (d.get("tracks") or {}).items():
            if k.split("/")[0] in LEVELS:
                tr = Track.from_dict(v)
                if tr.finding is not None or not tr.active:
                    t.tracks[k] = tr
        cc = d.get("cache_config")
        t.cache_config = {str(a): str(b) for a, b in cc.items()} if isinstance(cc, Mapping) else None
        t.events = [e for e in (d.get("events") or []) if isinstance(e, Mapping)][-MAX_EVENTS:]
        t.insufficient_since = d.get("insufficient_since")
        return t
