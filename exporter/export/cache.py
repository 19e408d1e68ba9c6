"""The daemon's `/metrics` body, kept up to date per target instead of re-rendered per publish.

Why: at 10,000 targets the whole exposition is ~300,000 samples. Building and writing them all
on every publish (every scrape cycle and evaluation) cost ~140 us per target, and one Python
render held the GIL in long runs while a Prometheus waited for `/metrics`. A target's report
families (findings, scores, predictions: most of its samples) only change when that target is
evaluated, so:

* per target, the report families (`collector.REPORT_FAMILIES`) are rendered once per new set
  of `ModelReport`s (the reports are immutable; a new tuple means a new evaluation), straight
  from `collector.report_samples` to text, and kept as text per family; a family whose samples
  hash as they did at the target's evaluation before keeps the lines it had (most settings,
  statuses and predictions do not move from one evaluation to the next);
* the scrape-state families (`collector.TARGET_FAMILIES`: `up`, durations, errors, info; a few
  samples per target) are written per target from `collector.target_samples`, a family again
  only when what it shows changed, and their texts are kept whole across a publish with no
  scrape since the last one (an evaluation's); the fleet-level ones are rendered on every
  publish (a few samples);
* the body is a tuple of parts in family order (the text format wants a family's samples
  together): each family's header and scrape-state text, then one text of that family's lines
  for every target. That text is built per publish from the one before (where each target's
  lines start is kept in a numpy array per family). When the targets are those of the last
  publish in the same order (most publishes), only the families some re-evaluated target's
  lines changed in are built again, its new lines spliced in; the others stay the same objects.
  Otherwise the lines of targets not re-evaluated are sliced out of the text before (a run of
  such targets in one slice) and re-evaluated targets' lines are put in between. A target's
  changed lines are kept on their own only from its evaluation to the next publish, so the
  report text is held once, not once per target and again in a joined body. `/metrics` writes
  the parts with gather writes (`render.send_parts`): tens of parts, not one per target and
  family (at 3,000 targets, 33,000 parts took ~10 ms of CPU per plain request, the kernel
  copying small buffers; ~4 ms as tens of large ones). gzip is compressed once per body in a
  background thread instead of once per request (only while clients ask for gzip).

The result is byte-for-byte what `Exposition.render` gives for the same view (tested): a
report's samples are listed once (`report_samples`) for both.
"""
from __future__ import annotations

import gzip
import threading
import time
import zlib
from array import array
from math import copysign
from typing import Callable

import numpy as np

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily

from exporter.export.collector import (REPORT_FAMILIES, TARGET_FAMILIES, Exposition, FleetView, TargetView,
                                       report_samples, target_samples)
from exporter.export.render import coalesced, escaped, go_float, head_template

__all__ = ["CachedExposition", "CapsCollector"]


def _family_head(name: str, labels: tuple[str, ...]):
    """(head template, picker of the label values in the order the text format sorts names)."""
    order = sorted(range(len(labels)), key=labels.__getitem__)
    return head_template(name, [labels[j] for j in order]), \
        (lambda values: tuple([escaped(values[j]) for j in order]))


# per report family: its head as a %-template and the escaped label values it is filled with
_REPORT_HEADS = tuple(_family_head(name, labels) for name, _doc, _typ, labels in REPORT_FAMILIES)


# per target scrape-state family: its head template and filler, by the name its samples (and the
# renderer's parts) carry
_TARGET_NAMES = tuple(name + "_total" if typ == "counter" else name for name, _doc, typ, _labels in TARGET_FAMILIES)
_TARGET_HEADS = tuple(_family_head(sample, family[3]) for sample, family in zip(_TARGET_NAMES, TARGET_FAMILIES))


def _target_shows(t: TargetView) -> tuple:
    """What each of a target's TARGET_FAMILIES shows (`_target_lines` writes a family again when
    its part changed)."""
    return (t.up, t.scrape_duration_s, t.last_success, (t.vllm_version, t.models), t.errors)


def _target_lines(t: TargetView, shows: tuple, before: tuple | None) -> tuple[bytes, ...]:
    """One target's scrape-state lines per TARGET_FAMILIES, as `Renderer.parts` writes them:
    those of `before` ((what they showed, its lines)) where their part of `shows` is the same (a
    scrape moves the duration and the last success, rarely the rest)."""
    fresh = [True] * len(TARGET_FAMILIES) if before is None else [a != b for a, b in zip(shows, before[0])]
    out: list[list[str]] = [[] for _ in TARGET_FAMILIES]
    for i, values, value in target_samples(t):
        if fresh[i]:
            template, fill = _TARGET_HEADS[i]
            out[i].append(f"{template % fill(values)}{go_float(value)}\n")
    return tuple("".join(out[i]).encode() if fresh[i] else before[1][i] for i in range(len(TARGET_FAMILIES)))


