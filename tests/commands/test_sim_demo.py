"""`vllm-drift demo` end to end on loopback: simulated servers + the real daemon in one command.
It keeps its promises: every server's URL is printed and stays in the table, each injected
finding shows within the time its scenario states (`detect_within`), nothing loud on the healthy
server, `--duration` is honoured to the second, and the table fits 100 columns without cutting a
word (checked on the real run and on a rendering of the longest names)."""
from __future__ import annotations

import io
import re
import subprocess
import sys
import time

from rich.console import Console

from conftest import REPO
from exporter.commands.demo import WIDTH, Row, render
from exporter.report import FINDINGS
from exporter.sim.scenario import builtin_names, load_scenario


def test_demo_finds_each_injected_problem_in_the_stated_time_and_stops_on_time():
    scenarios = ["healthy", "kv-pressure", "small-pool-pressure"]
    duration = 50
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "exporter", "demo", "--scenarios", ",".join(scenarios),
                        "--listen", "127.0.0.1:0", "--duration", str(duration), "--refresh", "5"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    ran = float(re.search(r"stopped after ([\d.]+) s", out).group(1))
    assert abs(ran - duration) <= 1.0, ran                    # honoured to the second
    assert wall < duration + 30, wall                         # + interpreter start and imports (loaded machine)
    urls = re.findall(r"http://127\.0\.0\.1:\d+", out.split("vllm-drift demo —")[0])
    assert len(set(urls)) == len(scenarios) + 1               # every server and the daemon
    last = out.split("vllm-drift demo —")[-1]
    for u in urls:
        assert u in last                                      # URLs stay visible in the table
    for line in out.splitlines():
        assert len(line) <= WIDTH, line
    assert "…" not in out
    summary = out.split("stopped after")[1]
    for name in ("kv-pressure", "small-pool-pressure"):
        m = re.search(rf"{name}\s+found at (\d+) s \(promised within (\d+) s\)", summary)
        assert m, summary
        assert int(m.group(1)) <= int(m.group(2)), summary
    assert re.search(r"healthy\s+nothing at warning or above", summary), summary


def test_table_fits_100_columns_with_the_longest_names_whole():
    rows = []
    for n in builtin_names():
        sc = load_scenario(n)
        row = Row(sc.name, "http://127.0.0.1:65535", tuple(sc.ground_truth), tuple(sc.acceptable),
                  sc.detect_within_s or 60.0)
        loud = [f for f in FINDINGS if f not in ("insufficient_data", "unavailable")]
        row.update({"model_name": "m", "findings": [{"finding": f, "severity": "warning"} for f in loud]}, 10.0)
        rows.append(row)
    for width in (WIDTH, 80):                                 # and a narrow terminal
        buf = io.StringIO()
        Console(file=buf, width=width).print(render(rows, 3599.0, daemon="http://127.0.0.1:65535",
                                                    remaining=3599.0, width=width))
        text = buf.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width
        assert "…" not in text
        words = set(re.findall(r"[\w.:/-]+", text))
        for r in rows:
            assert r.name in words and r.url in words
            for f in loud:
                assert f in words, (width, f)                 # never cut or folded
    # the verdicts: a promise kept, due, late; a healthy server clean, then healthy
    r = Row("x", "u", ("kv_pressure",), (), 60.0)
    assert str(r.verdict(10)) == "due in 50 s" and str(r.verdict(75)) == "late by 15 s"
    r.update({"model_name": "m", "findings": [{"finding": "kv_pressure", "severity": "critical"}]}, 42.0)
    assert str(r.verdict(80)) == "found at 42 s"
    h = Row("h", "u", (), (), 75.0)
    assert str(h.verdict(10)) == "clean, 1:05 left" and str(h.verdict(80)) == "healthy"
    h.update({"model_name": "m", "findings": [{"finding": "idle_capacity", "severity": "warning"}]}, 81.0)
    assert str(h.verdict(82)) == "false alarm"
