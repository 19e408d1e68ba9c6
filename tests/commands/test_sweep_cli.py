"""`vllm-drift sweep` end to end against a simulated server on 127.0.0.1: the JSON document, the
calibration CSV in the shared observation file's columns, the HTML report; a URL that is not an
OpenAI server is refused (exit 2, one line); failing requests stop the sweep; Ctrl-C stops at
once and still writes what was measured."""
from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import shared_path
from exporter.cli import main
from exporter.commands.sweep import print_table
from loopback import Site, static, status
from sim_running import quiet_scenario, start


@pytest.fixture()
def sim(tmp_path):
    srv, st = start(quiet_scenario(tmp_path, max_num_seqs=8, speed=5.0))
    with srv:
        yield srv.urls[0], st


def test_json_csv_and_html(sim, tmp_path, capsys):
    url, st = sim
    out, html = tmp_path / "cal.csv", tmp_path / "sweep.html"
    rc = main(["sweep", url, "--concurrency", "1,4,16", "--max-requests", "20", "--output-tokens", "16",
               "--prompt-tokens", "64", "--max-duration", "4", "--settle", "0.2", "--gpu", "L4",
               "--out", str(out), "--html", str(html), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    levels = doc["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 16]
    tput = [lv["output_tokens_per_s"] for lv in levels]
    assert tput[0] < tput[1] < tput[2]
    for lv in levels:
        for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p90_s", "kv_usage_mean",
                  "running_max", "preemptions"):
            assert lv[k] is not None, k
        assert lv["ttft_p50_s"] <= lv["ttft_p99_s"] and lv["failed"] == 0
    assert doc["server"] == {"url": url, "model": st.scenario.model, "served_model_name": st.model_name,
                             "gpu": "L4", "tp": 1, "dtype": "bf16", "version": "0.11.0"}
    header = shared_path("fixtures", "throughput-observations.csv").read_text().splitlines()[0]
    lines = out.read_text().splitlines()
    assert lines[0] == header
    rows = list(csv.DictReader(lines))
    assert [r["concurrency"] for r in rows] == ["1", "4", "16"]
    assert all(r["model"] == st.scenario.model and r["gpu"] == "L4" and r["input_len"] == "64"
               and r["output_len"] == "16" for r in rows)
    assert float(rows[0]["tpot_ms"]) == pytest.approx(levels[0]["tpot_mean_s"] * 1e3, rel=1e-3)
    pred = doc["prediction"]
    assert [p["x"] for p in pred["points"]][:3] == [1, 2, 3] and "L4" in pred["note"]
    page = html.read_text()
    assert page.count("data-vllm-drift-plot") == 2 and "model prediction" in page
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=\"?https?:", page)    # plotly.js inlined
    assert not re.search(r"<link[^>]*\shref=", page)


def test_the_sweep_calibrates_the_model_on_the_server_it_measured(tmp_path, capsys):
    """A simulated server whose steps take 1.5x what the calculator predicts (step_time_scale;
    nothing in its exposition says so): the sweep's a-priori prediction is a third off, the model
    calibrated on the sweep's levels lands within a few percent of each level, the level between
    the ends is predicted by a calibration on the others as well (held out), and the terminal and
    the report say so. Each level runs several rounds per client (steady state, not the first
    burst), bounded by --max-duration."""
    srv, _ = start(quiet_scenario(tmp_path, max_num_seqs=32, step_time_scale=1.5))
    html = tmp_path / "sweep.html"
    with srv:
        assert main(["sweep", srv.urls[0], "--concurrency", "2,4,8", "--max-requests", "40", "--output-tokens", "16",
                     "--prompt-tokens", "128", "--max-duration", "10", "--settle", "0.1", "--gpu", "L4",
                     "--html", str(html), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pred = doc["prediction"]
    cal = pred["calibrated"]
    assert cal["applied"] and cal["fit"]["rows_used"] == 3
    prior = {p["x"]: p for p in pred["points"]}
    fitted = {p["x"]: p for p in cal["points"]}
    for lv in doc["levels"]:
        c, tpot = lv["concurrency"], lv["tpot_mean_s"]
        assert lv["completed"] >= 3 * c
        assert abs(prior[c]["tpot_s"] - tpot) / tpot > 0.2            # the hidden 1.5x
        assert abs(fitted[c]["tpot_s"] - tpot) / tpot < 0.05
    h = cal["held_out"]
    assert h["scored"] == ["c=4"] and h["tpot_mape"] < 0.05 and h["tpot_mape"] < h["prior_tpot_mape"] / 4
    print_table(doc)                        # what the sweep prints without --json
    text = capsys.readouterr().out
    assert "model calibrated on this sweep: 3 levels" in text and "held out: c=4" in text
    page = html.read_text()
    assert "model calibrated on this sweep" in page and "calibrated TPOT (mean)" in page


def test_refuses_a_url_that_is_not_an_openai_server(capsys, port):
    with Site(static({"/metrics": b"# nothing\n"})) as site:
        assert main(["sweep", site.url, "--concurrency", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/v1/models answered HTTP 404" in err
    with Site(status("500 Internal Server Error")) as site:
        assert main(["sweep", site.url]) == 2
    assert main(["sweep", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 1 and "does not answer /v1/models" in err.splitlines()[-1]
    assert main(["sweep", "not a url"]) == 2


def test_bad_flags_are_one_line_errors(sim, capsys):
    url, _ = sim
    for argv in (["--concurrency", "4,2"], ["--concurrency", "1", "--rate", "1"], ["--max-concurrency", "5000"],
                 ["--concurrency", "64", "--max-concurrency", "32"], ["--concurrency", "a"]):
        assert main(["sweep", url, *argv]) == 2, argv
        assert capsys.readouterr().err.count("\n") == 1


def test_failing_requests_stop_the_sweep(sim, tmp_path, capsys):
    url, _ = sim
    out = tmp_path / "cal.csv"
    rc = main(["sweep", url, "--concurrency", "1,2,4", "--prompt-tokens", "5000", "--max-requests", "3",
               "--out", str(out), "--json"])
    assert rc == 1
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["levels"]) == 1 and doc["levels"][0]["failed"] == 3
    assert "failed at concurrency 1" in doc["stopped"] and "maximum context length" in doc["stopped"]
    assert out.read_text().splitlines()[1:] == []          # header only: nothing measured


def test_rate_levels(sim, capsys):
    url, _ = sim
    rc = main(["sweep", url, "--rate", "4,8", "--max-requests", "16", "--output-tokens", "8",
               "--max-duration", "30", "--settle", "0", "--json"])
    assert rc == 0      # (the duration only bounds: warm-up and 16 Poisson arrivals at 4/s take ~5 s)
    levels = json.loads(capsys.readouterr().out)["levels"]
    assert [lv["rate"] for lv in levels] == [4, 8]
    assert all(lv["completed"] == 16 for lv in levels)
    # open loop: requests/s follows the offered rate (below saturation), within Poisson noise
    assert 2.0 < levels[0]["request_throughput"] < 8.0 < levels[1]["request_throughput"] * 1.6


def test_ctrl_c_stops_at_once_and_writes_what_was_measured(sim, tmp_path, cli_env):
    url, _ = sim
    out = tmp_path / "cal.csv"
    p = subprocess.Popen([sys.executable, "-m", "exporter", "sweep", url, "--concurrency", "2,4",
                          "--max-requests", "100000", "--max-duration", "120", "--output-tokens", "8",
                          "--out", str(out), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=cli_env)
    try:
        time.sleep(4.0)
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        stdout, _ = p.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and took < 5
    doc = json.loads(stdout)
    assert doc["interrupted"] and len(doc["levels"]) == 1 and doc["levels"][0]["partial"]
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 1 and "partial level" in rows[0]["notes"] and int(rows[0]["output_len"]) == 8
