"""`vllm-drift scan --json` on every real capture: the canonical values the exposition holds, read
independently here with prometheus_client's parser; stdin; a live URL over loopback."""
import json
import re
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import loopback
from conftest import SHARED, VLLM_CPU

CPU = VLLM_CPU
INTERFACE_KEYS = {"kv_cache_usage", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
                  "prompt_tokens_total", "generation_tokens_total", "prefix_cache_hit_ratio",
                  "spec_decode_acceptance_rate", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                  "num_gpu_blocks", "block_size", "kv_cache_tokens", "gpu_memory_utilization",
                  "enable_prefix_caching", "cache_dtype", "max_model_len"}


def scan(*args, stdin=None):
    out = subprocess.run([sys.executable, "-m", "exporter", "scan", "--json", *map(str, args)], input=stdin,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def truth(text: str) -> dict:
    fam = {f.name: f for f in text_string_to_metric_families(text)}

    def total(name):
        f = fam.get(name)
        return None if f is None else sum(s.value for s in f.samples if s.name.endswith("_total"))

    def gauge(name, agg=sum):
        f = fam.get(name)
        return None if f is None else agg(s.value for s in f.samples)
    kv = gauge("vllm:kv_cache_usage_perc", max)
    t = {"kv_cache_usage": kv if kv is not None else gauge("vllm:gpu_cache_usage_perc", max),
         "num_requests_running": gauge("vllm:num_requests_running"),
         "num_requests_waiting": gauge("vllm:num_requests_waiting"),
         "num_preemptions_total": total("vllm:num_preemptions"),
         "prompt_tokens_total": total("vllm:prompt_tokens"),
         "generation_tokens_total": total("vllm:generation_tokens")}
    info = fam.get("vllm:cache_config")
    if info and info.samples:
        lab = info.samples[0].labels
        t["num_gpu_blocks"] = int(lab["num_gpu_blocks"])
        t["block_size"] = int(lab["block_size"])
        t["gpu_memory_utilization"] = float(lab["gpu_memory_utilization"])
        t["enable_prefix_caching"] = lab["enable_prefix_caching"] == "True"
        t["cache_dtype"] = lab["cache_dtype"]
        t["kv_cache_tokens"] = int(float(lab["kv_cache_size_tokens"])) if lab.get("kv_cache_size_tokens", "None") != "None" \
            else t["num_gpu_blocks"] * t["block_size"]
    return {k: v for k, v in t.items() if v is not None}


def all_captures():
    shared = SHARED / "fixtures" / "prom"
    return sorted(shared.glob("*.prom")) + sorted(CPU.glob("*.prom"))


@pytest.mark.parametrize("path", all_captures(), ids=lambda p: p.name)
def test_scan_reports_the_values_each_capture_holds(path):
    doc = scan(path)
    [t] = doc["targets"]
    assert INTERFACE_KEYS <= set(t["observed"])
    expected = truth(path.read_text(encoding="utf-8"))
    assert expected, "the capture holds canonical values"
    for key, value in expected.items():
        got = t["observed"][key]
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
    assert t["engine_era"] in ("v0", "v1") and t["model_name"]
    assert {"finding", "severity", "score", "parameter", "configured", "recommended", "explanation"} <= \
        set((t["findings"] or [{}])[0]) or t["findings"] == []


def test_specific_values_of_the_shared_captures(shared):
    t = scan(shared("fixtures", "prom", "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"))["targets"][0]
    o = t["observed"]
    assert (o["num_gpu_blocks"], o["block_size"], o["kv_cache_tokens"]) == (850, 16, 13600)
    assert o["request_success_total"] == 6 and o["gpu_memory_utilization"] == 0.9 and t["engine_era"] == "v1"
    assert 0 < o["kv_cache_usage"] < 0.01 and o["ttft_p99_s"] > o["ttft_p50_s"] > 0
    v0 = scan(shared("fixtures", "prom", "vllm-0.7.0-v0-aibrix-qwen2.5-coder-1.5b.partial.prom"))["targets"][0]
    assert v0["engine_era"] == "v0" and v0["observed"]["num_gpu_blocks"] == 81767
    assert v0["observed"]["spec_decode_acceptance_rate"] is None   # absent, never zero


def test_stdin_and_a_pair_for_rates():
    a, b = CPU / "vllm-0.32.0-cpu-load-a.prom", CPU / "vllm-0.32.0-cpu-load-b.prom"
    if not a.exists():
        pytest.skip("vllm-cpu captures not present")
    single = scan("-", stdin=a.read_bytes())["targets"][0]
    assert single["target"] == "-" and single["observed"]["generation_tokens_total"] > 0
    pair = scan(a, "--after", b, "--interval", 30)["targets"][0]
    ta, tb = truth(a.read_text()), truth(b.read_text())
    rate = (tb["generation_tokens_total"] - ta["generation_tokens_total"]) / 30
    assert pair["observed"]["generation_tokens_per_s"] == pytest.approx(rate, rel=1e-6)


def test_scan_a_live_url_twice_for_rates(shared):
    body = shared("fixtures", "prom", "vllm-0.11.0-v1-idle-qwen1.5-0.5b.prom").read_bytes()
    routes = {"/metrics": body, "/version": b'{"version": "0.11.0"}',
              "/v1/models": b'{"data": [{"id": "Qwen/Qwen1.5-0.5B-Chat", "max_model_len": 4096}]}'}
    with loopback.Site(loopback.static(routes)) as site:
        doc = scan(site.url, "--interval", "0.5")
    [t] = doc["targets"]
    assert t["vllm_version"] == "0.11.0" and t["observed"]["max_model_len"] == 4096
    assert site.requests.count("/metrics") == 2


def test_scan_errors_exit_2(tmp_path):
    for args, words in (([str(tmp_path / "missing.prom")], "cannot read"),
                        (["http://127.0.0.1:1"], "cannot connect"),
                        ([str(tmp_path), "--after", "x", "--interval", "-1"], "")):
        out = subprocess.run([sys.executable, "-m", "exporter", "scan", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out.stderr


def dump(tmp_path, name, *args, at=(90,)):
    """A simulated server's /metrics at each of `at` simulated seconds (simulate --dump), in one
    file: two time-stamped dumps are a pair, for rates."""
    body = b""
    for seconds in at:
        out = subprocess.run([sys.executable, "-m", "exporter", "simulate", "--seed", "5", *args, "--dump",
                              str(seconds)], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()
        body += out.stdout
    path = tmp_path / name
    path.write_bytes(body)
    return path


def test_hints_are_checked_as_the_config_checks_them_and_name_the_flag(tmp_path):
    path = dump(tmp_path, "h.prom", "--scenario", "healthy")
    for args, words in ((["--tp", "0"], "--tp: "), (["--pp", "0"], "--pp: "),
                        (["--max-num-seqs", "0"], "--max-num-seqs: "),
                        (["--quantization", "fp9"], "--quantization: unknown quantization 'fp9'"),
                        (["--max-num-batched-tokens", "1.5K"], "--max-num-batched-tokens: decimals are not allowed"),
                        (["--ttft-slo", "-1"], "--ttft-slo: a duration must be positive"),
                        (["--tpot-slo", "soon"], "--tpot-slo: expected a duration")):
        out = subprocess.run([sys.executable, "-m", "exporter", "scan", str(path), "--gpu", "L4", *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, (args, out.stderr)


BUSY_SMALL_MODEL = """
name: busy-small-model
description: a small model on a fast GPU under steady load (CUDA graphs or not decide its step time)
model: Qwen/Qwen3-0.6B
gpu: H100-SXM-80GB
tp: 1
vllm: {max_model_len: 4096, max_num_seqs: 64, max_num_batched_tokens: 4096, gpu_memory_utilization: 0.9}
traffic:
  rate: 20
  arrival: poisson
  prompt: {mean: 500, cv: 0.3, min: 32, max: 2000}
  output: {mean: 300, cv: 0.3, min: 8, max: 900}
  max_tokens: 1024
warmup: 30s
"""


def test_each_hint_reaches_the_prediction_and_the_findings(tmp_path):
    scenario = tmp_path / "busy.yaml"
    scenario.write_text(BUSY_SMALL_MODEL)
    small = dump(tmp_path, "small.prom", "--scenario", str(scenario))

    def target(*args):
        return scan(small, "--gpu", "H100", *args)["targets"][0]
    base = target()
    assert base["observed"]["num_requests_running"] >= 5 and not base["findings"]
    plain = base["predicted"]
    eager = target("--enforce-eager")["predicted"]
    # 28 layers' kernel launches (~0.3 ms each) against ~4 ms of GPU work; the pool is the same
    assert eager["prior_tpot_seconds"] > 2 * plain["prior_tpot_seconds"] > 0
    assert eager["kv_cache_tokens"] == plain["kv_cache_tokens"] > 0
    assert eager["calibration"]["pool"] == plain["calibration"]["pool"] + "|eager"
    fp8 = target("--quantization", "fp8")["predicted"]
    assert fp8["kv_cache_tokens"] > plain["kv_cache_tokens"]       # half the weights' bytes
    [mismatch] = target("--pp", "2")["findings"]
    assert mismatch["finding"] == "hint_mismatch" and "x2 (TP 1 x PP 2)" in mismatch["explanation"]
    # vLLM does not export max_num_seqs: inferred from the running plateau, or the hint as given
    capped = dump(tmp_path, "capped.prom", "--scenario", "max-num-seqs-too-low", at=(120, 240))
    inferred = {f["finding"]: f for f in scan(capped, "--gpu", "L4")["targets"][0]["findings"]}
    hinted = {f["finding"]: f for f in scan(capped, "--gpu", "L4", "--max-num-seqs", "6")["targets"][0]["findings"]}
    assert "inferred from the running-count plateau" in inferred["max_num_seqs"]["explanation"]
    assert "(max_num_seqs 6, hint)" in hinted["max_num_seqs"]["explanation"]
    # SLOs: the same server judged against a TPOT objective it misses
    slo = scan(capped, "--gpu", "L4", "--ttft-slo", "500ms", "--tpot-slo", "0.02")["targets"][0]["findings"]
    assert any("against a 20 ms SLO" in f["explanation"] for f in slo), slo


def two_engines(text: str) -> str:
    """The same exposition as if a second data-parallel engine (engine="1") had served exactly
    what engine 0 did, with num_gpu_blocks summed over both as vLLM's frontend reports it (the
    real DP=2 capture: 192 on each engine of 96)."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("vllm:cache_config_info{"):
            line = re.sub(r'num_gpu_blocks="(\d+)"', lambda m: f'num_gpu_blocks="{2 * int(m.group(1))}"', line)
        out.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            out.append(line.replace('engine="0"', 'engine="1"'))
    return "".join(out)


def test_data_parallel_engines_are_judged_one_engine_at_a_time(tmp_path):
    # vLLM applies max_num_seqs, the token budget and the KV pool per engine, and sums the
    # engines' running counts and rates in /metrics: a server of two identical engines must get
    # one engine's verdicts, not those of one engine with twice the batch
    capped = dump(tmp_path, "capped.prom", "--scenario", "max-num-seqs-too-low", at=(120, 240))
    doubled = tmp_path / "dp2.prom"
    doubled.write_text(two_engines(capped.read_text()))
    one = scan(capped, "--gpu", "L4")["targets"][0]
    two = scan(doubled, "--gpu", "L4")["targets"][0]
    assert two["observed"]["num_requests_running"] == 2 * one["observed"]["num_requests_running"] > 0
    f1 = {f["finding"]: f for f in one["findings"]}
    f2 = {f["finding"]: f for f in two["findings"]}
    assert f1.keys() == f2.keys() and "max_num_seqs" in f1
    assert f2["max_num_seqs"]["configured"] == f1["max_num_seqs"]["configured"] == 6
    for name, f in f1.items():
        assert (f2[name]["recommended"], f2[name]["score"]) == (f["recommended"], f["score"]), name
        assert "per engine: 2 data-parallel engines" in f2[name]["explanation"]
        assert "data-parallel" not in f["explanation"]
    assert two["predicted"]["tpot_seconds"] == pytest.approx(one["predicted"]["tpot_seconds"])


def kv_tokens(*flags):
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", *flags, "--json"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return int(json.loads(out.stdout)["kv_cache"]["tokens"])


def test_a_data_parallel_moe_server_is_predicted_with_its_experts_spread_over_the_engines(tmp_path):
    # vLLM flattens TP across DP for the fused-MoE layer: with two engines each GPU holds half the
    # experts, and its pool is that much larger than one engine alone would have
    model, gpu = "Qwen/Qwen3-30B-A3B", "H100-SXM-80GB"
    single = dump(tmp_path, "moe.prom", "--scenario", "healthy", "--model", model, "--gpu", gpu).read_text()
    body = two_engines(single)
    setup = ["--model", model, "--gpu", gpu, "--max-model-len", "4096", "--max-num-seqs", "48",
             "--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.9", "--vllm-version", "0.11.0"]
    blocks = int(re.search(r'num_gpu_blocks="(\d+)"', single).group(1))
    assert blocks * 16 == kv_tokens(*setup)        # the simulator sized one engine's pool as calc does
    sharded_pool = kv_tokens(*setup, "--data-parallel", "2")
    assert sharded_pool > 2 * blocks * 16

    def scan_server(text, *hints):
        routes = {"/metrics": text.encode(), "/version": b'{"version": "0.11.0"}',
                  "/v1/models": json.dumps({"data": [{"id": model, "max_model_len": 4096}]}).encode()}
        with loopback.Site(loopback.static(routes)) as site:
            return scan(site.url, "--gpu", "H100", "--max-num-seqs", "48", "--max-num-batched-tokens", "2048",
                        *hints)["targets"][0]
    sharded = scan_server(body.replace(f'num_gpu_blocks="{2 * blocks}"', f'num_gpu_blocks="{2 * sharded_pool // 16}"'))
    assert sharded["predicted"]["kv_cache_tokens"] == sharded_pool
    assert not [f for f in sharded["findings"] if f["finding"] == "hint_mismatch"]
    # one rank per server behind an outside load balancer: its /metrics shows one engine, the hint says DP 2
    ranked = single.replace(f'num_gpu_blocks="{blocks}"', f'num_gpu_blocks="{sharded_pool // 16}"')
    assert scan_server(ranked, "--data-parallel", "2")["predicted"]["kv_cache_tokens"] == sharded_pool
    assert scan_server(ranked)["predicted"]["kv_cache_tokens"] is None     # DP 1: that pool is a mismatch
    # two engines that each kept one engine's pool: not what vLLM would have given them
    [mismatch] = [f for f in scan_server(body)["findings"] if f["finding"] == "hint_mismatch"]
    assert "2 data-parallel engines" in mismatch["explanation"]


def test_a_real_data_parallel_server_is_judged_one_engine_at_a_time(tmp_path):
    # vllm-cpu 0.32.0 --data-parallel-size 2 --max-num-seqs 8, 32 clients (CAPTURES.md): each
    # engine runs 8 and queues 8; vLLM's frontend sums the engines' blocks into num_gpu_blocks
    a, b = CPU / "vllm-0.32.0-cpu-dp2-a.prom", CPU / "vllm-0.32.0-cpu-dp2-b.prom"
    if not a.exists():
        pytest.skip("vllm-cpu captures not present")
    t = scan(a, "--after", b, "--interval", 30)["targets"][0]
    assert (t["observed"]["num_requests_running"], t["observed"]["num_gpu_blocks"]) == (16, 192)  # as served
    d = t["derived"]
    assert (d["max_num_seqs"], d["max_running_seen"], d["concurrency"]) == (8, 8, 8)
    assert d["kv_capacity_tokens"] == t["observed"]["kv_cache_tokens"] == 12288   # each engine logged 12,288
    # before kv_cache_size_tokens (vLLM < 0.24) the pool is num_gpu_blocks alone: still one engine's
    older = [tmp_path / p.name for p in (a, b)]
    for src, dst in zip((a, b), older):
        dst.write_text(re.sub(r'kv_cache_size_tokens="\d+",', "", src.read_text()))
    assert "kv_cache_size_tokens" not in older[0].read_text()
    t = scan(older[0], "--after", older[1], "--interval", 30)["targets"][0]
    assert t["derived"]["kv_capacity_tokens"] == t["observed"]["kv_cache_tokens"] == 192 // 2 * 128


def test_json_output_stays_json_when_the_evaluation_logs(tmp_path):
    # a GPU hint the server contradicts: the online calibration refuses the fit and logs a
    # warning, which goes to stderr, never into the document on stdout (`scan --json | jq`)
    a = dump(tmp_path, "a.prom", "--scenario", "idle-overprovisioned", at=(120,))
    b = dump(tmp_path, "b.prom", "--scenario", "idle-overprovisioned", at=(240,))
    out = subprocess.run([sys.executable, "-m", "exporter", "scan", str(a), "--after", str(b), "--gpu", "L4",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "calibration rejected" in out.stderr
    assert json.loads(out.stdout)["targets"][0]["target"] == str(a)
