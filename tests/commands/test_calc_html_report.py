"""`calc --html`: one self-contained file with plots, checked statically and drawn by a real
headless Chromium (Debian `chromium`, installed by scripts/test)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.reports.html import inline_js, page, plot, table
from exporter.reports.scan import render_scan_report

BASE = ["calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM-80GB"]
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("calc") / "r.html"
    assert main([*BASE, "--profile", "chatbot", "--html", str(path), "--json"]) == 0
    return path


def test_report_is_self_contained_with_plots(report):
    html = report.read_text(encoding="utf-8")
    assert html.count("Plotly.newPlot(") >= 4           # memory, concurrency, sweep, spec decode
    assert not EXTERNAL.findall(html)
    assert "<script src" not in html and "<link" not in html
    import plotly.offline
    assert html.count(inline_js(plotly.offline.get_plotlyjs()[:300])) == 1   # plotly.js inlined once
    for heading in ("Memory", "Throughput and latency vs concurrency", "Trade-off table: max_num_seqs",
                    "Speculative decoding", "GPU tiers", "chatbot"):
        assert heading in html
    assert 'class="mark"' in html                         # the recommended row is highlighted


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("Debian chromium not installed (scripts/test installs it)")
    return exe


def _dump_dom(path: Path) -> str:
    r = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--virtual-time-budget=8000", "--dump-dom", path.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    return r.stdout


def test_chromium_draws_every_plot(report):
    dom = _dump_dom(report)
    drawn = len(re.findall(r'<div class="plot-container plotly"', dom))
    assert drawn >= 4, f"{drawn} plots drawn"
    assert dom.count('<svg class="main-svg"') >= 2 * drawn   # plotly's svg layers exist: it ran
    assert len(re.findall(r'class="(?:bars|trace scatter)', dom)) >= 4  # with data in them


def test_scan_report_from_a_real_scan(tmp_path, shared, cli_env):
    """`scan --html` of a real capture: the same page render_scan_report makes of its JSON."""
    prom = shared("fixtures", "prom", "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom")
    out = tmp_path / "scan.html"
    r = subprocess.run([sys.executable, "-m", "exporter", "scan", str(prom), "--gpu", "L40S", "--json",
                        "--html", str(out)], capture_output=True, text=True, timeout=120, env=cli_env)
    assert r.returncode in (0, 1), r.stderr   # scan may exit 1 when it has findings
    doc = json.loads(r.stdout)
    assert f"wrote {out}" in r.stderr
    html = out.read_text(encoding="utf-8")
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # plotly's div ids
    assert uuid.sub("", html) == uuid.sub("", render_scan_report(doc))
    assert "KV cache tokens: observed vs predicted" in html and "Qwen" in html
    assert not EXTERNAL.findall(html)
    dom = _dump_dom(out)
    assert len(re.findall(r'<div class="plot-container plotly"', dom)) >= 2


def test_page_without_plots_carries_no_script():
    html = page("t", [table(["a", "b"], [[1, None], ["x", 2.5]])])
    assert "<script" not in html and "<td>—</td>" in html and '<td class="num">2.5</td>' in html


def test_inline_js_keeps_string_values():
    js = 't.href="https://plotly.com/";a=\'<a href="http://x">\';</script>'
    out = inline_js(js)
    assert not EXTERNAL.findall(out) and "</script" not in out
    # the escapes decode to the same strings in JavaScript (JSON shares the \\/ escape)
    assert json.loads('"' + out.split('"')[1] + '"') == "https://plotly.com/"


def test_missing_plotly_is_one_line_naming_the_extra(tmp_path):
    code = ("import sys; sys.modules['plotly'] = None; from exporter.cli import main; "
            f"sys.exit(main({[*BASE, '--html', str(tmp_path / 'r.html')]!r}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "vllm-drift calc: error: HTML reports need plotly: pip install 'vllm-drift[report]'"
    assert not (tmp_path / "r.html").exists()


def test_plot_needs_plotly_too(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    from exporter.errors import InputError
    with pytest.raises(InputError, match=r"\[report\]"):
        plot(object())


def test_a_calibrated_report_shows_its_rows_on_the_curve_it_calibrated(tmp_path, shared):
    """`calc --calibrate --html` on real measured rows (../shared Qwen3-32B on 2 x H100, 4096/1024
    at c=8, 32 and 128): a Calibration section lists each row measured / a priori / calibrated,
    the latency plot carries the measured points beside the calibrated curve, and Chromium draws
    them (two more scatter traces than the uncalibrated page)."""
    import csv
    src = shared("fixtures", "throughput-observations.csv")
    with open(src, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if (r["model"], r["gpu"], r["tp"], r["dtype"], r["input_len"], r["output_len"])
                == ("Qwen/Qwen3-32B", "H100-SXM-80GB", "2", "bf16", "4096", "1024")
                and r["concurrency"] in ("8", "32", "128")]
        fields = reader.fieldnames
    cal = tmp_path / "sweep.csv"
    with open(cal, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    query = ["calc", "--model", "Qwen/Qwen3-32B", "--gpu", "H100-SXM-80GB", "--tp", "2", "--prompt-tokens", "4096",
             "--output-tokens", "1024", "--concurrency", "32", "--vllm-version", "0.12.0"]
    with_cal, without = tmp_path / "cal.html", tmp_path / "prior.html"
    assert main([*query, "--calibrate", str(cal), "--html", str(with_cal), "--json"]) == 0
    assert main([*query, "--html", str(without), "--json"]) == 0
    html = with_cal.read_text(encoding="utf-8")
    assert "Calibration (--calibrate)" in html and "Model: calibrated on the measured rows" in html
    assert "TPOT measured (ms)" in html and "TTFT measured (ms)" in html
    for r in rows:
        assert f"{float(r['ttft_ms']):,.1f}" in html            # each row's measured TTFT is in the table
    plain = without.read_text(encoding="utf-8")
    assert "Calibration (--calibrate)" not in plain and "Model: a priori" in plain
    traces = [len(re.findall(r'class="trace scatter', _dump_dom(p))) for p in (with_cal, without)]
    assert traces[0] == traces[1] + 2, traces
