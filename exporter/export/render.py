"""Text exposition (format 0.0.4) of collected families, byte-for-byte as
`prometheus_client.generate_latest` writes it, several times faster on a fleet's families.

Why: the daemon renders its whole `/metrics` once per publish (every scrape cycle and evaluation);
at 1,000 targets that is ~16,000 samples, and the stock writer formats each sample's label set
afresh (sort, three escapes per value, two function calls per label). Here the `name{labels}`
head of a sample is cached by (name, label items): a fleet's label sets repeat publish after
publish, only values change. Values are formatted as `floatToGoString` does. The cache is
bounded and emptied when full (departed targets do not stay forever). Equality with
`generate_latest` is tested on the daemon's own families and on edge cases.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from typing import Iterable, Iterator

from prometheus_client.utils import floatToGoString

_MAX_HEADS = 200_000
_HEAD_SLACK = 1.25     # heads kept per head a render uses before the cache is emptied
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def go_float(value: float) -> str:
    """`floatToGoString` with a fast path for the common range (no exponent rewrite needed)."""
    d = float(value)
    if -1e6 < d < 1e6:
        if d == d:                         # not NaN
            return repr(d)
    return floatToGoString(d)


def _head(name: str, labels: dict[str, str]) -> str:
    if not _LEGACY_NAME.fullmatch(name) or not all(_LEGACY_NAME.fullmatch(k) for k in labels):
        raise ValueError(f"{name}: only legacy metric and label names are rendered here")
    if not labels:
        return name + " "
    return head_of(name, sorted(labels.items()))


def head_of(name: str, pairs) -> str:
    """`name{k="v",...} ` for label (name, value) pairs already in the text format's (sorted)
    order and legacy names (not checked here)."""
    inner = ",".join([f'{k}="{_escape(v)}"' for k, v in pairs])
    return f"{name}{{{inner}}} "


def head_template(name: str, label_names) -> str:
    """`head_of` as a %-template: `name{k="%s",...} ` for label names already in the text
    format's order, to be filled with `escaped` values (a family's heads, formatted in one step)."""
    inner = ",".join([f'{k}="%s"' for k in label_names])
    return f"{name}{{{inner}}} "


_ESCAPED: dict[str, str] = {}
_MAX_ESCAPED = 100_000


def escaped(value: str) -> str:
    """A label value escaped as `head_of` does, memoised (a fleet's label values repeat on every
    render: target URLs, model names, finding names); the memo is emptied when full."""
    got = _ESCAPED.get(value)
    if got is None:
        got = _escape(value)
        if len(_ESCAPED) >= _MAX_ESCAPED:
            _ESCAPED.clear()
        _ESCAPED[value] = got
    return got


def sample_text(head: str, value: float) -> str:
    """A sample line without timestamp, value formatted as prometheus_client does."""
    return f"{head}{go_float(value)}\n"


class Renderer:
    """Renders collectors' families; keeps the cache of sample heads between calls."""

    __slots__ = ("_heads",)

    def __init__(self) -> None:
        self._heads: dict[tuple, str] = {}

    def cache(self) -> tuple[int, int]:
        """(cap, entries) of the sample-head cache."""
        return _MAX_HEADS, len(self._heads)

    def render(self, metrics: Iterable) -> bytes:
        out: list[str] = []
        for _name, header, lines in self.parts(metrics, split=False):
            out.append(header)
            out.append(lines)
        return "".join(out).encode("utf-8")

    def parts(self, metrics: Iterable, keep=None, *, split: bool = True) -> list[tuple[str, str, str]]:
        """(family name, `# HELP`/`# TYPE` header, sample lines) per family, in order; `keep(labels)`
        selects samples. With `split`, a family with OpenMetrics-only samples (`_created`,
        `_gsum`, `_gcount`, which the text format writes as families of their own) raises
        ValueError: its lines cannot be joined per family from separate parts."""
        heads = self._heads
        if len(heads) > _MAX_HEADS:
            heads.clear()
        result: list[tuple[str, str, str]] = []
        rendered = 0
        for metric in metrics:
            mname, mtype = metric.name, metric.type
            if mtype == "counter":
                mname += "_total"
            elif mtype == "info":
                mname += "_info"
                mtype = "gauge"
            elif mtype == "stateset":
                mtype = "gauge"
            elif mtype == "gaugehistogram":
                mtype = "histogram"
            elif mtype == "unknown":
                mtype = "untyped"
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            header = f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n"
            base = metric.name
            special = (base + "_created", base + "_gsum", base + "_gcount")
            om: dict[str, list[str]] = {}
            out: list[str] = []
            append = out.append
            for s in metric.samples:
                name, labels, value, ts = s[0], s[1], s[2], s[3]
                if keep is not None and not keep(labels):
                    continue
                key = (name, tuple(labels.items()))
                head = heads.get(key)
                if head is None:
                    head = heads[key] = _head(name, labels)
                if ts is None:
                    line = sample_text(head, value)
                else:
                    line = f"{head}{go_float(value)} {int(float(ts) * 1000):d}\n"
                if name in special:
                    if split:
                        raise ValueError(f"{name}: an OpenMetrics-only sample cannot be rendered in parts")
                    om.setdefault(name[len(base):], []).append(line)
                else:
                    append(line)
            for suffix, lines in sorted(om.items()):
                append(f"# HELP {base}{suffix} {doc}\n# TYPE {base}{suffix} gauge\n")
                out.extend(lines)
            result.append((mname, header, "".join(out)))
            rendered += len(metric.samples)
        # heads of series that are gone (targets that left) stay until the cache holds a quarter
        # more than one render needs: a churning fleet's cache then stays near its size instead
        # of growing to _MAX_HEADS (~60 MB) over hours
        if keep is None and len(heads) > _HEAD_SLACK * rendered + 1024:
            heads.clear()
        return result


def coalesced(parts: Iterable[bytes], size: int = 256 * 1024) -> Iterator[bytes]:
    """The concatenation of `parts` in pieces of about `size` bytes (a part that large on its own
    is passed through): a body of tens of thousands of small parts (a target's block each) is
    written and compressed in few large calls, without joining the whole of it."""
    buf: list[bytes] = []
    n = 0
    for part in parts:
        if len(part) >= size:
            if buf:
                yield b"".join(buf)
                buf, n = [], 0
            yield part
            continue
        buf.append(part)
        n += len(part)
        if n >= size:
            yield b"".join(buf)
            buf, n = [], 0
    if buf:
        yield b"".join(buf)


IOV_MAX = 1024      # buffers one sendmsg takes (Linux UIO_MAXIOV; a smaller limit raises OSError)


def send_parts(sock, parts: tuple[bytes, ...], ends: list[int] | None = None) -> None:
    """Write the concatenation of `parts` to a blocking (or timeout) socket with gather writes
    (`sendmsg`, up to IOV_MAX buffers a call): the kernel reads the parts where they are, so a
    body of tens of thousands of small blocks is neither joined nor copied in Python. Where
    the bytes a call took end is found by binary search over the parts' cumulative lengths.
    `ends`: those cumulative lengths when the caller has them. Raises AttributeError or
    NotImplementedError on a socket without sendmsg (TLS)."""
    if ends is None:
        ends = list(accumulate(map(len, parts)))
    total = ends[-1] if ends else 0
    pos = 0
    while pos < total:
        i = bisect_right(ends, pos)          # the part holding byte `pos`
        start = ends[i - 1] if i else 0
        head = parts[i] if pos == start else memoryview(parts[i])[pos - start:]
        pos += sock.sendmsg([head, *parts[i + 1:i + IOV_MAX]])
