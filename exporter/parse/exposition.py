"""A fast reader for the Prometheus text exposition format (0.0.4), for the families we use.

Why not `prometheus_client.parser`: it walks every character of every line in Python (about
5 ms for one vLLM payload), and a fleet daemon reads hundreds of payloads per cycle. This reader
gives the *same result* as `prometheus_client.parser.text_string_to_metric_families` on the
families it is asked for (a property test over generated expositions and the real captures
proves it), but

* it only parses the samples of selected families (`prefixes`): lines of other families are
  skipped after reading their metric name, so malformed lines *there* are not detected;
* a sample line in the canonical form `name{a="b",...} value [timestamp]` takes a regular
  expression fast path; anything unusual (spaces around `=`, quoted names, leading commas,
  exemplars, ...) falls back to a slow path that follows prometheus_client's own rules;
* the `name{labels}` head of each sample line and each label set are cached (bounded) per
  `Reader`: a daemon reads the same series from the same target every cycle, so on the second
  scrape a line costs a dict lookup plus `float()`. Cached label dicts are shared between
  results: treat them as read-only.
* a payload whose *shape* was seen before (every line the same but for sample values, which is
  what a target sends scrape after scrape) is not parsed line by line again: the shape's
  result is replayed with the new values (`_Shape`). The shape is the text of every line up to
  its last space; what the values may be is checked (anything a full parse would read
  differently falls back to it), so the result is the same as a full parse - tested by
  mutating the values of parsed payloads, garbage included. Shapes are cached per `Reader`
  (at most `max_shapes`, dropped with the other caches).
* bytes or str: bytes are decoded once (about 2 us for a 50 KB payload) and parsed as str;
  label values must end up as str anyway, and str keys make the caches one lookup per line
  (`benchmarks/parse_speed.py` shows both inputs).

Errors: a malformed line in a selected family fails the whole payload with `ParseError` naming
the line number and an excerpt, as prometheus_client does. Skipping bad lines would silently
drop a counter or a bucket, and a missing series later reads as a reset or a zero rate; a
failed scrape is visible (`vllm_drift_scrape_errors_total{reason="parse"}`) and the daemon keeps
its previous state.
"""
from __future__ import annotations

import re
import sys
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from exporter.errors import ParseError

__all__ = ["Sample", "Family", "Reader", "parse_exposition", "decode_payload", "picker"]


