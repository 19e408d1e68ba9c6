"""Query mode: targets and Snapshots read from a Prometheus-compatible store instead of scraped.

Why: where Prometheus (or Thanos, Mimir) already scrapes every vLLM server, scraping them again
doubles the load on the servers and bounds the fleet by this process's network and parse budget.
Here the daemon asks the store, per target and per cycle, for the instant values of the vLLM
series the canonicaliser reads, turns them back into exposition families
(`exporter.query.families`), and hands them to the same canonicaliser and windows as scrape mode.

* Targets: the values of `target_label` on `up{selector}` (down ones included, so a dead server
  is reported down rather than silently dropped).
* Per target, one instant query returns the canonical vLLM series, Prometheus's `up` and the
  scrape's own timestamp (`timestamp(up)`), so rates use the time the sample was taken, not the
  time it was read: reading a 15 s scrape every 30 s would otherwise jitter rates by up to 50 %.
* A new target's window can be backfilled at once from one range query over the evaluation
  window (`backfill: true`), so findings do not wait a full window after a restart.
* Failures (store down, slow, erroring) are `QueryError`s with a fixed reason; the daemon counts
  them per target and keeps the last good state. `up == 0` in the store is `target_down`.
"""
from __future__ import annotations

import asyncio
import re
from typing import Callable
from urllib.parse import urlencode

import structlog
from pydantic import ValidationError

from exporter.config import PrometheusConfig, TargetSpec
from exporter.errors import ParseError
from exporter.parse.canonical import canonicalise
from exporter.parse.snapshot import Snapshot
from exporter.query.client import PromAPI, QueryError
from exporter.parse.exposition import Reader
from exporter.query.families import name_regex, rows_constant_labels, rows_to_families

log = structlog.get_logger("vllm_drift.query")

# Pseudo-series in the per-target query are told apart by this label (set operators match on
# labels without the metric name, so a name alone would not keep `up` and `timestamp(up)` apart).
PSEUDO = "vllm_drift_series"
BATCH = 16              # targets per query in a cycle (one response holds ~300 series per target)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _value(item: dict) -> float:
    try:
        return float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise QueryError("query_bad_response", f"malformed sample {str(item)[:120]}") from None


def target_url(label_value: str) -> str:
    """A target name for the label value: `host:port` becomes `http://host:port`."""
    return label_value if "://" in label_value else f"http://{label_value}"


