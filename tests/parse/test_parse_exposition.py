"""The fast exposition reader must give exactly what prometheus_client's parser gives on the
families it selects: on the real vLLM captures and on generated expositions with nasty label
values, NaN/Inf, timestamps, comments, CRLF and no trailing newline."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.errors import ParseError
from exporter.parse.exposition import Reader, parse_exposition

from conftest import SHARED
CAPTURES = sorted((SHARED / "fixtures" / "prom").glob("*.prom"))


def _norm_value(v):
    if isinstance(v, float) and math.isnan(v):
        return ("nan",)
    return (type(v).__name__, v)


def normalise(families) -> list:
    """Comparable form of a family list (ours or prometheus_client's): NaN-aware, int/float
    aware, labels as sorted pairs."""
    return [
        (f.name, f.type, f.documentation,
         [(s[0], sorted(s[1].items()), _norm_value(s[2]), _norm_value(s[3])) for s in f.samples])
        for f in families
    ]


def stock(text: str, prefixes=None) -> list:
    fams = list(text_string_to_metric_families(text))
    return [f for f in fams if prefixes is None or f.name.startswith(tuple(prefixes))]


def captures():
    if not CAPTURES:
        pytest.skip(f"shared captures not found under {SHARED} (../shared next to the repo)")
    return CAPTURES


@pytest.mark.parametrize("prefixes", [None, ("vllm:",), ("process_", "vllm:num_")])
def test_real_captures_identical_to_prometheus_client(prefixes):
    for path in captures():
        payload = path.read_bytes()
        expected = normalise(stock(payload.decode("utf-8"), prefixes))
        assert expected, path.name
        reader = Reader(prefixes)
        assert normalise(reader.parse(payload)) == expected, path.name
        # second pass goes through the warm caches
        assert normalise(reader.parse(payload)) == expected, path.name
        assert normalise(reader.parse(payload.decode("utf-8"))) == expected, path.name


def test_real_capture_family_counts_match_provenance_note():
    # PROVENANCE.md: 67 / 62 / 14 families, 47 / 46 / 14 of them vllm:-prefixed.
    counts = {p.name.split("-")[1]: (len(Reader(None).parse(p.read_bytes())),
                                     len(parse_exposition(p.read_bytes())))
              for p in captures()}
    assert counts == {"0.10.1": (67, 47), "0.11.0": (62, 46), "0.7.0": (14, 14)}


def test_capture_without_trailing_newline_and_partial_histogram():
    by_version = {p.name.split("-")[1]: p for p in captures()}
    raw = by_version["0.10.1"].read_bytes()
    assert not raw.endswith(b"\n")
    fams = {f.name: f for f in parse_exposition(raw)}
    # the last vllm family before http_* is cache_config_info; the last line of the file is http
    assert fams["vllm:cache_config_info"].samples[0].labels["num_gpu_blocks"] == "850"
    partial = {f.name: f for f in parse_exposition(by_version["0.7.0"].read_bytes())}
    it = partial["vllm:iteration_tokens_total"]
    assert it.type == "histogram"
    assert [s.labels["le"] for s in it.samples if s.name.endswith("_bucket")][-1] == "96.0"


# ---------------------------------------------------------------------------------------------
# Generated expositions

NAMES = st.sampled_from(["vllm:a", "vllm:num_requests_running", "vllm:x_total", "vllm:h_seconds",
                         "other", "process_cpu", "vllm:a_created", "vllm:info"])
LABEL_NAMES = st.sampled_from(["model_name", "engine", "le", "a", "_b", "finished_reason", "x1"])
LABEL_VALUES = st.lists(
    st.sampled_from(list('ab ,={}"\\\n#\tZé€\x85\u2028') + ["\\n", "} ", '\\"', "=\"", ",x=\"y\""]),
    max_size=8).map("".join)
VALUES = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "0.0", "1e-05", "-3.5E+2", "17", "+4", "-0",
                     "1.7710424574207425e+09", "nan", "inf", "123456789012345678901234567890"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**6, 10**6).map(str))
TIMESTAMPS = st.one_of(st.none(), st.integers(0, 2 * 10**12).map(str), st.just("-5"))
HELP_TEXT = st.lists(st.sampled_from(list('ab "\\\nx\t{}#é') + ["\\n"]), max_size=20).map("".join)


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def sample_lines(draw, name: str):
    labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3))
    style = draw(st.sampled_from(["plain", "plain", "trailing_comma", "spaced", "tab", "eq_spaces",
                                  "leading_comma", "name_inside", "quoted_name_inside", "exemplar"]))
    pairs = [f'{k}="{_escape_label(v)}"' for k, v in labels.items()]
    if style == "spaced":
        body = ", ".join(pairs)
    elif style == "eq_spaces":
        body = ",".join(f'{k} = "{_escape_label(v)}"' for k, v in labels.items())
    elif style == "leading_comma":
        body = "," + ",".join(pairs)
    else:
        body = ",".join(pairs) + ("," if style == "trailing_comma" and pairs else "")
    if style == "name_inside":
        head = "{" + ",".join([f'__name__="{name}"'] + pairs) + "}"
    elif style == "quoted_name_inside":
        head = "{" + ",".join([f'"{name}"'] + pairs) + "}"
    else:
        head = f"{name}{{{body}}}" if (labels or draw(st.booleans())) else name
    sep = "\t" if style == "tab" and not labels else " "
    value = draw(VALUES)
    ts = draw(TIMESTAMPS)
    line = head + sep + value + (f" {ts}" if ts is not None else "")
    if style == "exemplar":
        line = head + sep + value + ' # {trace_id="abc"} 1.0'
    return line


@st.composite
def expositions(draw):
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        name = draw(NAMES)
        typ = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", None]))
        shown = f'"{name}"' if draw(st.integers(0, 7)) == 0 else name  # quoted (UTF-8 style) name
        if draw(st.booleans()):
            help_text = draw(HELP_TEXT).replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"# HELP {shown} {help_text}")
        if typ is not None:
            lines.append(f"# TYPE {shown} {typ}")
        suffixes = {"histogram": ["_bucket", "_sum", "_count"], "summary": ["", "_sum", "_count"],
                    "counter": ["_total", ""] if not name.endswith("_total") else [""]}.get(typ, [""])
        for _ in range(draw(st.integers(0, 5))):
            lines.append(draw(sample_lines(name + draw(st.sampled_from(suffixes)))))
            if draw(st.integers(0, 9)) == 0:
                lines.append(draw(st.sampled_from(["", "# just a comment", "#", "  ", "# HELP"])))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = eol.join(lines)
    if draw(st.booleans()):
        text += eol
    return text


def _both(text: str, prefixes):
    try:
        expected = normalise(stock(text, prefixes))
    except Exception:  # noqa: BLE001 - any failure of the stock parser
        expected = None
    try:
        got = normalise(Reader(prefixes).parse(text.encode("utf-8")))
    except ParseError:
        got = None
    return expected, got


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=expositions(), prefixes=st.sampled_from([None, ("vllm:",), ("vllm:a",), ("other",)]))
def test_generated_expositions_identical(text, prefixes):
    expected, got = _both(text, prefixes)
    if expected is None:
        # prometheus_client refused the payload; we may only accept it when the bad line lies
        # in a family we were told to skip
        if prefixes is None:
            assert got is None
        return
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(text=expositions())
def test_warm_cache_gives_same_result(text):
    reader = Reader(("vllm:",))
    try:
        first = normalise(reader.parse(text))
    except ParseError:
        return
    assert normalise(reader.parse(text)) == first


@settings(max_examples=300, deadline=None)
@given(text=expositions(), junk=st.text(max_size=15), where=st.integers(0, 50))
def test_inserted_garbage_line_same_verdict_when_all_families_parsed(text, junk, where):
    lines = text.split("\n")
    lines.insert(where % (len(lines) + 1), junk)
    mutated = "\n".join(lines)
    expected, got = _both(mutated, None)
    assert got == expected


# ---------------------------------------------------------------------------------------------
# Errors

def test_malformed_line_names_line_number_and_excerpt():
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:num_requests_running{model_name="m} 2\n')
    with pytest.raises(ParseError, match=r"line 3: .*vllm:num_requests_running\{model_name"):
        parse_exposition(text)


def test_bad_value_and_bad_type():
    with pytest.raises(ParseError, match="line 2"):
        parse_exposition("# TYPE vllm:a gauge\nvllm:a{x=\"1\"} one\n")
    with pytest.raises(ParseError, match="line 1: invalid metric type 'gauges'"):
        parse_exposition("# TYPE vllm:a gauges\nvllm:a 1\n")
    with pytest.raises(ParseError, match="line 1"):
        parse_exposition("# TYPE vllm:a\n")


def test_html_error_page_is_a_parse_error():
    page = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>\n"
    with pytest.raises(ParseError, match="line 1"):
        parse_exposition(page)


def test_non_utf8_payload():
    with pytest.raises(ParseError, match="not UTF-8"):
        parse_exposition(b"vllm:a 1\n\xff\xfe\n")


def test_malformed_lines_in_skipped_families_are_not_read():
    # documented difference: only selected families are validated
    text = "# TYPE python_x gauge\npython_x{a=b} zz\n# TYPE vllm:a gauge\nvllm:a 1\n"
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))
    fams = parse_exposition(text)
    assert [(f.name, f.samples[0].value) for f in fams] == [("vllm:a", 1)]


def test_caches_are_bounded_and_full_caches_do_not_change_results():
    path = captures()[0]
    text = path.read_text(encoding="utf-8")
    model = next(line.split('model_name="')[1].split('"')[0] for line in text.splitlines()
                 if 'model_name="' in line)
    reader = Reader(("vllm:",), max_heads=300, max_labelsets=200, refresh_every=25)
    for i in range(60):
        variant = text.replace(model, f"model-{i}")
        assert normalise(reader.parse(variant)) == normalise(stock(variant, ("vllm:",)))
        sizes = reader.cache_sizes()
        assert sizes["heads"] <= 300 and sizes["labelsets"] <= 200 and sizes["comments"] <= 200


def test_growing_counters_keep_the_value_cache_within_its_cap():
    # a counter's value text never recurs: the cache of value texts is emptied when full
    # (never grows past its cap, whatever the fleet) and results stay the stock parser's,
    # on both the full parse and the replay of a known shape (a keyed target)
    text = captures()[0].read_text(encoding="utf-8")
    reader = Reader(("vllm:",), max_values=64)
    counters = [line for line in text.splitlines() if line.startswith("vllm:") and "_total" in line
                and not line.split()[-1].startswith(("0", "1.0"))]
    assert counters, "a capture with counters past their first value"
    peak = 0
    for i in range(40):
        grown = text
        for line in counters:
            head, value = line.rsplit(" ", 1)
            grown = grown.replace(line, f"{head} {float(value) + 7 * i + 0.5}")
        key = None if i % 2 else "t"
        assert normalise(reader.parse(grown, key)) == normalise(stock(grown, ("vllm:",)))
        peak = max(peak, reader.cache_sizes()["values"])
    assert 0 < peak <= 64


def test_openmetrics_style_input_identical_to_prometheus_client():
    from prometheus_client.openmetrics.exposition import ALLOWUTF8, generate_latest
    from prometheus_client.registry import CollectorRegistry

    for path in captures():
        fams = list(text_string_to_metric_families(path.read_text(encoding="utf-8")))

        class Replay:
            def collect(self):
                return fams

        reg = CollectorRegistry()
        reg.register(Replay())
        om = generate_latest(reg, escaping=ALLOWUTF8).decode()
        for prefixes in (None, ("vllm:",)):
            assert normalise(Reader(prefixes).parse(om)) == normalise(stock(om, prefixes)), path.name


_SHARED_READER = Reader(("vllm:",), max_heads=2000, max_labelsets=2000)


@settings(max_examples=300, deadline=None)
@given(text=expositions())
def test_one_reader_across_many_payloads_stays_identical(text):
    # caches filled by earlier (different) payloads must never leak into later results
    expected, _ = _both(text, ("vllm:",))
    try:
        got = normalise(_SHARED_READER.parse(text))
    except ParseError:
        got = None
    if expected is not None:
        assert got == expected


# A token that may replace the last space-separated token of a line: values, values that read
# differently (ints, signs, timestamps glued on), and garbage that a full parse refuses or that
# changes how a line is read (`{`, quotes, whitespace, nothing).
TOKENS = st.one_of(VALUES, st.sampled_from(["5", "+5", "-0", "1_0", "1e3", "NaN", "+Inf", "abc", "1{",
                                            '"', "}", "", "\t", "1\r", "# x", "0x10", "1 2"]))


def _verdict(reader: Reader, text: str, key: str | None = None):
    try:
        return normalise(reader.parse(text, key))
    except ParseError:
        return "refused"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=expositions(), prefixes=st.sampled_from([None, ("vllm:",), ("vllm:a",)]),
       changes=st.lists(st.tuples(st.integers(0, 60), TOKENS), max_size=6))
def test_a_seen_shape_with_new_values_reads_as_a_full_parse(text, prefixes, changes):
    """The shape cache replays a payload seen before with the new payload's values: whatever
    the new tokens are, the result (or the refusal) is the full parse's."""
    reader = Reader(prefixes)
    if _verdict(reader, text) == "refused":
        return
    lines = text.split("\n")
    for where, token in changes:
        i = where % len(lines)
        head, sep, _ = lines[i].rpartition(" ")
        if sep:
            lines[i] = head + " " + token
    mutated = "\n".join(lines)
    full = _verdict(Reader(prefixes, max_shapes=0), mutated)
    assert _verdict(reader, mutated) == full
    assert _verdict(reader, mutated) == full  # replayed twice
    # keyed: the key's last shape is tried first, as one match of the whole text
    keyed = Reader(prefixes)
    assert _verdict(keyed, text, "t") == _verdict(Reader(prefixes, max_shapes=0), text)
    assert _verdict(keyed, text, "t") == _verdict(Reader(prefixes, max_shapes=0), text)
    assert _verdict(keyed, mutated, "t") == full
    assert _verdict(keyed, mutated, "t") == full
    assert _verdict(keyed, text, "t") == _verdict(Reader(prefixes, max_shapes=0), text)


def test_real_captures_replayed_with_new_values():
    """A target's next scrape: same lines, counters moved. The replay reads it as a full parse
    does, and a shape is kept per distinct payload shape."""
    reader = Reader(("vllm:",))
    for path in captures():
        text = path.read_text(encoding="utf-8")
        reader.parse(text)
        moved = "\n".join(h + " " + (str(float(t) * 3 + 1) if t.replace(".", "", 1).isdigit() else t)
                          if s else h for h, s, t in (line.rpartition(" ") for line in text.split("\n")))
        assert normalise(reader.parse(moved)) == normalise(Reader(("vllm:",), max_shapes=0).parse(moved)), path.name
        assert normalise(reader.parse(moved)) == normalise(stock(moved, ("vllm:",))), path.name
        # as the daemon reads a target: keyed, so the second scrape is one match of its shape
        keyed = Reader(("vllm:",))
        keyed.parse(text, path.name)
        _, shape, values = keyed.parse_shaped(moved, path.name)
        assert shape is not None and values is not None, path.name
        assert normalise(shape.families(values)) == normalise(stock(moved, ("vllm:",))), path.name
    assert 0 < reader.cache_sizes()["shapes"] <= len(captures())


@pytest.mark.parametrize("token", ["1{", "{", '{a="b"}', "1}", "7"])
def test_replay_of_a_skipped_family_line_reads_its_token_as_a_full_parse(token):
    # a `{` after the name makes the full parse read a skipped family's line (and refuse it)
    text = "# TYPE other_x gauge\nother_x 1\n# TYPE vllm:a gauge\nvllm:a 2\n"
    reader = Reader(("vllm:",))
    reader.parse(text)
    mutated = text.replace("other_x 1", "other_x " + token)
    assert _verdict(reader, mutated) == _verdict(Reader(("vllm:",), max_shapes=0), mutated)
    assert reader.cache_sizes()["shapes"] == 1
    keyed = Reader(("vllm:",))
    keyed.parse(text, "t")
    assert _verdict(keyed, mutated, "t") == _verdict(Reader(("vllm:",), max_shapes=0), mutated)


def test_keyed_hints_are_bounded_and_follow_a_target_that_changes_shape():
    reader = Reader(("vllm:",), max_hints=2)
    one = "# TYPE vllm:a gauge\nvllm:a 1\n"
    two = "# TYPE vllm:a gauge\nvllm:a{x=\"y\"} 1\n"
    reader.parse(one, "t1")
    assert normalise(reader.parse(two, "t1")) == normalise(stock(two, ("vllm:",)))   # the hint misses
    assert normalise(reader.parse(two.replace(" 1", " 3"), "t1")) == normalise(stock(two.replace(" 1", " 3"), ("vllm:",)))
    reader.parse(one, "t2")
    assert reader.cache_sizes()["hints"] == 2
    reader.parse(one, "t3")                  # full: emptied, then this one
    assert reader.cache_sizes()["hints"] == 1


def test_a_huge_shape_is_replayed_without_a_whole_text_pattern():
    """A shape with more values than PATTERN_MAX_GROUPS (an exposition naming thousands of
    models) is not compiled into one regular expression (that took seconds and hundreds of MB):
    its next payload is replayed token by token, with the same result as a full parse."""
    from exporter.parse import exposition
    n = exposition.PATTERN_MAX_GROUPS // 2 + 10
    def body(v: int) -> str:
        lines = ["# TYPE vllm:a gauge"] + [f'vllm:a{{model_name="m{i}"}} {v + i}' for i in range(n)]
        lines += ["# TYPE vllm:b gauge"] + [f'vllm:b{{model_name="m{i}"}} {v}' for i in range(n)]
        return "\n".join(lines) + "\n"
    reader = Reader(("vllm:",))
    reader.parse(body(1), "t")
    again = body(2)
    assert normalise(reader.parse(again, "t")) == normalise(stock(again, ("vllm:",)))
    shapes = list(reader._shapes.values())
    assert shapes and all(s._pattern is None and s._rx is None for s in shapes)
