"""A window's baselines keep their bucket counts in flat arrays: the summary (rates, quantiles),
the snapshots handed out and the state file are the same as with the parsed tuples."""
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
    assert kept[-1] is snaps[-1]                       # the newest is the parsed object itself
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
