"""Detection quality of the drift engine against the simulator's scenarios.

Each built-in scenario (`exporter/sim/scenarios/*.yaml`, with its `ground_truth` and `acceptable`
findings) runs in process over several seeds: the simulated engine advances in sim time (much
faster than wall time), its exposition is rendered and parsed every scrape interval, windowed,
and evaluated by the same pipeline (`exporter.pipeline`) the daemon uses, every evaluation interval. Reported:

- per finding: precision (reports at warning or above that are in the scenario's ground truth or
  acceptable list, over all reports; acceptable ones count for neither side) and recall (ground
  truth findings reported at warning or above by the end of the run);
- time from onset to detection, in evaluation intervals after the window first fills (onset: the
  start for static scenarios; for a phase change the first preemption after it when there is
  one (long generations or a smaller pool take a while to fill the cache), else the change);
- false alarms (warning or above) on `healthy`;
- per scenario, its time to its findings: seconds after serving starts (the demo's settings:
  scrape 2 s, evaluation 5 s, window 60 s, speed 1) until every ground-truth finding has shown
  at warning or above, slowest seed, against the time the scenario promises (`detect_within` in
  its YAML, the demo's countdown); a healthy scenario keeps its promise by staying quiet.

Usage: `python benchmarks/detection.py [--seeds 5] [--hints|--no-hints] [--json]`.
Hints are what an operator puts in the config (GPU and TP of the deployment); the model comes
from the served name. Goals: precision >= 0.95, recall >= 0.95, detection within two evaluation
intervals after the window fills, nothing at warning or above on healthy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable

from exporter.config import Config, EvaluationConfig, ScrapeConfig, TargetSpec
from exporter.logs import configure
from exporter.parse import parse_vllm
from exporter.pipeline import Pipelines, TargetPipeline
from exporter.parse.metadata import Metadata
from exporter.sim.scenario import build, builtin_names, load_scenario

LOUD = ("warning", "critical")


@dataclass
class Run:
    scenario: str
    seed: int
    ground_truth: tuple[str, ...]
    acceptable: tuple[str, ...]
    reported: set[str] = field(default_factory=set)          # warning+ at the end
    ever: set[str] = field(default_factory=set)              # warning+ at any evaluation after onset
    before: set[str] = field(default_factory=set)            # warning+ before a phase change
    first_seen: dict[str, float] = field(default_factory=dict)   # finding -> sim seconds since start
    onset_s: float = 0.0                                     # phase change (0: from the start)
    cause_s: float | None = None                             # first preemption after the phase change
    statuses: list[str] = field(default_factory=list)
    promise_s: float | None = None                           # the scenario's detect_within

    @property
    def found_at(self) -> float | None:
        """Seconds after serving started at which every ground-truth finding had shown (what
        the demo's table calls "found at"); None when one never did."""
        if not self.ground_truth or any(f not in self.first_seen for f in self.ground_truth):
            return None
        return max(self.first_seen[f] for f in self.ground_truth) + self.onset_s


def run_scenario(name: str, seed: int, *, scrape_s: float = 2.0, eval_s: float = 5.0, window_s: float = 60.0,
                 duration_s: float | None = None, hints: bool = True) -> Run:
    sc = load_scenario(name)
    state = build(sc, seed=seed)
    onset = 0.0
    for ph in sc.phases[1:]:
        onset = max(onset, ph.at_s - sc.warmup_s)
    total = duration_s if duration_s is not None else max(onset + window_s + 6 * eval_s,
                                                          (sc.detect_within_s or 0.0) + eval_s)
    cfg = Config(scrape=ScrapeConfig(interval=scrape_s, timeout=min(5.0, scrape_s)),
                 evaluation=EvaluationConfig(interval=eval_s, window=window_s))
    url = f"http://sim/{name}/{seed}"
    spec = TargetSpec(url=f"http://127.0.0.1:1/{name}", gpu=sc.gpu if hints else None,
                      tp=sc.tp if hints else None)
    meta = Metadata(vllm_version=state.version, served_models=(state.model_name,),
                    max_model_len={state.model_name: state.max_model_len},
                    root={state.model_name: sc.model}, fetched_at=0.0)
    fleet = Pipelines(cfg)
    pipes: dict[str, TargetPipeline] = {}
    run = Run(name, seed, tuple(sc.ground_truth), tuple(sc.acceptable), onset_s=onset,
              promise_s=sc.detect_within_s)
    start = state.start_time
    t = 0.0
    next_eval = eval_s
    base_preempt = None
    while t <= total + 1e-9:
        state.engine.advance_to(sc.warmup_s + t)
        if t >= onset and onset > 0:
            # a traffic change takes time to fill the KV cache: the cause starts at the first
            # preemption after the change, not at the change itself
            pre = state.engine.metrics.counters["preemptions"]
            if base_preempt is None:
                base_preempt = pre
            elif run.cause_s is None and pre > base_preempt:
                run.cause_s = t - onset
        for snap in parse_vllm(state.exposition(), target=url, timestamp=start + t):
            if snap.model_name not in pipes:
                pipes[snap.model_name] = fleet.pipeline(spec, snap.model_name, window_s=window_s)
            pipes[snap.model_name].observe(snap)
        if t + 1e-9 >= next_eval:
            next_eval += eval_s
            for pipe in pipes.values():
                rep = pipe.evaluate(meta, start + t)
                run.statuses.append(rep.status)
                loud = {f.finding for f in rep.findings if f.severity in LOUD}
                if t < onset:
                    run.before |= loud
                if t >= onset:
                    for f in loud:
                        run.first_seen.setdefault(f, t - onset)
                    run.ever |= loud
                run.reported = loud
        t = round(t + scrape_s, 6)
    return run


def time_to_finding(runs: Iterable[Run]) -> dict:
    """Per scenario: the promised time (`detect_within`), the slowest seed's time to its
    findings (seconds after serving started, demo settings at speed 1), and whether every seed
    kept the promise. Healthy scenarios keep it when nothing was loud at any evaluation."""
    out: dict[str, dict] = {}
    for r in runs:
        d = out.setdefault(r.scenario, {"promised_s": r.promise_s, "found_at_s": [], "kept": True,
                                        "healthy": not r.ground_truth})
        if r.ground_truth:
            t = r.found_at
            d["found_at_s"].append(t)
            d["kept"] = d["kept"] and t is not None and (r.promise_s is None or t <= r.promise_s)
        else:
            d["kept"] = d["kept"] and not r.ever and not r.before
    for d in out.values():
        ts = d.pop("found_at_s")
        d["found_at_max_s"] = (None if not ts or None in ts else max(ts))
    return out


def score(runs: Iterable[Run], eval_s: float, window_s: float) -> dict:
    per: dict[str, dict[str, float]] = {}
    delays: dict[str, list[float]] = {}
    healthy_alarms = 0
    for r in runs:
        truth, ok = set(r.ground_truth), set(r.ground_truth) | set(r.acceptable)
        for f in r.reported & truth:
            per.setdefault(f, {"tp": 0, "fp": 0, "fn": 0})["tp"] += 1
        for f in r.ever - ok:          # a false alarm at any evaluation counts
            per.setdefault(f, {"tp": 0, "fp": 0, "fn": 0})["fp"] += 1
        for f in r.before:             # before a phase change the server is healthy
            per.setdefault(f, {"tp": 0, "fp": 0, "fn": 0})["fp"] += 1
        for f in truth - r.reported:
            per.setdefault(f, {"tp": 0, "fp": 0, "fn": 0})["fn"] += 1
        for f in truth:
            if f in r.first_seen:
                # evaluation intervals after the window first filled (cause onset + window)
                start = r.cause_s if r.cause_s is not None else 0.0
                delays.setdefault(f, []).append((r.first_seen[f] - start - window_s) / eval_s)
        if not r.ground_truth and r.ever:
            healthy_alarms += 1
    out = {"findings": {}, "healthy_false_alarms": healthy_alarms}
    tp = fp = fn = 0
    for f, d in sorted(per.items()):
        p = d["tp"] / (d["tp"] + d["fp"]) if d["tp"] + d["fp"] else None
        rc = d["tp"] / (d["tp"] + d["fn"]) if d["tp"] + d["fn"] else None
        ds = sorted(delays.get(f, []))
        out["findings"][f] = {**d, "precision": p, "recall": rc,
                              "detect_intervals_after_fill_max": ds[-1] if ds else None,
                              "detect_intervals_after_fill_median": ds[len(ds) // 2] if ds else None}
        tp, fp, fn = tp + d["tp"], fp + d["fp"], fn + d["fn"]
    out["time_to_finding"] = time_to_finding(runs)
    out["precision"] = tp / (tp + fp) if tp + fp else None
    out["recall"] = tp / (tp + fn) if tp + fn else None
    all_d = [x for v in delays.values() for x in v]
    out["detect_intervals_after_fill_max"] = max(all_d) if all_d else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--scenarios", nargs="*", default=None)
    ap.add_argument("--no-hints", dest="hints", action="store_false")
    ap.add_argument("--eval", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    configure("console", "warning")     # config-change events are info: keep stdout for results
    names = a.scenarios or builtin_names()
    t0 = time.perf_counter()
    runs = [run_scenario(n, s, eval_s=a.eval, window_s=a.window, hints=a.hints)
            for n in names for s in range(a.seeds)]
    res = score(runs, a.eval, a.window)
    res["wall_seconds"] = round(time.perf_counter() - t0, 2)
    res["runs"] = [{"scenario": r.scenario, "seed": r.seed, "reported": sorted(r.reported),
                    "ground_truth": list(r.ground_truth)} for r in runs]
    if a.json:
        json.dump(res, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'finding':<26}{'tp':>4}{'fp':>4}{'fn':>4}{'precision':>11}{'recall':>8}{'delay(max)':>12}")
    for f, d in res["findings"].items():
        p = "-" if d["precision"] is None else f"{d['precision']:.2f}"
        rc = "-" if d["recall"] is None else f"{d['recall']:.2f}"
        dl = "-" if d["detect_intervals_after_fill_max"] is None else f"{d['detect_intervals_after_fill_max']:.1f}"
        print(f"{f:<26}{d['tp']:>4}{d['fp']:>4}{d['fn']:>4}{p:>11}{rc:>8}{dl:>12}")
    print(f"overall precision {res['precision']}, recall {res['recall']}, max delay "
          f"{res['detect_intervals_after_fill_max']} intervals after the window fills, "
          f"healthy false alarms {res['healthy_false_alarms']}, {res['wall_seconds']} s")
    print(f"\n{'scenario':<28}{'promised':>10}{'found at (max)':>16}  kept")
    for name, d in res["time_to_finding"].items():
        prom = "-" if d["promised_s"] is None else f"{d['promised_s']:.0f} s"
        if d["healthy"]:
            got = "clean" if d["kept"] else "false alarm"
        else:
            got = "never" if d["found_at_max_s"] is None else f"{d['found_at_max_s']:.0f} s"
        print(f"{name:<28}{prom:>10}{got:>16}  {'yes' if d['kept'] else 'NO'}")
    for r in res["runs"]:
        missing = set(r["ground_truth"]) - set(r["reported"])
        if missing or (not r["ground_truth"] and r["reported"]):
            print(f"  {r['scenario']} seed {r['seed']}: reported {r['reported']}, truth {r['ground_truth']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
