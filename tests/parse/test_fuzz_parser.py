"""Fuzzing the exposition reader and `parse_vllm`: a hostile target controls every byte of its
`/metrics`, so whatever it sends must end in Snapshots or a `ParseError` (the daemon counts that
as a scrape error) -- never another exception, and never a hang.

Inputs: random bytes, random text over the exposition's own alphabet, and real vLLM captures
(../shared/fixtures/prom and tests/fixtures/vllm-cpu) mutated by byte flips, deletions,
duplications, truncation and splicing. Each input is bounded (< 64 KiB), and each parse runs
under a SIGALRM watchdog so a pathological (super-linear) case fails the test instead of
stalling the suite.
"""
from __future__ import annotations

import math
import signal

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from exporter.errors import ParseError
from exporter.parse import parse_vllm
from exporter.parse.exposition import Reader, parse_exposition

from conftest import SHARED, VLLM_CPU

# A parse of < 64 KiB takes milliseconds; seconds mean a super-linear path (a hang in practice).
WATCHDOG_S = 5


def _corpus() -> list[bytes]:
    files = sorted((SHARED / "fixtures" / "prom").glob("*.prom")) + sorted(VLLM_CPU.glob("*.prom"))
    return [p.read_bytes() for p in files]


CORPUS = _corpus()


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"parse did not finish in {WATCHDOG_S}s")


def check_bounded(payload: bytes) -> None:
    """Run the reader and parse_vllm on `payload`: ParseError or a result, within the watchdog."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(WATCHDOG_S)
    try:
        for fn in (lambda: parse_exposition(payload), lambda: parse_exposition(payload, prefixes=None),
                   lambda: Reader(max_heads=8, max_labelsets=8).parse(payload)):
            try:
                fams = fn()
            except ParseError as exc:
                assert isinstance(exc.reason, str) and exc.reason
                continue
            for fam in fams:                      # what it returns is well-formed
                assert isinstance(fam.name, str)
                for s in fam.samples:
                    assert isinstance(s.value, (int, float))
                    assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
        try:
            snaps = parse_vllm(payload, target="http://fuzz:8000", timestamp=1.0)
        except ParseError as exc:
            assert isinstance(exc.reason, str) and exc.reason
        else:
            for snap in snaps:
                assert snap.target == "http://fuzz:8000"
                assert isinstance(snap.model_name, str)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- strategies

ALPHABET = st.sampled_from(list('vllm:_abcdefghijklmnopqrstuvwxyz0123456789{}="\\,. \t\n#+-eE'
                                ) + ["# TYPE ", "# HELP ", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                     "model_name=", "le=", "_bucket", "_sum", "_count", "NaN", "+Inf", "-Inf",
                                     "histogram", "counter", "gauge", "\u2028", "\x00", "\xff", "é", '\\"', "\\n",
                                     "cache_config_info", "engine=\"0\"", "1e308", "9" * 400])

TOKENS = st.lists(ALPHABET, max_size=400).map(lambda xs: "".join(xs).encode("utf-8", "surrogatepass"))


@st.composite
def mutated_capture(draw):
    if not CORPUS:
        return draw(st.binary(max_size=2000))
    src = draw(st.sampled_from(CORPUS))
    # keep mutations cheap: work on a window of the capture (still many whole families)
    start = draw(st.integers(0, max(0, len(src) - 1)))
    start = src.rfind(b"\n", 0, start) + 1
    data = bytearray(src[start:start + draw(st.integers(256, 60_000))])
    for _ in range(draw(st.integers(1, 12))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "delete", "insert", "dup", "truncate", "byte"]))
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[i] = draw(st.sampled_from(b'{}",=\\\n #\x00\xff\t+-.e'))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 64))]
        elif op == "insert":
            data[i:i] = draw(st.sampled_from([b'"', b"{", b"}", b"\\", b"\n", b"# TYPE x histogram\n", b" NaN",
                                              b'{le="+Inf"}', b"\xc3", b"\xe2\x80\xa8", b"vllm:", b"=" * 50]))
        elif op == "dup":
            j = draw(st.integers(i, min(len(data), i + 2000)))
            data[j:j] = data[i:j]
        elif op == "truncate":
            del data[i:]
    if CORPUS and draw(st.booleans()):           # splice with another capture
        other = draw(st.sampled_from(CORPUS))
        k = draw(st.integers(0, len(other)))
        data += other[k:k + 4000]
    return bytes(data[:64 * 1024])


def fuzz(n: int):
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@fuzz(300)
@given(st.binary(max_size=4096))
def test_random_bytes(payload):
    check_bounded(payload)


@fuzz(400)
@given(TOKENS)
def test_random_exposition_like_text(payload):
    check_bounded(payload)


@fuzz(300)
@given(mutated_capture())
def test_mutated_real_captures(payload):
    check_bounded(payload)


def test_corpus_present_and_parses():
    """The seeds are real captures and parse cleanly unmutated (else mutating them proves little)."""
    if not CORPUS:
        pytest.skip(f"no captures under {SHARED / 'fixtures' / 'prom'} or tests/fixtures/vllm-cpu")
    for blob in CORPUS:
        snaps = parse_vllm(blob, target="http://seed:8000", timestamp=1.0)
        assert snaps and all(s.model_name for s in snaps)


@pytest.mark.parametrize("payload", [
    b"vllm:x{" + b'a="' * 20000 + b"\n",                                   # unclosed quotes, long
    b"vllm:x{" + b"a=\"\\\\\"," * 5000 + b"} 1\n",                          # escapes everywhere
    b"# TYPE vllm:h histogram\n" + b'vllm:h_bucket{le="1"} 1\n' * 5000,    # duplicate buckets
    b"# TYPE vllm:h histogram\n" + b"".join(b'vllm:h_bucket{le="%d"} %d\n' % (i, 5000 - i) for i in range(5000)),
    b"vllm:num_requests_running " + b"9" * 50000 + b"\n",                  # a 50 kB number
    b"vllm:num_requests_running NaN\nvllm:num_requests_running +Inf\n",
    b"\n" * 60000,
    b"#" * 60000,
    b"vllm:num_requests_running{model_name=\"m\"} 1 " + b"1" * 30000 + b"\n",
    b"\xef\xbb\xbf# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n",
])
def test_pathological_shapes(payload):
    check_bounded(payload)


def test_watchdog_itself_fires():
    """The hang guard is real: a deliberately slow call is interrupted, not waited out."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(1)
    try:
        with pytest.raises(_Hang):
            while True:
                math.factorial(2000)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
