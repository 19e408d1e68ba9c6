"""The fast exposition writer gives exactly `prometheus_client.generate_latest`'s bytes: on the
daemon's families built from a real capture's evaluation, and on edge values and labels."""
from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, SummaryMetricFamily)

from exporter.config import Config, TargetSpec
from exporter.export.collector import FleetCollector, FleetView, TargetView
from exporter.export.render import Renderer
from exporter.parse import parse_vllm
from exporter.pipeline import Pipelines


class Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return list(self.families)


def same(families) -> bool:
    r = Renderer()
    want = generate_latest(Fixed(families))
    return r.render(families) == want and r.render(families) == want    # cold, then cached heads


def test_daemon_families_from_real_captures(captures):
    fleet = Pipelines(Config())
    views = []
    for i, (name, body) in enumerate(sorted(captures.items())):
        url = f"http://10.0.0.{i}:8000"
        snaps = parse_vllm(body, target=url, timestamp=1000.0)
        reports = []
        for snap in snaps:
            pipe = fleet.pipeline(TargetSpec(url=url, gpu="H100"), snap.model_name, window_s=600.0)
            pipe.observe(snap)
            pipe.observe(dataclasses.replace(snap, timestamp=1060.0))
            reports.append(pipe.evaluate(None, 1060.0))
        views.append(TargetView(url, "static", True, 0.01, 1060.0, {"timeout": 2.0, "parse": 1.0}, "0.10.1",
                                {s.model_name: s.engine_era for s in snaps}, tuple(reports)))
    views.append(TargetView('http://x:1/"quoted"\\path\nnl', "file_sd", False, None, None, {}, None, {}, ()))
    collector = FleetCollector()
    collector.view = FleetView(tuple(views), 1060.0, 0.2, 1.0, 2.0, 900.0, {"kubernetes": 3.0}, 0.5, 7.0, {}, True)
    families = list(collector.collect())
    assert sum(len(f.samples) for f in families) > 50
    assert same(families)


def test_edge_values_types_and_escapes():
    g = GaugeMetricFamily("g", 'doc with \\ and\nnewline', labels=["a", "b"])
    for i, v in enumerate([0.0, -0.0, 1, 1.5, 999999.0, 1e6, 1234567.0, 1e15, 1e16, 1e22, -1e7, 2.5e-9,
                           math.inf, -math.inf, math.nan, 123456789012.0]):
        g.add_metric([f"v{i}", 'x"y\\z\nw'], v)
    c = CounterMetricFamily("c", "a counter", labels=["k"], created=12.5)
    c.add_metric(["1"], 3.0, created=1700000000.25)
    c.add_metric(["2"], 4.0, timestamp=1700000000.123)
    h = HistogramMetricFamily("h", "hist", labels=["m"])
    h.add_metric(["x"], buckets=[("0.5", 1.0), ("+Inf", 3.0)], sum_value=2.25)
    s = SummaryMetricFamily("s", "sum", count_value=3, sum_value=1.5)
    info = InfoMetricFamily("build", "info", labels=["version"])
    info.add_metric(["1.2"], {"commit": "abc"})
    empty = GaugeMetricFamily("empty", "no samples")
    assert same([g, c, h, s, info, empty])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=12), st.floats(allow_nan=True, allow_infinity=True)), min_size=0, max_size=8))
def test_any_label_value_and_float(rows):
    g = GaugeMetricFamily("vllm_drift_x", "x", labels=["target"])
    for label, value in rows:
        g.add_metric([label], value)
    assert same([g])


def test_send_parts_gathers_every_byte_through_partial_writes():
    """`send_parts` over a real socket pair with a small send buffer (many partial sendmsg
    calls, some ending inside a part): the reader gets exactly the concatenation, including
    empty parts, parts larger than the buffer and more parts than one sendmsg takes."""
    import random
    import socket
    import threading

    from exporter.export.render import IOV_MAX, send_parts

    rng = random.Random(7)
    parts = tuple(bytes([rng.randrange(256)]) * rng.choice((0, 1, 7, 300, 5000, 70_000))
                  for _ in range(3 * IOV_MAX + 17))
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.settimeout(10)
    got = bytearray()

    def read():
        while chunk := b.recv(1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        send_parts(a, parts)
    finally:
        a.close()
        reader.join(10)
        b.close()
    assert bytes(got) == b"".join(parts) and len(got) > 1_000_000
    c, d = socket.socketpair()
    send_parts(c, ())                      # nothing to send: no call, no error
    c.close(), d.close()


def test_head_cache_follows_a_churning_fleet():
    """Heads of series that left are dropped once the cache holds a quarter more than a render
    needs: rendering ever-new targets keeps it near the fleet's size, not growing to its cap."""
    from exporter.export.render import _HEAD_SLACK

    r = Renderer()

    def fleet(start: int, n: int = 2000):
        g = GaugeMetricFamily("vllm_drift_target_up", "Up.", labels=["target"])
        for i in range(start, start + n):
            g.add_metric([f"http://10.0.{i // 250}.{i % 250}:8000"], 1.0)
        return [g]

    first = r.render(fleet(0))
    assert r.cache()[1] == 2000
    sizes = []
    for k in range(1, 40):                       # 5 % of the fleet replaced per render
        body = r.render(fleet(100 * k))
        sizes.append(r.cache()[1])
        assert body.count(b"\n") == 2000 + 2
    assert max(sizes) <= _HEAD_SLACK * 2000 + 1024 and 0 in sizes          # emptied, then refilled
    assert all(s == 0 or s >= 2000 for s in sizes)
    assert r.render(fleet(0)) == first           # what it renders never depends on the cache
