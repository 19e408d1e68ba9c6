"""`Histogram.quantile` against Prometheus' `histogram_quantile` rules, written out longhand
(bucket counts made monotonic, the first bucket reaching rank q x total, linear interpolation,
the highest finite bound when the rank lands in +Inf), over random and torn histograms."""
from __future__ import annotations

import math
import random

import pytest

from exporter.parse.snapshot import Histogram


def longhand(bounds, counts, q):
    fixed, top = [], -math.inf
    for c in counts:
        top = max(top, c)
        fixed.append(top)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in zip(bounds, fixed):
        if c >= rank:
            if math.isinf(b):
                return prev_b
            if c == prev_c:
                return b
            if prev_b == 0.0 and b <= 0:
                return b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
        prev_b, prev_c = b, c
    return prev_b


@pytest.mark.parametrize("seed", range(40))
def test_quantile_matches_the_longhand_rules(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    bounds = tuple(sorted(rng.sample(range(1, 10_000), n))) + (math.inf,)
    per = [rng.choice((0, 0, rng.randint(0, 50))) for _ in bounds]
    counts = []
    for c in per:
        counts.append((counts[-1] if counts else 0) + c)
    if seed % 3 == 0 and len(counts) > 2:        # a torn scrape: one bucket below its neighbour
        j = rng.randrange(1, len(counts) - 1)
        counts[j] = max(0, counts[j - 1] - rng.randint(1, 5))
    h = Histogram(bounds, tuple(float(c) for c in counts))
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
        assert h.quantile(q) == pytest.approx(longhand(bounds, counts, q)) if counts[-1] else h.quantile(q) is None


def test_quantile_edges():
    h = Histogram((1.0, 2.0, math.inf), (0.0, 4.0, 10.0))
    assert h.quantile(0.5) == 2.0              # rank 5 falls in +Inf: the highest finite bound
    assert h.quantile(0.2) == pytest.approx(1.5)
    assert Histogram((1.0, math.inf), (0.0, 0.0)).quantile(0.5) is None
    assert Histogram((1.0, 2.0, math.inf), (3.0, 1.0, 4.0)).quantile(0.5) == pytest.approx(2 / 3)
