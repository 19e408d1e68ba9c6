"""The daemon's `/metrics` body, kept up to date per target instead of re-rendered per publish.

Why: at 10,000 targets the whole exposition is ~300,000 samples. Building and writing them all
on every publish (every scrape cycle and evaluation) cost ~140 us per target, and one Python
render held the GIL in long runs while a Prometheus waited for `/metrics`. A target's report
families (findings, scores, predictions: most of its samples) only change when that target is
evaluated, so:

* per target, the report families (`collector.REPORT_FAMILIES`) are rendered once per new set
  of `ModelReport`s (the reports are immutable; a new tuple means a new evaluation), straight
  from `collector.report_samples` to text, and kept as text per family;
* the scrape-state families (`up`, durations, errors, info; a few samples per target) and the
  fleet-level ones are rendered on every publish from a view without reports (cheap);
* the body is a tuple of parts in family order (the text format wants a family's samples
  together): each family's header and scrape-state text, then every target's block of that
  family, kept as the very bytes objects the blocks hold, never joined into one body (at 10,000
  targets a joined body was a 26 MB copy per publish, plus a 26 MB str while joining);
  `/metrics` writes the parts with gather writes (`render.send_parts`), and gzip is compressed
  once per body in a background thread instead of once per request (only while clients ask for
  gzip).

The result is byte-for-byte what `Exposition.render` gives for the same view (tested): a
report's samples are listed once (`report_samples`) for both.
"""
from __future__ import annotations

import gzip
import threading
import time
import zlib
from typing import Callable

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily

from exporter.export.collector import REPORT_FAMILIES, Exposition, FleetView, TargetView, report_samples
from exporter.export.render import coalesced, escaped, go_float, head_template

__all__ = ["CachedExposition", "CapsCollector"]


def _report_head(name: str, labels: tuple[str, ...]):
    """(head template, picker of the label values in the order the text format sorts names)."""
    order = sorted(range(len(labels)), key=labels.__getitem__)
    return head_template(name, [labels[j] for j in order]), \
        (lambda values: tuple([escaped(values[j]) for j in order]))


# per report family: its head as a %-template and the escaped label values it is filled with
_REPORT_HEADS = tuple(_report_head(name, labels) for name, _doc, _typ, labels in REPORT_FAMILIES)


def _report_line(i: int, values: tuple[str, ...], value: float) -> str:
    """One report sample's line as `Renderer.parts` writes it. Not through the renderer's head
    cache: the block keeps the text, and a cache entry per report sample was ~13 KiB per
    target (docs/scaling.md)."""
    template, fill = _REPORT_HEADS[i]
    return f"{template % fill(values)}{go_float(value)}\n"


