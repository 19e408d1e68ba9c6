"""`/api/v1/findings` and `/api/v1/targets`: built on request from what the daemon published,
filtered and paginated, with each report's JSON encoded once.

Why lazily: the daemon used to encode every target's report on every publish (4 % of its CPU
at 1,000 targets) although the API is read rarely. A publish now only records immutable
references (`FindingsIndex`, `TargetsIndex`); a request encodes what it returns, and a report's
JSON is kept until the report is replaced by a newer evaluation (`ReportCache`).

Query parameters of `/api/v1/findings` (all optional; repeated or comma-separated values are
alternatives): `target` (URL), `finding` (name), `severity`, `model_name`, `limit` and `offset`
(pagination). The document is `{"generated_at", "targets": [...], "total", "offset",
"next_offset"}`; without parameters it holds every target, as before. `total` counts the
matching entries; `next_offset` is null on the last page.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import parse_qs

from exporter.report import ModelReport

__all__ = ["FindingsIndex", "TargetsIndex", "ReportCache", "QueryError", "parse_query"]

MAX_LIMIT = 10_000


class QueryError(ValueError):
    """A bad query parameter (the endpoint answers 400 with this message)."""


def parse_query(query: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, values in parse_qs(query, keep_blank_values=False).items():
        out[key] = [v for value in values for v in value.split(",") if v]
    return out


class ReportCache:
    """Encoded JSON per report object, kept while the report is the current one."""

    def __init__(self) -> None:
        self._json: dict[int, tuple[ModelReport, bytes]] = {}
        self._lock = threading.Lock()

    def retain(self, reports: Sequence[ModelReport]) -> None:
        """Forget the JSON of reports that are no longer published (called at publish)."""
        with self._lock:
            old = self._json
            self._json = {id(r): old[id(r)] for r in reports if id(r) in old}

    def encode(self, report: ModelReport) -> bytes:
        hit = self._json.get(id(report))
        if hit is not None and hit[0] is report:
            return hit[1]
        data = json.dumps(report.to_json()).encode()
        with self._lock:
            self._json[id(report)] = (report, data)
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    target: str
    report: ModelReport | None          # None: a target without a report (down or pending)
    fallback: Mapping[str, Any] | None  # the JSON object for such a target


class FindingsIndex:
    """One publish's findings: entries in target order, encoded on request."""

    def __init__(self, generated_at: float, entries: Sequence[Entry], cache: ReportCache) -> None:
        self.generated_at = generated_at
        self.entries = tuple(entries)
        self.cache = cache

    def document(self, query: Mapping[str, list[str]] | None = None) -> bytes:
        """The findings document (a page of it, filtered by `query`). Joined from the reports'
        cached JSON per request, not kept: the whole document is a second copy of that cache
        (~4.6 MB at 1,000 targets), and joining it again takes ~1 ms per 1,000 targets."""
        query = query or {}
        targets = set(query.get("target", ()))
        names = set(query.get("finding", ()))
        severities = set(query.get("severity", ()))
        models = set(query.get("model_name", ()))
        offset = _int(query, "offset", 0)
        limit = _int(query, "limit", None)
        if limit is not None and not 0 < limit <= MAX_LIMIT:
            raise QueryError(f"limit must be between 1 and {MAX_LIMIT}")
        unknown = set(query) - {"target", "finding", "severity", "model_name", "offset", "limit"}
        if unknown:
            raise QueryError(f"unknown query parameter {sorted(unknown)[0]!r}")
        matched = [e for e in self.entries if _matches(e, targets, names, severities, models)]
        page = matched[offset:offset + limit] if limit is not None else matched[offset:]
        end = offset + len(page)
        items = [self.cache.encode(e.report) if e.report is not None else json.dumps(e.fallback).encode()
                 for e in page]
        head = json.dumps({"generated_at": self.generated_at, "total": len(matched), "offset": offset,
                           "next_offset": end if end < len(matched) else None}).encode()
        return head[:-1] + b', "targets": [' + b", ".join(items) + b"]}"


def _int(query: Mapping[str, list[str]], key: str, default):
    values = query.get(key)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise QueryError(f"{key} must be an integer") from None
    if value < 0:
        raise QueryError(f"{key} must not be negative")
    return value


def _matches(e: Entry, targets: set[str], names: set[str], severities: set[str], models: set[str]) -> bool:
    if targets and e.target not in targets:
        return False
    if not (names or severities or models):
        return True
    r = e.report
    if r is None:
        return False
    if models and r.model_name not in models:
        return False
    if names or severities:
        return any((not names or f.finding in names) and (not severities or f.severity in severities)
                   for f in r.findings)
    return True


class TargetsIndex:
    """One publish's target states: frozen rows, turned into JSON objects by `build` on request."""

    def __init__(self, rows: Sequence[Any], build: Callable[[Any], Mapping[str, Any]]) -> None:
        self.rows = tuple(rows)
        self.build = build
        self._full: bytes | None = None

    def document(self, query: Mapping[str, list[str]] | None = None) -> bytes:
        wanted = set((query or {}).get("target", ()))
        if not wanted and self._full is not None:
            return self._full
        objs = (self.build(r) for r in self.rows)
        doc = b'{"targets": [' + b", ".join(json.dumps(o).encode() for o in objs
                                            if not wanted or o["target"] in wanted) + b"]}"
        if not wanted:
            self._full = doc
        return doc
