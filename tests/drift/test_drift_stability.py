"""Stable findings: raised after a minimum duration, held in a hysteresis band, cleared when the
cause goes, held through insufficient data, reset by a config change; state survives a restart
through the state file, and a corrupt or old file is set aside without stopping anything."""
from __future__ import annotations

import json
import os

from exporter.drift.state import STATE_VERSION, StateStore
from exporter.drift.stability import Tracker
from exporter.report import Finding


def kv(score: float, sev: str = "warning") -> Finding:
    return Finding("kv_pressure", sev, score, explanation=f"score {score}")


def names(fs, severity=("warning", "critical")):
    return [f.finding for f in fs if f.severity in severity]


def test_raised_only_after_two_evaluations_then_held_then_cleared():
    t = Tracker()
    assert names(t.update([kv(0.05)], 0)) == []          # pending: exported as info
    out = t.update([kv(0.05)], 5)
    assert names(out) == ["kv_pressure"] and out[0].since == 5
    # inside the hysteresis band (>= half the warning threshold, rule says info): still active
    out = t.update([kv(0.012, "info")], 10)
    assert names(out) == ["kv_pressure"] and out[0].severity == "warning"
    # cause gone: one evaluation below is not enough, two clear it
    assert names(t.update([], 15)) == ["kv_pressure"]
    assert names(t.update([], 20)) == []
    assert t.active() == []


def test_a_single_spike_does_not_raise_and_flapping_does_not_clear():
    t = Tracker()
    for i, s in enumerate([0.05, 0.0, 0.05, 0.0, 0.05]):
        out = t.update([kv(s)] if s else [], i * 5)
        assert names(out) == []
    t2 = Tracker()
    t2.update([kv(0.05)], 0)
    t2.update([kv(0.05)], 5)
    for i, s in enumerate([0.0, 0.05, 0.0, 0.05]):
        assert names(t2.update([kv(s)] if s else [], 10 + 5 * i)) == ["kv_pressure"]


def test_upgrade_to_critical_needs_confirmation():
    t = Tracker()
    t.update([kv(0.05)], 0)
    t.update([kv(0.05)], 5)
    assert t.update([kv(0.5, "critical")], 10)[0].severity == "warning"
    assert t.update([kv(0.5, "critical")], 15)[0].severity == "critical"


def test_insufficient_data_holds_then_clears_after_a_window():
    t = Tracker()
    t.update([kv(0.05)], 0)
    t.update([kv(0.05)], 5)
    assert names(t.hold(10, window_s=60)) == ["kv_pressure"]
    assert names(t.hold(40, window_s=60)) == ["kv_pressure"]
    assert t.hold(71, window_s=60) == []


def test_config_change_is_an_event_and_drops_setting_findings():
    t = Tracker()
    cfg = {"num_gpu_blocks": "1000", "gpu_memory_utilization": "0.5"}
    assert t.observe_config(cfg, 0) is None
    gmu = Finding("gpu_memory_utilization", "warning", 0.1, parameter="gpu_memory_utilization")
    t.update([kv(0.05), gmu], 0)
    t.update([kv(0.05), gmu], 5)
    assert sorted(names(t.active())) == ["gpu_memory_utilization", "kv_pressure"]
    ev = t.observe_config({"num_gpu_blocks": "1900", "gpu_memory_utilization": "0.9"}, 10)
    assert ev["changed"]["gpu_memory_utilization"] == ["0.5", "0.9"]
    assert names(t.active()) == ["kv_pressure"] and t.events == [ev]


def test_tracker_round_trips_through_the_state_file(tmp_path):
    t = Tracker()
    t.update([kv(0.05)], 0)
    t.update([kv(0.05)], 5)
    t.observe_config({"num_gpu_blocks": "1000"}, 5)
    store = StateStore(tmp_path)
    assert store.save({"trackers": {"a|m": t.to_dict()}})
    again = StateStore(tmp_path).load()
    t2 = Tracker.from_dict(again["trackers"]["a|m"])
    assert [(f.finding, f.severity, f.since) for f in t2.active()] == [("kv_pressure", "warning", 5)]
    # the restored tracker keeps holding and clearing like the original
    assert names(t2.update([], 10)) == ["kv_pressure"] and names(t2.update([], 15)) == []
    assert [p.name for p in tmp_path.iterdir()] == ["drift-state.json"]   # no temp file left


