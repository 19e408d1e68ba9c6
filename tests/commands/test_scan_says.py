"""`vllm-drift scan` says what it can from what it gets: one snapshot -> the verdicts one snapshot
gives plus an explicit `needs_more_data` list; a pair (two time-stamped dumps on stdin, or
`--after`) adds rates; a counter reset names the counter and what was done; a broken pipe exits
quietly; every example in `scan --help` runs as written (URLs pointed at a simulated server)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from exporter.commands.scan import EXAMPLES
from sim_running import start

ENV = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))


def sh(cmd: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def dump(tmp: Path, name: str, seconds: int, scenario: str = "kv-pressure") -> Path:
    out = sh(f"vllm-drift simulate --scenario {scenario} --seed 3 --dump {seconds} > {name}", tmp)
    assert out.returncode == 0, out.stderr
    return tmp / name


def scan_json(cmd: str, tmp: Path) -> dict:
    out = sh(cmd + " --json", tmp)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["targets"][0]


def test_one_snapshot_lists_what_needs_more_data_and_a_stamped_pair_adds_rates(tmp_path):
    dump(tmp_path, "a.prom", 60)
    dump(tmp_path, "b.prom", 90)
    one = scan_json("vllm-drift scan - --gpu L4 < a.prom", tmp_path)
    assert one["input"] == {"snapshots": 1, "interval_seconds": None, "counter_reset": None}
    assert one["needs_more_data"], "a single snapshot cannot judge the rate-based findings"
    assert set(one["needs_more_data"]) <= set(one["needs_more_data_reasons"])
    assert one["observed"].get("generation_tokens_per_s") is None          # no rates from one
    pair = scan_json("cat a.prom b.prom | vllm-drift scan - --gpu L4", tmp_path)
    assert pair["input"]["snapshots"] == 2 and pair["input"]["interval_seconds"] == 30.0
    assert pair["observed"]["generation_tokens_per_s"] > 0
    assert len(pair["needs_more_data"]) < len(one["needs_more_data"])
    assert "kv_pressure" in {f["finding"] for f in pair["findings"]
                             if f["severity"] in ("warning", "critical")}
    # the same pair as two files: the dumps' time stamps make --interval unnecessary
    same = scan_json("vllm-drift scan a.prom --after b.prom --gpu L4", tmp_path)
    assert same["input"]["interval_seconds"] == 30.0
    assert same["observed"]["generation_tokens_per_s"] == pair["observed"]["generation_tokens_per_s"]
    # human output: a table section for what needs more data
    text = sh("vllm-drift scan a.prom --gpu L4", tmp_path)
    assert text.returncode == 0 and "needs more data" in text.stdout and "1 snapshot" in text.stdout
    assert all(len(line) <= 80 for line in text.stdout.splitlines())       # fits a terminal


def test_counter_reset_names_the_counter_and_what_was_done(tmp_path):
    dump(tmp_path, "a.prom", 60)
    dump(tmp_path, "b.prom", 90)
    # the later file first: every counter goes backwards, as after a restart
    t = scan_json("vllm-drift scan b.prom --after a.prom --interval 30 --gpu L4", tmp_path)
    why = t["input"]["counter_reset"]
    assert re.search(r"counter \S+ went back from \d", why), why
    assert "judged alone" in why and t["input"]["snapshots"] == 1
    text = sh("vllm-drift scan b.prom --after a.prom --interval 30", tmp_path)
    assert "counter reset:" in text.stdout


def test_broken_pipe_exits_quietly(tmp_path):
    dump(tmp_path, "a.prom", 30, scenario="healthy")
    many = " ".join(["a.prom"] * 80)          # far more output than a pipe buffer holds
    out = sh(f"vllm-drift scan {many} --json | head -c 100 > /dev/null; echo rc=${{PIPESTATUS[0]}}", tmp_path)
    assert "rc=0" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_every_help_example_runs_as_written(tmp_path):
    dump(tmp_path, "metrics.prom", 60)
    dump(tmp_path, "before.prom", 60)
    dump(tmp_path, "later.prom", 120)
    help_text = sh("vllm-drift scan --help", tmp_path).stdout
    examples = [line.strip() for line in EXAMPLES.splitlines()
                if line.strip().startswith(("vllm-drift", "(vllm-drift"))]
    assert len(examples) == 7 and all(e in help_text for e in examples)
    running, _ = start("kv-pressure", seed=1)
    with running:
        url = running.urls[0]
        for example in examples:
            cmd = example.replace("http://10.0.0.5:8000", url).replace("--interval 30", "--interval 2") \
                if "10.0.0.5" in example else example
            out = sh(cmd, tmp_path)
            assert out.returncode == 0, (example, out.stderr[-500:])
            assert "model" in out.stdout and "Traceback" not in out.stderr, example
