"""Detection quality must not regress: a small run of `benchmarks/detection.py` (every built-in
scenario, two seeds, the daemon's evaluation path in process) against each scenario's ground
truth."""
from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import REPO

BENCH = REPO / "benchmarks" / "detection.py"


def _bench():
    spec = importlib.util.spec_from_file_location("detection_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def result():
    bench = _bench()
    from exporter.sim.scenario import builtin_names
    runs = [bench.run_scenario(name, seed, hints=True) for name in builtin_names() for seed in (11, 12)]
    return bench.score(runs, 5.0, 60.0), runs


def test_precision_and_recall_per_finding(result):
    res, _ = result
    for name, d in res["findings"].items():
        assert d["precision"] is None or d["precision"] >= 0.95, (name, d)
        assert d["recall"] is None or d["recall"] >= 0.95, (name, d)
    assert res["precision"] >= 0.95 and res["recall"] >= 0.95


def test_detection_within_two_intervals_after_the_window_fills(result):
    res, _ = result
    assert res["detect_intervals_after_fill_max"] is not None
    assert res["detect_intervals_after_fill_max"] <= 2.0


def test_healthy_never_alarms(result):
    res, runs = result
    assert res["healthy_false_alarms"] == 0
    assert all(not r.ever for r in runs if r.scenario == "healthy")


def test_without_hints_the_hint_free_findings_still_fire():
    """The outside check gives no hints: the findings that need none must still fire."""
    bench = _bench()
    want = {"kv-pressure": "kv_pressure", "max-num-seqs-too-low": "max_num_seqs",
            "oversized-max-model-len": "max_model_len", "idle-overprovisioned": "idle_capacity",
            "prefix-caching-off": "enable_prefix_caching"}
    for name, finding in want.items():
        run = bench.run_scenario(name, 3, hints=False)
        assert finding in run.reported, (name, run.reported)
    assert not bench.run_scenario("healthy", 3, hints=False).ever