def test_corrupt_and_old_files_are_set_aside_and_counted(tmp_path):
    path = tmp_path / "drift-state.json"
    path.write_bytes(b'{"format": "vllm-drift-state", "version": 1, "state": {tru')
    store = StateStore(tmp_path, clock=lambda: 1234)
    assert store.load() is None
    assert store.errors == {"load": 1.0}
    assert (tmp_path / "drift-state.json.corrupt-1234").exists() and not path.exists()
    path.write_text(json.dumps({"format": "vllm-drift-state", "version": STATE_VERSION + 1, "state": {}}))
    store.clock = lambda: 1300
    assert store.load() is None and store.errors["load"] == 2.0
    assert (tmp_path / "drift-state.json.corrupt-1300").exists()
    assert store.load() is None and store.errors["load"] == 2.0   # absent file: not an error


def test_unwritable_state_dir_is_counted_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = StateStore(blocker / "sub")          # a directory under a regular file cannot exist
    assert store.save({"a": 1}) is False and store.errors == {"save": 1.0}


def test_save_replaces_atomically(tmp_path):
    store = StateStore(tmp_path)
    store.save({"n": 1})
    before = os.stat(tmp_path / "drift-state.json").st_ino
    store.save({"n": 2})
    assert store.load() == {"n": 2}
    assert os.stat(tmp_path / "drift-state.json").st_ino != before   # a new file renamed over


def test_streamed_state_is_written_entry_by_entry_and_a_stopped_save_changes_nothing(tmp_path):
    """Windows are written one document at a time (made only when written); the file reads as
    the plain document would. A save stopped between steps (a cancelled spread save) leaves
    the previous file and no temp file."""
    from exporter.drift.state import Streamed
    store = StateStore(tmp_path)
    assert store.save({"n": 0})
    made = []

    def windows(n):
        for i in range(n):
            made.append(i)
            yield f"http://t{i}|m", {"snapshots": [[i, 1.5, float("inf")]]}
    plain = {"evaluator": {"a": 1}, "windows": dict(windows(450)), "calibration": {}}
    made.clear()
    steps = store.saving({"evaluator": {"a": 1}, "windows": Streamed(windows(450)), "calibration": {}}, step=200)
    next(steps)
    assert made == list(range(200))            # lazily: 200 windows made, then a pause
    steps.close()                              # stopped there
    assert store.last_result is False and store.load() == {"n": 0}
    assert [p.name for p in tmp_path.iterdir()] == ["drift-state.json"]
    assert store.save({"evaluator": {"a": 1}, "windows": Streamed(windows(450)), "calibration": {}})
    assert store.load() == json.loads(json.dumps(plain))
    assert [p.name for p in tmp_path.iterdir()] == ["drift-state.json"]


def test_random_sequences_respect_minimum_durations():
    """Whatever the raw scores do: an alarm needs two consecutive raw alarms first, and once the
    rule stops firing the alarm is gone within two evaluations."""
    import random
    rng = random.Random(3)
    for _ in range(200):
        t = Tracker()
        raw_loud = []
        silent_run = 0
        for i in range(40):
            roll = rng.random()
            if roll < 0.3:
                raw = []
            elif roll < 0.5:
                raw = [kv(0.012, "info")]
            elif roll < 0.8:
                raw = [kv(0.05)]
            else:
                raw = [kv(0.5, "critical")]
            raw_loud.append(bool(raw) and raw[0].severity != "info")
            silent_run = silent_run + 1 if not raw else 0
            out = names(t.update(raw, i * 5.0))
            if out:
                assert any(raw_loud[j] and raw_loud[j - 1] for j in range(1, i + 1)), raw_loud
            if silent_run >= 2:
                assert out == []


def test_state_of_departed_targets_is_forgotten_after_six_windows():
    """A target not evaluated for 6 windows (it left discovery) loses its finding state; one
    still evaluated keeps it. In windows, so a compressed soak reaches the steady state a
    production fleet reaches after an hour (6 x the default 10 min)."""
    from exporter.config import Config, EvaluationConfig
    from exporter.drift.engine import DriftEngine

    eng = DriftEngine(Config(evaluation=EvaluationConfig(window=100.0)))
    eng.tracker("http://gone:1", "m", now=1000.0)
    for t in range(1000, 1600, 20):
        eng.tracker("http://here:1", "m", now=float(t))
    assert set(eng.trackers) == {"http://gone:1|m", "http://here:1|m"}
    eng.tracker("http://here:1", "m", now=1620.0)         # 620 s > 6 windows since "gone" was seen
    assert set(eng.trackers) == {"http://here:1|m"} and "http://gone:1|m" not in eng.seen
    assert DriftEngine(Config()).PRUNE_WINDOWS * Config().evaluation.window == 3600.0