def _report_line(i: int, values: tuple[str, ...], value: float) -> str:
    """One report sample's line as `Renderer.parts` writes it. Not through the renderer's head
    cache: the block keeps the text, and a cache entry per report sample was ~13 KiB per
    target (docs/scaling.md)."""
    template, fill = _REPORT_HEADS[i]
    return f"{template % fill(values)}{go_float(value)}\n"


class CachedExposition(Exposition):
    """`Exposition` with per-target render caching and a cached gzip body."""

    def __init__(self, *, compress_min_bytes: int = 256 * 1024) -> None:
        # target -> (reports key, lines, signatures): its position among the targets of the last
        # publish's family texts, or when rendered since (that position or None, its lines of the
        # families that changed: `_block`); a hash of each family's samples (0: none), by index
        self._blocks: dict[str, tuple[tuple, dict[str, bytes] | int, array]] = {}
        # report family -> (every target's lines of it, joined in the last publish's target
        # order; where each position's lines start, then the end)
        self._joined: dict[str, tuple[bytes, np.ndarray]] = {}
        self._current: tuple[int, tuple[bytes, ...]] = (0, ())   # (publishes so far, the body)
        self._published = 0                        # targets in the last publish's family texts
        # scrape state: target -> (what its lines show, its lines per TARGET_FAMILIES); each
        # family's lines of all the last publish's targets
        self._states: dict[str, tuple[tuple, tuple[bytes, ...]]] = {}
        self._state_texts: dict[str, bytes] = {}
        self._replaced_at = 0.0                     # monotonic time the body replaced the one before it
        self._gz: tuple[int, bytes] | None = None   # (publish number of the body it compresses, gzip bytes)
        self._gz_lock = threading.Lock()
        self._gz_thread: threading.Thread | None = None
        self.compress_min_bytes = compress_min_bytes
        self.rendered_targets = 0                  # targets' reports rendered since start (a counter)
        self.rendered_families = 0                 # of their families, those written anew (not reused)
        self._live_cache: tuple[float, bytes, bytes] | None = None
        self._gzip_wanted_at: float | None = None    # monotonic time of the last gzip request
        super().__init__()

    @property
    def body(self) -> tuple[bytes, ...]:
        """The fleet part of the current `/metrics` body, as parts to be written in order."""
        return self._current[1]

    # ------------------------------------------------------------------ publish (loop thread)
    def publish(self, view: FleetView) -> None:
        try:
            body = self._assemble(view)
        except ValueError:      # a family the split cannot join (OpenMetrics-only samples)
            self.collector.view = view
            body = (self._renderer.render(self.registry.collect()),)
        self._replaced_at = time.monotonic()
        self._current = (self._current[0] + 1, body)      # one assignment: readers see both or neither
        self._compress_later()

    def prerender(self, t: TargetView) -> None:
        """Render one target's report lines now (right after its evaluation, in small steps),
        so that the next publish finds them ready instead of rendering every evaluated target at
        once: at 3,000 targets that one step held the GIL for ~0.3-1 s."""
        try:
            self._blocks[t.target] = self._block(t, self._blocks.get(t.target))
        except ValueError:
            pass                # publish falls back to a full render

    def _block(self, t: TargetView, hit):
        """(key, lines, signatures) of one target: `hit`, its block before, while its reports are
        the same objects; else its report families' lines rendered again, except a family whose
        samples are those it had before (same signature: a hash of its label values and values),
        which keeps its lines where they are. Settings, statuses, predictions and SLOs rarely
        move between two evaluations; scores move with the traffic.

        `lines` is the target's position in the last publish's family texts when nothing changed
        since, else (that position or None for a target new since, {family: its lines now} for
        the families that changed since, b"" for one that lost its lines; with no position,
        every family that has lines)."""
        key = (t.reports, t.vllm_version, t.source)
        if hit is not None and hit[0][1:] == key[1:] and _same(hit[0][0], t.reports):
            return hit
        sigs = array("q", _NO_SIGNATURES)
        by_family: dict[int, list[tuple]] = {}
        if t.reports:
            # the lines of the report families (collector.REPORT_FAMILIES), straight from the
            # reports: what FleetCollector.reports + Renderer.parts write, without building
            # prometheus_client families only to format them
            for r in t.reports:
                for i, values, value in report_samples(r):
                    # 0.0 and -0.0 hash alike but are written apart: a zero carries its sign
                    sample = (values, value) if value else (values, value, copysign(1.0, value))
                    got = by_family.get(i)
                    if got is None:
                        by_family[i] = [sample]
                    else:
                        got.append(sample)
            for i, samples in by_family.items():
                sigs[i] = hash(tuple(samples)) or 1           # 0: no lines in this family
            self.rendered_targets += 1
        if hit is None:
            before, at, had = None, None, {}
        else:
            before, src = hit[2], hit[1]
            if sigs == before:
                # every family as before: the lines stay where they are (in the last publish's
                # texts, or rendered since), and a publish whose targets all stayed keeps the
                # family texts as they are instead of joining them again
                return (key, src, sigs)
            at, had = (src, {}) if type(src) is int else src
        lines: dict[str, bytes] = {}
        for i in sorted(by_family) if before is None else range(len(sigs)):
            sig = sigs[i]
            name = _REPORT_NAMES[i]
            if before is not None and before[i] == sig:
                if name in had:
                    lines[name] = had[name]         # changed at an evaluation since the last publish
                continue                            # else as at the last publish: at its position there
            if sig:
                lines[name] = "".join([_report_line(i, s[0], s[1]) for s in by_family[i]]).encode()
                self.rendered_families += 1
            elif at is not None:
                lines[name] = b""                   # its lines are gone
        return (key, (at, lines), sigs)

    def _whole(self, src) -> dict[str, bytes]:
        """Every family's lines of a target rendered since the last publish (`_block`'s
        `(position, changed lines)`): the unchanged ones sliced from that publish's texts."""
        at, lines = src
        if at is None:
            return lines
        out = dict(lines)
        for name, (text, offs) in self._joined.items():
            if name not in out and at + 1 < len(offs):
                out[name] = text[int(offs[at]):int(offs[at + 1])]
        return out

    def _assemble(self, view: FleetView) -> tuple[bytes, ...]:
        old, joined = self._blocks, self._joined
        blocks: dict[str, tuple[tuple, int, array]] = {}
        n = len(view.targets)
        # the same targets in the same order as at the last publish (most publishes): each
        # target's block is at its position there
        same_order = n == self._published
        srcs: list = []
        fresh: list[tuple[int, tuple]] = []
        # scrape state: a target's lines are written again when what they show changed (every
        # scrape moves its duration; an evaluation's publish finds them all as they were)
        old_states, states, state_lines = self._states, {}, []
        restated = False
        for pos, t in enumerate(view.targets):
            url = t.target
            shown = _target_shows(t)
            st = old_states.get(url)
            if st is None or st[0] != shown:
                st = (shown, _target_lines(t, shown, st))
                restated = True
            states[url] = st
            state_lines.append(st[1])
            key, src, sigs = self._block(t, old.get(url))
            blocks[url] = (key, pos, sigs)
            srcs.append(src)
            if type(src) is int:
                same_order = same_order and src == pos
            else:
                same_order = same_order and src[0] == pos
                fresh.append((pos, src))
        if same_order and len(joined) == len(_REPORT_NAMES):
            # each family's text is the one before with the changed targets' lines spliced in
            changes: dict[str, list[tuple[int, bytes]]] = {}
            for pos, (_at, lines) in fresh:
                for name, text in lines.items():
                    got = changes.get(name)
                    if got is None:
                        changes[name] = [(pos, text)]
                    else:
                        got.append((pos, text))
            texts = {name: _splice(joined[name], changes[name]) if name in changes else joined[name]
                     for name in _REPORT_NAMES}
        else:
            # the targets in body order as runs: [old start, old end, new start] of targets whose
            # lines lie one after the other in the last publish's texts, or [their lines, new
            # start] of targets rendered since
            runs: list[list] = []
            for pos, src in enumerate(srcs):
                last = runs[-1] if runs else None
                if type(src) is int:
                    if last is not None and len(last) == 3 and last[1] == src:
                        last[1] += 1
                    else:
                        runs.append([src, src + 1, pos])
                elif last is not None and len(last) == 2:
                    last[0].append(self._whole(src))
                else:
                    runs.append([[self._whole(src)], pos])
            texts = {name: _join(name, runs, joined.get(name), n) for name in _REPORT_NAMES}
        if restated or not same_order:
            state_texts = {name: b"".join([lines[k] for lines in state_lines]) for k, name in enumerate(_TARGET_NAMES)}
        else:
            state_texts = self._state_texts
        renderer = self._renderer
        # the fleet-level families, and the headers of the per-target ones (left empty: their
        # lines are the texts above)
        self.collector.view = view
        self.collector.per_target = False
        out: list[bytes] = []
        try:
            for name, header, text in renderer.parts(self.registry.collect()):
                out.append((header + text).encode("utf-8"))
                got = texts.get(name)
                if got is not None and got[0]:
                    out.append(got[0])
                elif state_texts.get(name):
                    out.append(state_texts[name])
        finally:
            self.collector.per_target = True
        self._blocks, self._joined, self._published = blocks, texts, n
        self._states, self._state_texts = states, state_texts
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

    def _compress_later(self) -> None:
        wanted = self._gzip_wanted_at
        if wanted is None or time.monotonic() - wanted > self.GZIP_IDLE:
            return
        if sum(map(len, self._current[1])) < self.compress_min_bytes:
            return
        with self._gz_lock:
            if self._gz_thread is not None and self._gz_thread.is_alive():
                return          # the running one picks up the newest body when it finishes
            self._gz_thread = threading.Thread(target=self._compress_loop, name="vllm-drift-gzip", daemon=True)
            self._gz_thread.start()

    def _compress_loop(self) -> None:
        while True:
            serial, body = self._current
            gz = gzip_parts(body)
            with self._gz_lock:
                self._gz = (serial, gz)        # the number, not the body: an old body is not kept alive
                if self._current[0] == serial:
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
        return self._current[1] + (self._live()[0],)

    def render(self) -> bytes:
        return b"".join(self.render_parts())

    def render_gzip_parts(self) -> tuple[bytes, bytes] | None:
        """The body gzip-compressed (two gzip members: the cached fleet part, then the live
        process metrics). While the newest body is still being compressed: the previous body's
        gzip if that body was replaced at most GZIP_STALE_MAX seconds ago, else None (the caller
        then sends the newest uncompressed rather than wait)."""
        now = self._gzip_wanted_at = time.monotonic()
        serial, gz = self._current[0], self._gz
        if gz is not None and gz[0] == serial:
            return gz[1], self._live()[1]
        self._compress_later()
        if gz is not None and gz[0] == serial - 1 and now - self._replaced_at <= self.GZIP_STALE_MAX:
            return gz[1], self._live()[1]          # one publish back, while the newest compresses
        return None

    def render_gzip(self) -> bytes | None:
        parts = self.render_gzip_parts()
        return None if parts is None else b"".join(parts)


