"""A window's baselines keep their histograms packed in one flat array each: the summary (rates,
quantiles), the snapshots handed out and the state file are the same as with the parsed tuples."""
from __future__ import annotations

import dataclasses
from array import array

from exporter.window import Window, window_from_dict, window_to_dict

from test_window import snap


def scrapes(n: int):
    return [snap(1000.0 + 15 * i, prompt=100.0 * i, gen=900.0 * i, finished={"stop": 3.0 * i, "length": 1.0 * i},
                 ttft=(1.0 * i, 2.0 * i, 3.0 * i, 4.0 * i), running=float(i % 5), kv=0.1 * (i % 7), steps=50.0 * i)
            for i in range(n)]


def test_compact_baselines_give_the_same_summary_and_state():
    snaps = scrapes(41)
    w = Window(600)
    for s in snaps:
        w.observe(s)
    kept = w.snapshots()
    baselines = kept[:-1]
    assert baselines and all(type(h.counts) is array for s in baselines for h in s.histograms.values())
    from exporter.window.window import PackedHistograms
    assert all(type(s.histograms) is PackedHistograms for s in baselines)
    assert len({id(s.histograms._layout) for s in baselines}) == 1      # one layout shared by all
    assert kept[-1] is snaps[-1]                       # the newest is the parsed object itself
    from exporter.window.window import PackedValues   # counters and gauges packed alike
    assert all(type(s.counters) is PackedValues and type(s.gauges) is PackedValues for s in baselines)
    b, o = baselines[0], {s.timestamp: s for s in snaps}[baselines[0].timestamp]
    for packed, parsed in ((b.counters, o.counters), (b.gauges, o.gauges), (b.histograms, None)):
        assert packed.get("no_such_key") is None and packed.get("no_such_key", 7.0) == 7.0
        assert "no_such_key" not in packed
        if parsed is not None:
            assert dict(packed) == parsed and list(packed) == list(parsed)
            assert all(packed.get(k) == v and k in packed for k, v in parsed.items())
    # the same summary as a window whose snapshots are never compacted: rebuild the baseline
    # from the parsed snapshot with the same timestamp
    original = {s.timestamp: s for s in snaps}
    for s in baselines:
        o = original[s.timestamp]
        assert dataclasses.replace(s, histograms=o.histograms) == o
        assert {k: (tuple(h.counts), h.bounds, h.sum, h.count) for k, h in s.histograms.items()} == \
            {k: (h.counts, h.bounds, h.sum, h.count) for k, h in o.histograms.items()}
    summary = w.summary(snaps[-1].timestamp)
    assert summary.ttft is not None and summary.ttft.count > 0 and summary.requests_per_s > 0
    again = window_from_dict(window_to_dict(w), 600).summary(snaps[-1].timestamp)   # arrays serialise
    assert (again.ttft, again.requests_per_s, again.tokens_per_step) == (summary.ttft, summary.requests_per_s,
                                                                        summary.tokens_per_step)


def test_baselines_keep_only_the_histograms_they_are_differenced_for():
    """A real vLLM capture parses prefill/decode/inference-time histograms too; a baseline keeps
    only the ones the window differences, and the summary over a real pair is unchanged."""
    from conftest import VLLM_CPU
    from exporter.parse.canonical import parse_vllm
    from exporter.window.window import BASELINE_HISTOGRAMS
    a = (VLLM_CPU / "vllm-0.32.0-cpu-load-a.prom").read_bytes()
    b = (VLLM_CPU / "vllm-0.32.0-cpu-load-b.prom").read_bytes()
    [first] = parse_vllm(a, target="t", timestamp=1000.0)
    [last] = parse_vllm(b, target="t", timestamp=1060.0)
    dropped = set(first.histograms) - BASELINE_HISTOGRAMS
    assert dropped >= {"prefill_time_seconds", "decode_time_seconds"}     # the capture has them
    w = Window(600)
    w.observe(first)
    w.observe(last)
    base, newest = w.snapshots()
    assert set(base.histograms) == set(first.histograms) & BASELINE_HISTOGRAMS
    assert newest is last and dropped <= set(newest.histograms)
    from exporter.window.window import _deltas     # the summary from the parsed pair itself
    want = _deltas(first, last, 60.0)
    got = w.summary(1060.0)
    for k in ("ttft", "itl", "tpot", "e2e", "queue_time", "prompt_len", "generation_len", "tokens_per_step",
              "requests_per_s", "max_tokens_top"):
        assert getattr(got, k) == want[k], k