class Sample(NamedTuple):
    """One exposition sample, field for field as prometheus_client's `Sample` (first 4 fields)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class Family:
    """One metric family as prometheus_client groups it: counters lose `_total` from the family
    name (their samples keep it), `untyped` reads `unknown`."""

    name: str
    type: str
    documentation: str
    samples: list[Sample] = field(default_factory=list)


_METRIC_TYPES = frozenset(
    ("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"))
_ALLOWED_SUFFIXES = {
    "counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_WS = " \t\n\r\x0b\x0c"  # string.whitespace: what prometheus_client splits comment lines on
_W = r"[ \t\n\r\x0b\x0c]"
_NW = r"[^ \t\n\r\x0b\x0c]"
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_NAME_FULL = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# `name{a="v",b="v"}`: label names that are not reserved (`__x`), values with escapes.
_LABEL = r'(?!__)[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*(?:\\.[^"\\]*)*"'
_LABELS_FULL = re.compile(r"(?:%s(?:,%s)*,?)?\Z" % (_LABEL, _LABEL), re.S)
_LABEL_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*(?:\\.[^"\\]*)*)"', re.S)
# A comment line without quotes: first token, then up to two more, then the rest.
_COMMENT = re.compile(r"(%s+)(?:%s+(%s+)(?:%s+(%s+)(?:%s+(.*))?)?)?\Z" % (_NW, _W, _NW, _W, _NW, _W), re.S)
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_ESCAPING = re.compile(r'\\[\\n"]')
_HELP_ESCAPING = re.compile(r"\\[\\n]")

_new_sample = tuple.__new__
_FLOAT_START = frozenset("0123456789.")


def _help_unescape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group(0)]


def _unescape(s: str) -> str:
    return _ESCAPING.sub(lambda m: _ESCAPES[m.group(0)], s) if "\\" in s else s


def decode_payload(payload: str | bytes | bytearray | memoryview) -> str:
    """Exposition text from an HTTP body; bytes must be UTF-8 (the format says so)."""
    if isinstance(payload, str):
        return payload
    try:
        return bytes(payload).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"exposition is not UTF-8 (byte {exc.start})") from None


# ---------------------------------------------------------------------------------------------
# Slow path: prometheus_client's rules for unusual lines, re-implemented.

def _escaped(s: str, pos: int) -> bool:
    """Whether s[pos] is preceded by an odd number of backslashes."""
    n = 0
    while pos > n and s[pos - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def _next_unquoted(text: str, chars: str, start: int = 0) -> int:
    in_quotes = False
    for i in range(start, len(text)):
        c = text[i]
        if c == '"' and not _escaped(text, i):
            in_quotes = not in_quotes
        if not in_quotes and c in chars:
            return i
    return -1


def _split_comment_slow(text: str) -> list[str]:
    """Split on unquoted whitespace into at most 4 tokens (the 4th is the rest of the line)."""
    tokens = [""]
    x = 0
    while x < len(text):
        pos = _next_unquoted(text, _WS, x)
        if pos == -1:
            tokens[-1] = text[x:]
            break
        if pos == x:
            x += 1
            continue
        if len(tokens) > 3:
            tokens[-1] = text[x:]
            break
        tokens[-1] = text[x:pos]
        x = pos + 1
        tokens.append("")
    return tokens


def _split_comment(line: str) -> list[str]:
    if '"' in line:
        return _split_comment_slow(line)
    m = _COMMENT.match(line)
    if m is None:  # cannot happen for a stripped line; keep the exact rules anyway
        return _split_comment_slow(line)
    return [g for g in m.groups() if g is not None]


def _unquote(text: str) -> tuple[str, bool]:
    if not text:
        return text, False
    quoted = False
    text = text.strip()
    if text[0] == '"':
        if len(text) == 1 or text[-1] != '"':
            raise ValueError("missing close quote")
        text = text[1:-1]
        quoted = True
    return _unescape(text), quoted


def _parse_labels_slow(inner: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    rest = inner.strip()
    try:
        while rest:
            if rest[0] == ",":
                rest = rest[1:]
                if not rest:
                    break
                if rest[0] == ",":
                    raise ValueError("multiple commas")
            pos = _next_unquoted(rest, "=,}")
            if pos >= 0 and rest[pos] == "=":
                name_term = rest[:pos]
                rest = rest[pos + 1:]
                pos = _next_unquoted(rest, ",}")
            else:
                name_term = "__name__"
            if pos == -1:
                pos = len(rest)
            value_term = rest[:pos].strip()
            rest = rest[pos:].strip()
            if not value_term:
                continue
            name, quoted = _unquote(name_term)
            if not quoted and not _LEGACY_NAME_FULL.match(name):
                raise ValueError("unquoted UTF-8 metric name")
            if value_term[0] != '"':
                raise ValueError("missing quote")
            i = 1
            while i < len(value_term):
                i = value_term.index('"', i)
                if not _escaped(value_term, i):
                    break
                i += 1
            if i + 1 != len(value_term):
                raise ValueError("text after quote")
            value, _ = _unquote(value_term)
            if name != "__name__":
                name.encode("utf-8")
                if name.startswith("__"):
                    raise ValueError("reserved label name")
            if name in labels:
                raise ValueError("duplicate label name")
            labels[name] = value
        return labels
    except ValueError:
        raise ValueError("invalid labels: " + inner) from None


def _number(v: str) -> float:
    if "_" in v:
        raise ValueError(f"invalid value {v!r}")
    if v.isdecimal() or (v[:1] in "+-" and v[1:].isdecimal()):
        try:
            return int(v)
        except ValueError:
            pass
    return float(v)


def _value_and_timestamp(s: str) -> tuple[float, float | None]:
    s = s.lstrip()
    if " " not in s and "\t" not in s:
        v = s.strip()
        if not v:
            return float(s), None
        return _number(v), None
    sep = " " if " " in s else "\t"
    values = [v.strip() for v in s.split(sep) if v.strip()]
    if not values:
        return float(s), None
    value = _number(values[0])
    ts = _number(values[-1]) / 1000 if len(values) > 1 else None
    return value, ts


def _parse_sample_slow(text: str) -> Sample:
    label_start = _next_unquoted(text, "{")
    if label_start == -1 or " # " in text[:label_start]:
        name_end = _next_unquoted(text, " \t")
        name = text[:name_end].strip()
        if not _LEGACY_NAME_FULL.match(name):
            raise ValueError("invalid metric name")
        value, ts = _value_and_timestamp(text[name_end + 1:])
        return Sample(name, {}, value, ts)
    name = text[:label_start].strip()
    label_end = _next_unquoted(text[label_start:], "}") + label_start
    labels = _parse_labels_slow(text[label_start + 1:label_end])
    if not name:
        if "__name__" not in labels:
            raise ValueError("no metric name")
        name = labels.pop("__name__")
    elif "__name__" in labels:
        raise ValueError("metric name given twice")
    value, ts = _value_and_timestamp(text[label_end + 1:])
    return Sample(name, labels, value, ts)


# ---------------------------------------------------------------------------------------------

def _excerpt(line: str, limit: int = 80) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


_IGNORE = ()  # a comment line that changes nothing


class Reader:
    """Parses payloads for one set of wanted family-name prefixes, with bounded caches.

    Caches, keyed by text so one Reader serves every target of a process: sample heads
    `name{labels}` -> (name, labels) (at most `max_heads`, about 450 bytes each), label-set
    texts -> labels (`max_labelsets`, about 400 bytes each), metric names, HELP/TYPE lines and
    value texts (`max_values`, about 130 bytes each: " 0.0" recurs a lot).
    A full cache of series stops taking new entries (no thrashing when a fleet's series
    outnumber it: the label-set cache still serves the rest), and every `refresh_every` calls
    all caches are emptied so series of departed targets do not stay forever. The value cache
    is emptied whenever it fills instead: most value texts are a growing counter's and never
    recur, so a larger cache only fills more slowly (a soak's RSS grew for half an hour while a
    50,000-entry one filled) and what does recur (zeros, constant buckets, `_created` times) is
    back in it within a parse.
    """

    __slots__ = ("prefixes", "names_only", "max_heads", "max_labelsets", "refresh_every", "_calls",
                 "_heads", "_labelsets", "_names", "_comments", "_values", "max_shapes", "_shapes",
                 "max_hints", "_hints", "max_values")

    def __init__(self, prefixes: Iterable[str] | None = ("vllm:",), *, names_only: Iterable[str] = (),
                 max_heads: int = 50_000, max_labelsets: int = 50_000, refresh_every: int = 200_000,
                 max_shapes: int = 128, max_hints: int = 100_000, max_values: int = 8192):
        self.prefixes: tuple[str, ...] | None = tuple(prefixes) if prefixes is not None else None
        # families (by the name on their HELP/TYPE line) returned without their samples: the
        # caller only needs to know they exist
        self.names_only = frozenset(names_only)
        self.max_heads = max_heads
        self.max_labelsets = max_labelsets
        self.max_values = max_values
        self.refresh_every = refresh_every
        self._calls = 0
        self._heads: dict[str, tuple[str, dict[str, str]]] = {}
        self._labelsets: dict[str, dict[str, str] | None] = {}
        self._names: set[str] = set()
        self._comments: dict[str, tuple] = {}
        self._values: dict[str, float] = {}  # value texts after a head: " 0.0" -> 0.0
        self.max_shapes = max_shapes
        self._shapes: dict[tuple[str, ...], _Shape | None] = {}   # line heads -> shape (None: not replayable)
        # caller's key (a target) -> the shape its last payload had: tried first, by one match
        self.max_hints = max_hints
        self._hints: dict[str, _Shape] = {}

    def clear_cache(self) -> None:
        self._shapes.clear()
        self._hints.clear()
        self._heads.clear()
        self._labelsets.clear()
        self._names.clear()
        self._comments.clear()
        self._values.clear()

    def cache_sizes(self) -> dict[str, int]:
        return {"heads": len(self._heads), "labelsets": len(self._labelsets),
                "names": len(self._names), "comments": len(self._comments),
                "values": len(self._values), "shapes": len(self._shapes), "hints": len(self._hints)}

    def _wanted(self, name: str) -> bool:
        return self.prefixes is None or name.startswith(self.prefixes)

    def parse(self, payload: str | bytes | bytearray | memoryview, key: str | None = None) -> list[Family]:
        """Families (in exposition order) whose name starts with one of the prefixes. `key`: as
        in `parse_shaped`."""
        families, shape, values = self.parse_shaped(payload, key)
        return families if families is not None else shape.families(values)

    def parse_shaped(self, payload: str | bytes | bytearray | memoryview, key: str | None = None
                     ) -> tuple[list[Family] | None, "_Shape | None", list | None]:
        """(families, shape, values). `shape` is the payload's shape when it can be replayed
        (else None, and `families` is the parse); `values` its sample values, families in order
        then samples in order. `families` is None when the shape was replayed: callers that keep
        what they derive from a shape's structure in `shape.memo` need only the values;
        `shape.families(values)` builds the families.

        `key` (a target): the shape of the last payload parsed under that key is tried first,
        with one regular-expression match of the whole payload (`_Shape.match`) instead of
        splitting it into lines."""
        text = decode_payload(payload)
        self._calls += 1
        if self._calls >= self.refresh_every:
            self._calls = 0
            self.clear_cache()
        if key is not None:
            hint = self._hints.get(key)
            if hint is not None:
                values = hint.match(text, self._values, self.max_values)
                if values is not None:
                    return None, hint, values
        lines = text.split("\n")
        if not self.max_shapes:
            return self._parse(lines), None, None
        heads, _, tokens = zip(*[line.rpartition(" ") for line in lines])
        shapes = self._shapes
        shape = shapes.get(heads, _IGNORE)
        if shape is not _IGNORE:
            if shape is not None:
                values = shape.values(tokens, self._values, self.max_values)
                if values is not None:
                    self._hint(key, shape)
                    return None, shape, values
            return self._parse(lines), None, None
        record: list[int] = []
        out = self._parse(lines, record)
        shape = None
        if len(shapes) < self.max_shapes:
            shape = shapes[heads] = _Shape.of(out, record, lines, tokens)
        if shape is None:
            return out, None, None
        self._hint(key, shape)
        return out, shape, [s[2] for f in out for s in f.samples]

    def _hint(self, key: str | None, shape: "_Shape") -> None:
        if key is None:
            return
        hints = self._hints
        if key not in hints and len(hints) >= self.max_hints:
            hints.clear()           # departed targets' keys do not stay forever
        hints[key] = shape

    def _comment(self, line: str) -> tuple:
        """(kind, name, text, wanted, full, allowed, skip_brace, skip_blank) for HELP/TYPE lines;
        (kind, "") for a bare `# HELP`; _IGNORE for other comments. Raises ValueError."""
        parts = _split_comment(line)
        if len(parts) < 2:
            return _IGNORE
        kind = parts[1]
        if len(parts) == 2:
            if kind == "TYPE":
                raise ValueError("TYPE line without a type")
            return ("HELP", "", "", False, False, ("",), (), ()) if kind == "HELP" else _IGNORE
        if kind != "TYPE" and kind != "HELP":
            return _IGNORE
        name, quoted = _unquote(parts[2])
        if not quoted and not _LEGACY_NAME_FULL.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if kind == "HELP":
            doc = parts[3] if len(parts) == 4 else ""
            if "\\" in doc:
                doc = _HELP_ESCAPING.sub(_help_unescape, doc)
            allowed: tuple[str, ...] = (name,)
        else:
            if len(parts) < 4:
                raise ValueError("TYPE line without a type")
            doc = parts[3]
            allowed = tuple(sys.intern(name + s) for s in _ALLOWED_SUFFIXES.get(doc, ("",)))
        wanted = bool(name) and self._wanted(name)
        full = wanted and name not in self.names_only
        skip_brace = tuple([a + "{" for a in allowed if a])
        skip_blank = tuple([a + c for a in allowed if a for c in " \t"])
        return (kind, name, doc, wanted, full, allowed, skip_brace, skip_blank)

    def _parse(self, lines: list[str], record: list[int] | None = None) -> list[Family]:
        """Parse the lines. `record` (when given) gets, in order, the 0-based index of each
        sample line kept, and -1 - index of each line skipped as a sample of an unwanted family."""
        heads = self._heads
        comments = self._comments
        values = self._values
        max_values = self.max_values
        new = _new_sample
        out: list[Family] = []
        name = ""
        documentation = ""
        typ = "untyped"
        samples: list[Sample] = []
        allowed: tuple[str, ...] = ()
        skip_brace: tuple[str, ...] = ()
        skip_blank: tuple[str, ...] = ()
        keep = False                        # the current family goes into the result
        full = False                        # ... with its samples
        fam_line = 0
        lineno = 0
        line = ""

        def flush() -> None:
            if not keep or name == "":
                return
            fam_name, fam_samples = name, samples
            if typ == "counter":
                if fam_name.endswith("_total"):
                    fam_name = fam_name[:-6]
                else:
                    fam_samples = [new(Sample, (s[0] + "_total", s[1], s[2], s[3])) for s in samples]
            fam_type = "unknown" if typ == "untyped" else typ
            if fam_type not in _METRIC_TYPES:
                raise ParseError(f"line {fam_line}: invalid metric type {typ!r} for {name!r}")
            out.append(Family(fam_name, fam_type, documentation, fam_samples))

        try:
            for lineno, line in enumerate(lines, 1):
                line = line.strip()
                if not line:
                    continue
                if line[0] != "#":
                    # ---- a sample line
                    sample: Sample | None
                    if full:
                        i = line.rfind("}")
                        hit = heads.get(line[:i + 1]) if i > 0 else None
                        if hit is not None:
                            r = line[i + 1:]
                            v = values.get(r)
                            if v is not None:
                                sample = new(Sample, (hit[0], hit[1], v, None))
                            elif (r[:1] == " " and (f := r[1:])[:1] in _FLOAT_START and " " not in f
                                  and "\t" not in f and "_" not in f and not f.isdecimal()):
                                # " 1.5e+03": a plain non-integer value, prometheus_client's float()
                                v = float(f)
                                if len(values) >= max_values:
                                    values.clear()
                                values[r] = v
                                sample = new(Sample, (hit[0], hit[1], v, None))
                            else:
                                v, ts = _value_and_timestamp(r)
                                if ts is None:
                                    if len(values) >= max_values:
                                        values.clear()
                                    values[r] = v
                                sample = new(Sample, (hit[0], hit[1], v, ts))
                        else:
                            sample = self._sample(line)
                        if sample[0] in allowed:
                            samples.append(sample)
                            if record is not None:
                                record.append(lineno - 1)
                            continue
                    elif line.startswith(skip_brace) or (line.startswith(skip_blank) and "{" not in line):
                        if record is not None:
                            record.append(-lineno)
                        continue  # a sample of a family we skip
                    else:
                        sname = self._sample_name(line)
                        if sname is None:
                            sample = self._sample(line)  # the full rules decide (or raise)
                            if sample[0] in allowed:
                                continue
                        else:
                            sample = self._sample(line) if self._wanted(sname) else None
                    # not a sample of the current family: prometheus_client closes the current
                    # family and yields this sample as an untyped family of its own
                    flush()
                    name, documentation, typ, samples, keep, full = "", "", "untyped", [], False, False
                    allowed = skip_brace = skip_blank = ()
                    if sample is not None and self._wanted(sample[0]):
                        out.append(Family(sample[0], "unknown", "", [sample]))
                        if record is not None:
                            record.append(lineno - 1)
                    continue
                # ---- a comment line
                c = comments.get(line)
                if c is None:
                    c = self._comment(line)
                    if len(comments) < self.max_labelsets:
                        comments[line] = c
                if c is _IGNORE:
                    continue
                kind, candidate, doc, wanted, c_full, c_allowed, c_brace, c_blank = c
                if kind == "HELP":
                    if candidate != name:
                        flush()
                        name, typ, samples, keep, fam_line = candidate, "untyped", [], wanted, lineno
                        full = c_full
                        allowed, skip_brace, skip_blank = c_allowed, c_brace, c_blank
                    documentation = doc
                else:
                    if candidate != name:
                        flush()
                        name, documentation, samples, keep = candidate, "", [], wanted
                        full = c_full
                    typ, fam_line = doc, lineno
                    allowed, skip_brace, skip_blank = c_allowed, c_brace, c_blank
            flush()
        except ParseError:
            raise
        except (ValueError, IndexError) as exc:
            raise ParseError(f"line {lineno}: {exc or 'malformed line'}: {_excerpt(line)}") from None
        return out

    def _sample_name(self, line: str) -> str | None:
        """The metric name of a sample line if it can be read without parsing the line; None
        when only the full (slow) parse can tell."""
        m = _LEGACY_NAME.match(line)
        if m is None:
            return None
        end = m.end()
        if end == len(line):
            return None
        c = line[end]
        if c == "{":
            return m.group()
        if (c == " " or c == "\t") and "{" not in line:
            return m.group()
        return None

    def _sample(self, line: str) -> Sample:
        """Parse one sample line: `name{labels} rest` with a label set seen before or in the
        strict form; else prometheus_client's rules (slow path)."""
        j = line.find("{")
        i = line.rfind("}")
        if 0 < j < i:
            sname = sys.intern(line[:j])  # interned: `in allowed` then compares by identity
            if sname not in self._names:
                if not _LEGACY_NAME_FULL.match(sname):
                    return _parse_sample_slow(line)
                if len(self._names) < self.max_labelsets:
                    self._names.add(sname)
            inner = line[j + 1:i]
            labelsets = self._labelsets
            labels = labelsets.get(inner, _IGNORE)
            if labels is _IGNORE:
                labels = None
                if _LABELS_FULL.match(inner):
                    pairs = _LABEL_PAIRS.findall(inner)
                    labels = {k: (_unescape(v) if "\\" in v else v) for k, v in pairs}
                    if len(labels) != len(pairs):
                        labels = None  # duplicate label: the slow path reports it
                if len(labelsets) < self.max_labelsets:
                    labelsets[inner] = labels
            if labels is not None:
                r = line[i + 1:].lstrip()
                if r and " " not in r and "\t" not in r and "_" not in r and not r.lstrip("+-").isdecimal():
                    value, ts = float(r), None
                else:
                    value, ts = _value_and_timestamp(r)
                if len(self._heads) < self.max_heads:
                    self._heads[line[:i + 1]] = (sname, labels)
                return _new_sample(Sample, (sname, labels, value, ts))
        return _parse_sample_slow(line)