_REPORT_NAMES = tuple(name for name, _doc, _typ, _labels in REPORT_FAMILIES)
_NO_SIGNATURES = bytes(8 * len(REPORT_FAMILIES))


def _join(name: str, runs: list[list], before: tuple[bytes, np.ndarray] | None, n: int) -> tuple[bytes, np.ndarray]:
    """One report family's text over the targets of `runs` (`CachedExposition._assemble`) and
    where each target's lines start in it: unchanged targets' lines sliced from the text
    `before` (one slice per run), rendered ones as they are."""
    text, offs = before if before is not None else (b"", None)
    view = memoryview(text)
    pieces: list = []
    starts = np.empty(n + 1, dtype=np.int64)
    at = 0
    for run in runs:
        if len(run) == 3:
            a, b, p = run
            seg = offs[a:b + 1]
            lo, hi = int(seg[0]), int(seg[-1])
            if hi > lo:
                pieces.append(view[lo:hi])
            starts[p:p + b - a] = seg[:-1] + (at - lo)
            at += hi - lo
        else:
            lines, p = run
            got = [block.get(name, b"") for block in lines]
            lengths = np.fromiter(map(len, got), dtype=np.int64, count=len(got))
            ends = np.cumsum(lengths)
            starts[p:p + len(got)] = ends - lengths + at
            if len(got):
                at += int(ends[-1])
            pieces.extend(got)
    starts[n] = at
    return b"".join(pieces), starts


def _splice(before: tuple[bytes, np.ndarray], changes: list[tuple[int, bytes]]) -> tuple[bytes, np.ndarray]:
    """One report family's text with the lines of the targets at the positions of `changes`
    (in order) replaced, and where each position's lines start in it."""
    text, offs = before
    view = memoryview(text)
    pieces: list = []
    delta = np.zeros(len(offs), dtype=np.int64)
    at = 0
    for pos, lines in changes:
        lo, hi = int(offs[pos]), int(offs[pos + 1])
        if lo > at:
            pieces.append(view[at:lo])
        pieces.append(lines)
        delta[pos + 1] = len(lines) - (hi - lo)
        at = hi
    if at < len(text):
        pieces.append(view[at:])
    return b"".join(pieces), offs + np.cumsum(delta)


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