class CachedExposition(Exposition):
    """`Exposition` with per-target render caching and a cached gzip body."""

    def __init__(self, *, compress_min_bytes: int = 256 * 1024) -> None:
        self._blocks: dict[str, tuple[tuple, dict[str, bytes]]] = {}   # target -> (reports key, family -> lines)
        self._rendered: tuple[bytes, ...] = ()
        self._serial = 0                            # publishes so far: the number of `_rendered`
        self._replaced_at = 0.0                     # monotonic time `_rendered` replaced the body before it
        self._gz: tuple[tuple[bytes, ...], bytes, int] | None = None   # (body it compresses, gzip bytes, its serial)
        self._gz_lock = threading.Lock()
        self._gz_thread: threading.Thread | None = None
        self.compress_min_bytes = compress_min_bytes
        self.rendered_targets = 0                  # report blocks rendered since start (a counter)
        self._live_cache: tuple[float, bytes, bytes] | None = None
        self._gzip_wanted_at: float | None = None    # monotonic time of the last gzip request
        super().__init__()

    # ------------------------------------------------------------------ publish (loop thread)
    def publish(self, view: FleetView) -> None:
        try:
            body = self._assemble(view)
        except ValueError:      # a family the split cannot join (OpenMetrics-only samples)
            self.collector.view = view
            body = (self._renderer.render(self.registry.collect()),)
        self._replaced_at = time.monotonic()
        self._serial += 1
        self._rendered = body
        self._compress_later(body)

    def prerender(self, t: TargetView) -> None:
        """Render one target's report block now (right after its evaluation, in small steps),
        so that the next publish finds it ready instead of rendering every evaluated target at
        once: at 3,000 targets that one step held the GIL for ~0.3-1 s."""
        try:
            self._blocks[t.target] = self._block(t, self._blocks.get(t.target))
        except ValueError:
            pass                # publish falls back to a full render

    def _block(self, t: TargetView, hit):
        key = (t.reports, t.vllm_version, t.source)
        if hit is not None and hit[0][1:] == key[1:] and _same(hit[0][0], t.reports):
            return hit
        lines: dict[str, bytes] = {}
        if t.reports:
            # the lines of the report families (collector.REPORT_FAMILIES), straight from the
            # reports: what FleetCollector.reports + Renderer.parts write, without building
            # prometheus_client families only to format them
            by_family: dict[int, list[str]] = {}
            for r in t.reports:
                for i, values, value in report_samples(r):
                    text = _report_line(i, values, value)
                    got = by_family.get(i)
                    if got is None:
                        by_family[i] = [text]
                    else:
                        got.append(text)
            for i in sorted(by_family):
                lines[REPORT_FAMILIES[i][0]] = "".join(by_family[i]).encode()
            self.rendered_targets += 1
        return (key, lines)

    def _assemble(self, view: FleetView) -> tuple[bytes, ...]:
        old = self._blocks
        blocks = {t.target: self._block(t, old.get(t.target)) for t in view.targets}
        self._blocks = blocks
        renderer = self._renderer
        # scrape state and fleet-level families: every target, its report families left empty
        self.collector.view = view
        self.collector.with_reports = False
        per_family: dict[str, list[bytes]] = {}
        for t in view.targets:
            for name, text in blocks[t.target][1].items():
                got = per_family.get(name)
                if got is None:
                    per_family[name] = [text]
                else:
                    got.append(text)
        out: list[bytes] = []
        try:
            for name, header, text in renderer.parts(self.registry.collect()):
                out.append((header + text).encode("utf-8"))
                extra = per_family.get(name)
                if extra:
                    out.extend(extra)
        finally:
            self.collector.with_reports = True
        return tuple(out)

    def head_cache(self) -> tuple[int, int]:
        return self._renderer.cache()

    # ------------------------------------------------------------------ gzip
    # Bodies are compressed only while gzip is being asked for: a client that does not take
    # gzip (curl, a probe) must not pay a whole-body compression per publish it never reads.
    # The first gzip request after a quiet spell starts one and is answered plain meanwhile.
    # While a new body is being compressed (~0.2 s for the 26 MB of 10,000 targets), a gzip
    # request gets the body one publish back, compressed, for up to GZIP_STALE_MAX seconds after
    # it was replaced: sending the new one plain meanwhile made every ~30th Prometheus scrape of
    # a 10,000-target daemon read 26 MB instead of 1.5 (the /metrics p99 of docs/scaling.md).
    GZIP_IDLE = 600.0     # seconds without a gzip request after which publishes stop compressing
    GZIP_STALE_MAX = 5.0  # seconds the previous body's gzip may answer while the newest compresses

    def _compress_later(self, body: tuple[bytes, ...]) -> None:
        wanted = self._gzip_wanted_at
        if wanted is None or time.monotonic() - wanted > self.GZIP_IDLE:
            return
        if sum(map(len, body)) < self.compress_min_bytes:
            return
        with self._gz_lock:
            if self._gz_thread is not None and self._gz_thread.is_alive():
                return          # the running one picks up the newest body when it finishes
            self._gz_thread = threading.Thread(target=self._compress_loop, name="vllm-drift-gzip", daemon=True)
            self._gz_thread.start()

    def _compress_loop(self) -> None:
        while True:
            # read mid-publish, the serial may be the next body's: that gzip is then never
            # served as the body before (see render_gzip_parts), only ever as its own body
            body, serial = self._rendered, self._serial
            gz = gzip_parts(body)
            with self._gz_lock:
                self._gz = (body, gz, serial)
                if self._rendered is body:
                    self._gz_thread = None
                    return

    # ------------------------------------------------------------------ serve (HTTP threads)
    # The live part (process metrics: CPU, RSS, open files read from /proc) is read every
    # LIVE_TTL seconds by the daemon (`refresh_live`), not per request: with one socket per
    # target open, counting them is a directory listing of 10,000 entries, which made every
    # request that found the part stale wait 60-200 ms at 10,000 targets. Prometheus scrapes
    # every 15 s or more; a value up to 5 s old changes no rate().
    LIVE_TTL = 5.0

    def refresh_live(self) -> None:
        text = generate_latest(self.live)
        self._live_cache = (time.monotonic(), text, gzip.compress(text, compresslevel=1, mtime=0))

    def _live(self) -> tuple[bytes, bytes]:
        """(text, gzip member) of the live registry: the last refresh, or read now when there
        has been none for 3 x LIVE_TTL (nothing refreshes it: a one-shot use, a stalled loop)."""
        got = self._live_cache
        if got is None or time.monotonic() - got[0] >= 3 * self.LIVE_TTL:
            self.refresh_live()
            got = self._live_cache
        return got[1], got[2]

    def render_parts(self) -> tuple[bytes, ...]:
        """The body as parts to be written one after the other (the fleet's, then the live
        process metrics): joining them would copy the body (26 MB at 10,000 targets) per request."""
        return self._rendered + (self._live()[0],)

    def render(self) -> bytes:
        return b"".join(self.render_parts())

    def render_gzip_parts(self) -> tuple[bytes, bytes] | None:
        """The body gzip-compressed (two gzip members: the cached fleet part, then the live
        process metrics). While the newest body is still being compressed: the previous body's
        gzip if that body was replaced at most GZIP_STALE_MAX seconds ago, else None (the caller
        then sends the newest uncompressed rather than wait)."""
        now = self._gzip_wanted_at = time.monotonic()
        body, gz = self._rendered, self._gz
        if gz is not None and gz[0] is body:
            return gz[1], self._live()[1]
        self._compress_later(body)
        if gz is not None and gz[2] == self._serial - 1 and now - self._replaced_at <= self.GZIP_STALE_MAX:
            return gz[1], self._live()[1]          # one publish back, while the newest compresses
        return None

    def render_gzip(self) -> bytes | None:
        parts = self.render_gzip_parts()
        return None if parts is None else b"".join(parts)


