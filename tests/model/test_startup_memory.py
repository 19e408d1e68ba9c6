"""Memory other processes hold on the device at startup (`calc --gpu-memory-in-use`): from 0.9.1
the V1 worker refuses to start when its startup snapshot's free memory is under
gpu_memory_utilization x total; 0.6.4 (V0) and V1 0.8.0-0.9.0 count that memory against the KV
pool; V0 otherwise checks nothing and runs out of memory allocating its pool. The snapshot's own
share (CUDA context, and NCCL's buffers from 0.11.0) is checked against the init_free_gib vLLM
0.19 reported in ../shared's memory breakdowns."""
from __future__ import annotations

import csv
import json
import re
import subprocess

import pytest

from exporter.model.kv_cache import kv_capacity, startup_refusal, startup_utilization_cap
from exporter.model.optimizer import recommend
from exporter.model.setup import Setup
from exporter.model.traffic import Traffic

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_the_startup_snapshot_leaves_what_vllm_0_19_reported_free(shared):
    """Every 0.19.0 row of kv-memory-breakdown.csv (H100, TP 1-4, PP 2-4): the free memory the
    model puts in vLLM's startup snapshot is within 0.5 GiB of the row's init_free_gib (the
    context and NCCL constants were read off these rows: a consistency check, not a held-out one)."""
    rows = [r for r in csv.DictReader(open(shared("fixtures", "kv-memory-breakdown.csv")))
            if r["vllm_version"] == "0.19.0" and r["init_free_gib"]]
    assert len(rows) >= 20
    for r in rows:
        s = Setup.build(r["model"], r["gpu"], tp=int(r["tp"]), pp=int(r["pp"] or 1),
                        gpu_memory_gib=float(r["gpu_total_gib"]), vllm_version="0.19.0",
                        max_model_len=int(r["max_model_len"]))
        free = startup_utilization_cap(s) * s.gpu_memory_gib
        assert abs(free - float(r["init_free_gib"])) <= 0.5, (r["model"], r["tp"], free, r["init_free_gib"])
        # so the row's own 0.95 started, and one just above the free share would not have
        assert startup_refusal(s.with_(gpu_memory_utilization=float(r["gpu_memory_utilization"]))) is None


def test_v1_refuses_when_others_leave_less_than_the_budget():
    s = Setup.build(LLAMA, "H100-80GB", vllm_version="0.19.0", max_model_len=8192)
    cap = startup_utilization_cap(s)
    assert startup_refusal(s.with_(gpu_memory_utilization=cap - 0.001)) is None
    why = startup_refusal(s.with_(gpu_memory_utilization=cap + 0.001))
    assert why and why.startswith("Free memory on device (") and "less than desired GPU memory utilization" in why
    # another server holding 40 GiB: 0.9 no longer starts, its own suggestion does, and the pool
    # of one that starts does not depend on it (0.9.1+ measure from the snapshot)
    busy = s.with_(gpu_memory_in_use_gib=40.0)
    assert re.match(r"Free memory on device \(38\.68/79\.19 GiB\)", startup_refusal(busy))
    lowered = float(re.search(r"lower --gpu-memory-utilization to ([0-9.]+)", startup_refusal(busy)).group(1))
    assert startup_refusal(busy.with_(gpu_memory_utilization=lowered)) is None
    assert (kv_capacity(busy.with_(gpu_memory_utilization=0.45)).tokens
            == kv_capacity(s.with_(gpu_memory_utilization=0.45)).tokens)
    # NCCL's buffers are in the snapshot from 0.11.0 on NVSwitch TP ranks, not before
    tp8 = Setup.build(LLAMA, "H100-80GB", tp=8, vllm_version="0.19.0", max_model_len=8192)
    assert startup_utilization_cap(tp8) < startup_utilization_cap(tp8.with_(vllm_version=(0, 10, 2)))


def test_releases_that_count_the_whole_device_charge_it_to_the_pool():
    s = Setup.build(LLAMA, "RTX-3090-24GB", vllm_version="0.8.4", max_model_len=4096)
    base, busy = kv_capacity(s), kv_capacity(s.with_(gpu_memory_in_use_gib=1.5))
    assert busy.memory.kv_cache_gib == pytest.approx(base.memory.kv_cache_gib - 1.5, abs=0.01)
    assert startup_utilization_cap(s) is None          # 0.8.x had no free-memory check
    v064 = Setup.build(LLAMA, "RTX-3090-24GB", vllm_version="0.6.4", max_model_len=8192)
    assert (kv_capacity(v064.with_(gpu_memory_in_use_gib=1.0)).memory.non_torch_gib
            == pytest.approx(kv_capacity(v064).memory.non_torch_gib + 1.0))


def test_v0_without_a_check_runs_out_of_memory_only_when_others_hold_some():
    s = Setup.build(LLAMA, "A100-80GB", vllm_version="0.7.3", max_model_len=8192, gpu_memory_utilization=0.9)
    assert startup_utilization_cap(s) is None and startup_refusal(s) is None
    assert kv_capacity(s.with_(gpu_memory_in_use_gib=5.0)).tokens == kv_capacity(s).tokens
    why = startup_refusal(s.with_(gpu_memory_in_use_gib=9.0))
    assert why and "checks no free memory" in why and "0.7.3" in why


def test_a_running_server_is_predicted_whatever_others_hold_now():
    """The refusal is calc's (a server about to start); the daemon and the simulator size the pool
    of a server that is running, which kv_capacity does with no startup check."""
    s = Setup.build(LLAMA, "H100-80GB", tp=8, vllm_version="0.19.0", max_model_len=8192,
                    gpu_memory_utilization=0.99)
    assert startup_refusal(s) is not None and kv_capacity(s).tokens > 0


def test_the_recommendation_stays_under_what_the_device_leaves_free():
    s = Setup.build(LLAMA, "L4", vllm_version="0.19.0", max_model_len=8192, gpu_memory_utilization=0.8,
                    gpu_memory_in_use_gib=3.0)
    rec = recommend(s, Traffic(prompt_tokens_mean=1024, output_tokens_mean=256))
    assert rec.gpu_memory_utilization <= startup_utilization_cap(s)
    assert startup_refusal(s.with_(gpu_memory_utilization=rec.gpu_memory_utilization)) is None
    assert "held by other processes" in rec.binding["gpu_memory_utilization"]
    assert rec.max_num_seqs > 1


def test_calc_flag_refuses_as_vllm_and_validates(cli_env):
    base = ["vllm-drift", "calc", "--model", LLAMA, "--gpu", "L4", "--max-model-len", "8192", "--json"]
    out = subprocess.run(base + ["--gpu-memory-in-use", "2"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert out.returncode == 2 and "Free memory on device (19.52/22.03 GiB)" in out.stderr
    ok = subprocess.run(base + ["--gpu-memory-in-use", "2", "--gpu-memory-utilization", "0.85"],
                        capture_output=True, text=True, env=cli_env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["setup"]["gpu_memory_in_use_gib"] == 2.0
    bad = subprocess.run(base + ["--gpu-memory-in-use", "30"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert bad.returncode == 2 and "--gpu-memory-in-use" in bad.stderr