class PrometheusReader:
    """A target `Source` (its list is refreshed by `refresh()`) and the per-target reader."""

    name = "prometheus"

    def __init__(self, cfg: PrometheusConfig, *, on_error: Callable[[str, str], None] | None = None) -> None:
        self.cfg = cfg
        self.on_error = on_error
        token = None
        if cfg.bearer_token_file:
            try:
                with open(cfg.bearer_token_file, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError as exc:
                self._report(f"prometheus.bearer_token_file: {cfg.bearer_token_file}: {exc.strerror}")
        self.api = PromAPI(cfg.url, timeout=cfg.timeout, concurrency=cfg.concurrency,
                           headers=cfg.headers, bearer_token=token)
        self.matchers = cfg.selector.strip()[1:-1].strip().rstrip(",")
        self._names = name_regex()
        self._targets: list[TargetSpec] = []
        self._label_of: dict[str, str] = {}
        self._encoded: dict[str, str] = {}
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._reader = Reader(("vllm:", "up"))     # federate mode
        self._flusher: asyncio.Future | None = None

    def _report(self, message: str) -> None:
        if self.on_error:
            self.on_error("prometheus", message)
        else:
            log.warning("prometheus query failed", error=message)

    # ------------------------------------------------------------------ Source
    def targets(self) -> list[TargetSpec]:
        return self._targets

    def close(self) -> None:
        try:
            asyncio.get_running_loop().create_task(self.api.aclose())
        except RuntimeError:
            pass

    async def aclose(self) -> None:
        await self.api.aclose()

    # ------------------------------------------------------------------ queries
    def _selector(self, label_value: str | None = None, *, extra: str = "") -> str:
        parts = [p for p in (extra, self.matchers) if p]
        if label_value is not None:
            parts.append(f"{self.cfg.target_label}={_quote(label_value)}")
        return "{" + ",".join(parts) + "}"

    def _target_query(self, label_value: str) -> str:
        sel = self._selector(label_value)
        vllm = self._selector(label_value, extra=f'__name__=~"{self._names}"')
        return (f'{vllm} or label_replace(timestamp(up{sel}), "{PSEUDO}", "scrape_timestamp", "", "") '
                f'or label_replace(up{sel}, "{PSEUDO}", "up", "", "")')

    async def refresh(self) -> bool:
        """Re-read the target list; on failure keep the last one and report. True on success."""
        tl = self.cfg.target_label
        try:
            vector = await self.api.instant(f"group by ({tl}) (up{self._selector()})")
        except QueryError as exc:
            self._report(f"listing targets: {exc}")
            return False
        specs: list[TargetSpec] = []
        label_of: dict[str, str] = {}
        for s in vector:
            value = s.labels.get(tl)
            if not value:
                continue
            try:
                spec = TargetSpec(url=target_url(value), name=value, source="prometheus",
                                  labels={tl: value})
            except ValidationError:
                self._report(f"{tl}={value!r} does not name a host; set prometheus.target_label to one that does")
                continue
            if spec.url not in label_of:
                label_of[spec.url] = value
                specs.append(spec)
        specs.sort(key=lambda t: t.url)
        self._targets, self._label_of = specs, label_of
        return True

    def _snapshots(self, url: str, series: list[tuple[dict[str, str], float]], at: float) -> list[Snapshot]:
        up = next((v for labels, v in series if labels.get(PSEUDO) == "up"), None)
        scraped = next((v for labels, v in series if labels.get(PSEUDO) == "scrape_timestamp"), None)
        vllm = [(labels, v) for labels, v in series
                if PSEUDO not in labels and labels.get("__name__", "").startswith("vllm:")]
        rows = [(labels["__name__"], labels, v) for labels, v in vllm]
        return self._snapshots_from_rows(url, rows, up, scraped, at, drop=frozenset({"__name__"}))

    async def read(self, spec: TargetSpec, at: float) -> list[Snapshot]:
        """The target's Snapshots as of `at` (stamped with the scrape time Prometheus recorded).

        Reads issued together (the daemon gathers a cycle's targets) are batched: up to `BATCH`
        targets share one query (`target_label=~"a|b|..."`), and each read gets its own series
        back, so the HTTP and query overhead is paid once per batch, not once per target."""
        value = self._label_of.get(spec.url) or spec.labels.get(self.cfg.target_label) or spec.name or spec.url
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((value, fut))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush(at))
        result = await fut
        if self.cfg.federate:
            return self._snapshots_from_rows(spec.url, *result, at)
        return self._snapshots(spec.url, result, at)

    async def _flush(self, at: float) -> None:
        await asyncio.sleep(0)                      # let every read of this round register
        pending, self._pending, self._flusher = self._pending, [], None
        chunks = [pending[i:i + BATCH] for i in range(0, len(pending), BATCH)]
        await asyncio.gather(*(self._query_batch(chunk, at) for chunk in chunks))

    async def _query_batch(self, chunk: list[tuple[str, asyncio.Future]], at: float) -> None:
        if self.cfg.federate:
            return await self._federate_batch(chunk)
        values = sorted({v for v, _ in chunk})
        key = "\0".join(values)
        encoded = self._encoded.get(key)
        if encoded is None:            # the same batches recur every cycle: encode each once
            if len(self._encoded) > 10_000:
                self._encoded.clear()
            encoded = self._encoded[key] = urlencode({"query": self._batch_query(values)})
        try:
            items = await self.api.instant_items(encoded, at)
            by_target: dict[str, list[tuple[dict[str, str], float]]] = {v: [] for v in values}
            tl = self.cfg.target_label
            for item in items:
                labels = item.get("metric") or {}
                rows = by_target.get(labels.get(tl, ""))
                if rows is not None:
                    rows.append((labels, _value(item)))
        except QueryError as exc:
            _fail(chunk, lambda: QueryError(exc.reason, str(exc)))
            return
        except BaseException as exc:  # noqa: BLE001 - never leave a read waiting
            _fail(chunk, lambda: exc)
            raise
        for value, fut in chunk:
            if not fut.done():
                fut.set_result(by_target[value])

    async def _federate_batch(self, chunk: list[tuple[str, asyncio.Future]]) -> None:
        """The batch through `/federate`: exposition text with scrape timestamps, parsed by the
        same fast reader as scrape mode (its caches make repeated series cheap)."""
        values = sorted({v for v, _ in chunk})
        key = "federate\0" + "\0".join(values)
        encoded = self._encoded.get(key)
        if encoded is None:
            if len(self._encoded) > 10_000:
                self._encoded.clear()
            matcher = self._batch_matcher(values)
            vllm = "{" + ",".join(p for p in (f'__name__=~"{self._names}"', self.matchers, matcher) if p) + "}"
            up = "up{" + ",".join(p for p in (self.matchers, matcher) if p) + "}"
            encoded = self._encoded[key] = urlencode([("match[]", vllm), ("match[]", up)])
        tl = self.cfg.target_label
        try:
            text = await self.api.federate(encoded)
            per: dict[str, list] = {v: [[], None, None] for v in values}   # rows, up, scrape time
            for fam in self._reader.parse(text):
                is_up = fam.name == "up"
                if not is_up and not fam.name.startswith("vllm:"):
                    continue
                for name, labels, value, ts in fam.samples:
                    slot = per.get(labels.get(tl, ""))
                    if slot is None:
                        continue
                    if is_up:
                        slot[1] = value
                    else:
                        slot[0].append((name, labels, value))
                        if ts is not None and (slot[2] is None or ts > slot[2]):
                            slot[2] = ts
        except (QueryError, ParseError) as exc:
            err = exc if isinstance(exc, QueryError) else QueryError("query_bad_response", f"/federate: {exc}")
            _fail(chunk, lambda: QueryError(err.reason, str(err)))
            return
        except BaseException as exc:  # noqa: BLE001 - never leave a read waiting
            _fail(chunk, lambda: exc)
            raise
        for value, fut in chunk:
            if not fut.done():
                fut.set_result(tuple(per[value]))

    def _snapshots_from_rows(self, url: str, rows: list, up: float | None, scraped: float | None,
                             at: float, drop: frozenset[str] = frozenset()) -> list[Snapshot]:
        """(name, labels, value) rows of one target -> Snapshots through the canonicaliser; the
        labels Prometheus added to every series of the target (and `drop`) are left out."""
        if up is not None and up == 0:
            raise QueryError("target_down", f"{url}: Prometheus reports up == 0 for this target")
        if not rows:
            raise QueryError("no_series", f"{url}: no vLLM series in Prometheus for this target at {at:.0f}")
        families = rows_to_families(rows, rows_constant_labels(rows, self.cfg.target_label) | drop)
        try:
            return canonicalise(families, target=url, timestamp=scraped if scraped else at)
        except ParseError as exc:
            raise QueryError("no_series", f"{url}: {exc}") from None

    def _batch_matcher(self, values: list[str]) -> str:
        if len(values) == 1:
            return f"{self.cfg.target_label}={_quote(values[0])}"
        return f"{self.cfg.target_label}=~{_quote('|'.join(re.escape(v) for v in values))}"

    def _batch_query(self, values: list[str]) -> str:
        if len(values) == 1:
            return self._target_query(values[0])
        alternatives = "|".join(re.escape(v) for v in values)
        matcher = f"{self.cfg.target_label}=~{_quote(alternatives)}"
        sel = "{" + ",".join(p for p in (self.matchers, matcher) if p) + "}"
        vllm = "{" + ",".join(p for p in (f'__name__=~"{self._names}"', self.matchers, matcher) if p) + "}"
        return (f'{vllm} or label_replace(timestamp(up{sel}), "{PSEUDO}", "scrape_timestamp", "", "") '
                f'or label_replace(up{sel}, "{PSEUDO}", "up", "", "")')

    async def history(self, spec: TargetSpec, start: float, end: float, step: float) -> list[list[Snapshot]]:
        """Snapshots at each `step` over [start, end) from one range query, oldest first; steps
        that repeat a scrape already seen, or lack data, are left out."""
        value = self._label_of.get(spec.url) or spec.labels.get(self.cfg.target_label) or spec.name or spec.url
        matrix = await self.api.range(self._target_query(value), start, end, step)
        by_time: dict[float, list[tuple[dict[str, str], float]]] = {}
        for labels, points in matrix:
            for t, v in points:
                by_time.setdefault(t, []).append((labels, v))
        out: list[list[Snapshot]] = []
        seen: set[float] = set()
        for t in sorted(by_time):
            if t >= end:
                continue
            try:
                snaps = self._snapshots(spec.url, by_time[t], t)
            except QueryError:
                continue
            stamp = snaps[0].timestamp if snaps else t
            if stamp in seen:
                continue
            seen.add(stamp)
            out.append(snaps)
        return out


def _fail(chunk: list[tuple[str, asyncio.Future]], make_exc) -> None:
    """Fail every read of a batch that is still waiting (each gets its own exception object)."""
    for _, fut in chunk:
        if not fut.done():
            fut.set_exception(make_exc())