def gzip_parts(parts: tuple[bytes, ...], chunk: int = 256 * 1024) -> bytes:
    """One gzip member of the concatenated parts (what gzip.compress(b"".join(parts), 1,
    mtime=0) decompresses to), fed to zlib in ~`chunk` pieces: zlib releases the GIL on large
    inputs, and tens of thousands of small calls would not."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = [z.compress(piece) for piece in coalesced(parts, chunk)]
    out.append(z.flush())
    return b"".join(out)


def _same(a: tuple, b: tuple) -> bool:
    """Reports tuples holding the same report objects (reports are immutable: a new evaluation
    makes new ones), compared by identity, not by value."""
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))


class CapsCollector:
    """The daemon's memory caps and how full the bounded caches are, as metrics.

    `caps()` returns {cap name: (limit, current size or None)}; documented in docs/scaling.md."""

    def __init__(self, caps: Callable[[], dict[str, tuple[float, float | None]]]) -> None:
        self.caps = caps

    def collect(self):
        limit = GaugeMetricFamily("vllm_drift_memory_cap", "A bound on the daemon's memory, by cap "
                                  "(docs/scaling.md).", labels=["cap"])
        used = GaugeMetricFamily("vllm_drift_memory_cap_used", "Current size of a bounded cache or "
                                 "collection, by cap.", labels=["cap"])
        for name, (cap, size) in sorted(self.caps().items()):
            limit.add_metric([name], float(cap))
            if size is not None:
                used.add_metric([name], float(size))
        yield limit
        yield used