def picker(indices: list[int]):
    """A function picking `indices` out of a sequence, always as a tuple (operator.itemgetter
    gives a bare item for one index)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    if indices:
        i = indices[0]
        return lambda seq: (seq[i],)
    return lambda seq: ()


def _plain_value(token: str) -> float:
    """A sample value as the full parse reads `name{...} token`; ValueError when it is not one."""
    if (token[:1] in _FLOAT_START and "_" not in token and not token.isdecimal()
            and token.strip(_WS) == token):
        return float(token)
    value, ts = _value_and_timestamp(" " + token)
    if ts is not None or not token or token.strip(_WS) != token:
        raise ValueError(token)
    return value


# A shape's whole-text pattern is compiled only up to these sizes (a vLLM server's exposition:
# ~300 values, ~50 KB). Compiling grows with the pattern: one of 40,000 lines (an exposition naming
# 20,000 models, refused after parsing) took 5 s and ~260 MB to compile.
PATTERN_MAX_GROUPS = 4096
PATTERN_MAX_CHARS = 512 * 1024


class _Shape:
    """What a full parse made of a payload, replayable with another payload's sample values.

    Lines are split at their last space into a head and a token. Two payloads have one shape
    when every head is the same. Given that, the full parse does the same thing with every line
    (the head is all it looks at to decide) except where a token matters:
    * sample lines kept: the token is the value (read as the full parse reads it; anything
      else - a timestamp, garbage, whitespace - is not replayed);
    * lines skipped as samples of unwanted families: any token without `{` (with one, the
      skip test reads the line differently);
    * every other line (comments, blank lines, samples read to decide they end a family):
      the token must be the one seen.
    """

    __slots__ = ("layout", "values_of", "skipped_of", "others_of", "others", "memo", "_pattern",
                 "_rx", "_order")

    def __init__(self, layout, values_of, skipped_of, others_of, others, pattern=None, order=None) -> None:
        self.layout = layout            # (name, type, documentation, first, end, ((name, labels) per sample))
        self.values_of = values_of      # tokens -> value tokens of the samples
        self.skipped_of = skipped_of    # tokens -> tokens of skipped lines
        self.others_of = others_of      # tokens -> tokens of every other line
        self.others = others
        self.memo = None                # what the Reader's owner derives from this structure
        self._pattern = pattern         # the shape as one regular expression (compiled when first used)
        self._rx = None
        self._order = order             # value tokens in line order -> in sample order (None: same)

    @classmethod
    def of(cls, out: list[Family], record: list[int], lines: list[str], tokens: tuple[str, ...]) -> "_Shape | None":
        kept = [i for i in record if i >= 0]
        skipped = [-1 - i for i in record if i < 0]
        samples = [s for f in out for s in f.samples]
        if len(kept) != len(samples):
            return None
        for i, s in zip(kept, samples):
            line = lines[i]
            if s[3] is not None or " " not in line or line.strip() != line:
                return None
            try:
                v = _plain_value(tokens[i])
            except ValueError:
                return None
            if not (v == s[2] or (v != v and s[2] != s[2])):
                return None
        if any("{" in tokens[i] for i in skipped):
            return None
        fixed = set(kept).union(skipped)
        others = [i for i in range(len(lines)) if i not in fixed]
        layout, first = [], 0
        for f in out:
            n = len(f.samples)
            layout.append((f.name, f.type, f.documentation, first, first + n, tuple((s[0], s[1]) for s in f.samples)))
            first += n
        others_of = picker(others)
        # the same conditions as one pattern over the whole text: heads literally, a kept line's
        # token captured (no space: the head ends at the line's last space), a skipped line's
        # token without `{`, every other line literally
        kept_set, skipped_set = set(kept), set(skipped)
        parts = []
        for i, line in enumerate(lines):
            if i in kept_set:        # the token with its space: the value cache's key
                parts.append(re.escape(line.rpartition(" ")[0]) + "( [^ \n]*)")
            elif i in skipped_set:
                head = re.escape(line.rpartition(" ")[0] + " ") if " " in line else ""
                parts.append(head + "[^ \n{]*")
            else:
                parts.append(re.escape(line))
        by_line = sorted(range(len(kept)), key=kept.__getitem__)
        order = None if by_line == list(range(len(kept))) else \
            picker(sorted(range(len(kept)), key=by_line.__getitem__))
        pattern = "\n".join(parts)
        if len(kept) > PATTERN_MAX_GROUPS or len(pattern) > PATTERN_MAX_CHARS:
            pattern = None      # too large to compile cheaply: replayed token by token instead
        return cls(tuple(layout), picker(kept), picker(skipped), others_of, others_of(tokens),
                   pattern, order)

    def match(self, text: str, cache: dict[str, float], cap: int) -> list | None:
        """The sample values of `text` if it has this shape (one regular-expression match, no
        split into lines), else None."""
        rx = self._rx
        if rx is None:
            if self._pattern is None:
                return None
            try:
                rx = self._rx = re.compile(self._pattern)
            except (re.error, RecursionError, OverflowError):
                self._pattern = None
                return None
            self._pattern = None
        m = rx.fullmatch(text)
        if m is None:
            return None
        raw = m.groups()
        if self._order is not None:
            raw = self._order(raw)
        return self._read(raw, cache, cap)

    def values(self, tokens: tuple[str, ...], cache: dict[str, float], cap: int) -> list | None:
        """The sample values of a payload of this shape, as a full parse reads them; None when
        a full parse is needed (a token it would read differently)."""
        if self.others_of(tokens) != self.others or "{" in "".join(self.skipped_of(tokens)):
            return None
        return self._read([" " + t for t in self.values_of(tokens)], cache, cap)

    @staticmethod
    def _read(raw, cache: dict[str, float], cap: int) -> list | None:
        """The values of value tokens given with their leading space (" 1.5", the full parse's
        cache key): cached ones by one lookup each, the rest read as the full parse would."""
        values = list(map(cache.get, raw))
        if None in values:
            for k, t in enumerate(raw):
                if values[k] is None:
                    try:
                        values[k] = v = _plain_value(t[1:])
                    except ValueError:
                        return None
                    if len(cache) >= cap:
                        cache.clear()
                    cache[t] = v
        return values

    def families(self, values: list) -> list[Family]:
        new = _new_sample
        return [Family(name, typ, doc, [new(Sample, (h[0], h[1], v, None)) for h, v in zip(heads, values[a:b])])
                for name, typ, doc, a, b, heads in self.layout]


_DEFAULT = Reader()


def parse_exposition(payload: str | bytes | bytearray | memoryview,
                     prefixes: Iterable[str] | None = ("vllm:",)) -> list[Family]:
    """Parse the families whose names start with `prefixes` (all families with None)."""
    if prefixes == ("vllm:",):
        return _DEFAULT.parse(payload)
    return Reader(prefixes).parse(payload)
