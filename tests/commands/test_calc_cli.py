"""`vllm-drift calc` as a user runs it: a real subprocess, its exit status, stdout and stderr."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def calc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "calc", *args],
                          capture_output=True, text=True, timeout=120)


LLAMA_H100 = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--gpu-memory-gib", "79.19",
              "--gpu-memory-utilization", "0.95", "--max-model-len", "8192", "--vllm-version", "0.19.0")


def test_json_document_has_the_documented_shape():
    out = calc(*LLAMA_H100, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # stdout is one JSON document and nothing else
    assert {"bytes_per_token", "tokens", "gpu_blocks", "max_concurrency"} <= set(doc["kv_cache"])
    assert {"weights_gib", "activation_gib", "non_torch_gib", "kv_cache_gib"} <= set(doc["memory"])
    assert {"ttft_s", "tpot_s", "output_tokens_per_s"} <= set(doc["predicted"])
    assert {"max_num_seqs", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
            "speculative_decoding"} <= set(doc["recommendation"])
    assert isinstance(doc["tiers"], list)
    for tier in doc["tiers"]:
        assert {"gpu", "tp", "replicas", "dollars_per_hour", "dollars_per_million_tokens", "meets_slo"} <= set(tier)
    # vLLM 0.19 logged "GPU KV cache size: 476,016 tokens" and 58.11x for this setup
    assert doc["kv_cache"]["bytes_per_token"] == 131072
    assert doc["kv_cache"]["tokens"] == pytest.approx(476016, rel=0.005)
    assert doc["kv_cache"]["max_concurrency"] == pytest.approx(58.11, rel=0.005)


def test_human_output_is_a_table():
    out = calc(*LLAMA_H100)
    assert out.returncode == 0, out.stderr
    assert "GPU KV cache size" in out.stdout and "weights" in out.stdout


def test_local_config_json_as_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 4, "intermediate_size": 8192, "vocab_size": 32000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
    out = calc("--model", str(tmp_path), "--gpu", "L4", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kv_cache"]["bytes_per_token"] == 2 * 16 * 4 * 128 * 2
    assert doc["setup"]["max_model_len"] == 4096  # the model's max position embeddings


@pytest.mark.parametrize("flag, value, expected", [
    ("--model", "meta-llama/Llama-3.1-9B-Instruct", "Llama-3.1-8B"),
    ("--gpu", "H110", "H100-SXM-80GB"),
])
def test_unknown_names_exit_2_with_the_closest(flag, value, expected):
    args = dict(zip(LLAMA_H100[::2], LLAMA_H100[1::2]))
    args[flag] = value
    out = calc(*[x for kv in args.items() for x in kv], "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    assert expected in out.stderr and "closest" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_impossible_max_model_len_exits_2_with_the_largest_that_fits():
    out = calc("--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100", "--tp", "2",
               "--max-model-len", "131072", "--json")
    assert out.returncode == 2
    assert "estimated maximum model length is" in out.stderr


def test_weights_that_do_not_fit_exit_2():
    out = calc("--model", "meta-llama/Llama-3.1-405B-Instruct", "--gpu", "T4-16GB", "--max-model-len", "4096")
    assert out.returncode == 2 and "does not fit" in out.stderr


def test_bad_flag_values_exit_2():
    assert calc(*LLAMA_H100, "--tp", "0").returncode == 2
    assert calc(*LLAMA_H100, "--gpu-memory-utilization", "1.5").returncode == 2
    assert calc(*LLAMA_H100, "--kv-cache-dtype", "int3").returncode == 2
    assert calc(*LLAMA_H100, "--vllm-version", "tuesday").returncode == 2   # "latest" is a main-branch build


def test_help_exits_0():
    out = calc("--help")
    assert out.returncode == 0
    for flag in ("--model", "--gpu", "--gpu-memory-gib", "--tp", "--pp", "--dtype", "--quantization",
                 "--kv-cache-dtype", "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs",
                 "--max-num-batched-tokens", "--block-size", "--vllm-version", "--prompt-tokens",
                 "--output-tokens", "--rate", "--concurrency", "--prefix-hit-ratio", "--ttft-slo",
                 "--tpot-slo", "--spec-tokens", "--spec-acceptance", "--json"):
        assert flag in out.stdout


@pytest.mark.parametrize("extra, truth", [
    # llm-d-planner sweep, vLLM 0.19 on H100: runtime --quantization fp8 (vLLM's own KV default,
    # said explicitly: without it calc assumes an FP8 deployment's FP8 cache) and pipeline parallel
    (("--quantization", "fp8", "--kv-cache-dtype", "auto"), 529248),
    (("--pp", "2"), 1075312),
    (("--kv-cache-dtype", "fp8"), 952032),
])
def test_flags_the_observation_csv_cannot_express(extra, truth):
    out = calc(*LLAMA_H100, *extra, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_cache"]["tokens"] == pytest.approx(truth, rel=0.01)


def test_fp8_weights_without_a_kv_dtype_assume_an_fp8_cache_and_say_so():
    """FP8/FP4 deployments are served with an FP8 cache (ModelOpt checkpoints, benchmark recipes):
    calc assumes it when --kv-cache-dtype is not given, says so, and keeps vLLM's own `auto`
    when it is; a 16-bit model keeps vLLM's default without a note."""
    fp8 = calc(*LLAMA_H100, "--quantization", "fp8", "--json")
    auto = calc(*LLAMA_H100, "--quantization", "fp8", "--kv-cache-dtype", "auto", "--json")
    plain = calc(*LLAMA_H100, "--json")
    assert fp8.returncode == auto.returncode == plain.returncode == 0, fp8.stderr + auto.stderr
    d_fp8, d_auto, d_plain = (json.loads(o.stdout) for o in (fp8, auto, plain))
    assert d_fp8["setup"]["kv_cache_dtype"] == "fp8" and d_auto["setup"]["kv_cache_dtype"] == "auto"
    assert d_fp8["kv_cache"]["bytes_per_token"] * 2 == d_auto["kv_cache"]["bytes_per_token"]
    assert d_fp8["kv_cache"]["tokens"] > 1.9 * d_auto["kv_cache"]["tokens"]
    assert any("KV cache fp8 assumed" in n for n in d_fp8["notes"]) and "--kv-cache-dtype auto" in fp8.stderr
    assert not any("assumed" in n and "KV" in n for n in d_auto["notes"] + d_plain["notes"])
    assert d_plain["setup"]["kv_cache_dtype"] == "auto"


def test_default_max_model_len_is_fitted_but_an_explicit_one_is_not():
    base = ("--model", "openai/gpt-oss-120b", "--gpu", "H100", "--tp", "1")
    out = calc(*base, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    fitted = doc["setup"]["max_model_len"]
    assert 0 < fitted < 131072 and "does not fit" in doc["notes"][0] and "note:" in out.stderr
    assert doc["kv_cache"]["max_concurrency"] >= 1.0
    bad = calc(*base, "--max-model-len", "131072")
    assert bad.returncode == 2 and f"estimated maximum model length is {fitted}" in bad.stderr


@pytest.mark.parametrize("model, tp, says", [
    # vLLM's ModelConfig.verify_with_parallel_config
    ("meta-llama/Llama-3.1-8B-Instruct", "3", "Total number of attention heads (32) must be divisible by "
                                              "tensor parallel size (3)"),
    # 28 query heads split over 7 ranks, but 4 KV heads neither divide 7 nor are divided by it
    ("Qwen/Qwen2.5-7B-Instruct", "7", "4 KV heads cannot be split over tensor parallel size 7"),
])
def test_a_tp_vllm_refuses_is_refused(model, tp, says):
    out = calc("--model", model, "--gpu", "H100", "--tp", tp, "--max-model-len", "4096", "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1
    # the same model at a TP vLLM runs (Llama's 8 KV heads replicated twice over 16 ranks)
    ok = calc("--model", model, "--gpu", "H100", "--tp", "16" if tp == "3" else "4", "--max-model-len", "4096")
    assert ok.returncode == 0, ok.stderr


def test_token_counts_are_read_as_vllm_reads_them():
    """`--max-model-len` and `--max-num-batched-tokens` take vLLM's own syntax: 32k is 32,000 and
    32K 32,768, and `auto` / -1 is vLLM's auto-fit (the model's length, lowered to the largest
    the KV cache holds); what vLLM refuses exits 2 with the reason."""
    def doc(*extra):
        out = calc("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", *extra, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout), out.stderr
    assert doc("--max-model-len", "32k")[0]["setup"]["max_model_len"] == 32000
    assert doc("--max-model-len", "32K")[0]["setup"]["max_model_len"] == 32768
    assert doc("--max-num-batched-tokens", "4k", "--max-model-len", "4096")[0]["setup"]["max_num_batched_tokens"] == 4000
    auto, err = doc("--max-model-len", "auto")
    default, _ = doc()                   # the default is fitted the same way, with another note
    fitted = auto["setup"]["max_model_len"]
    assert fitted == default["setup"]["max_model_len"] and 4096 < fitted < 131072
    assert f"reduced from 131072 to {fitted}" in err and auto["kv_cache"]["fits"]
    assert doc("--max-model-len", "-1")[0]["setup"]["max_model_len"] == fitted
    # one token more than the fit is refused as vLLM refuses it
    over = calc("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len", str(fitted + 16))
    assert over.returncode == 2 and f"estimated maximum model length is {fitted}" in over.stderr
    # auto keeps the model's own length where it fits
    small, err = doc("--max-model-len", "auto", "--gpu", "H200")
    assert small["setup"]["max_model_len"] == 131072 and "fits the KV cache" in err
    for bad, says in (("1.5K", "decimals are not allowed with the binary suffix K"), ("0", "must be positive"),
                      ("lots", "not a token count")):
        out = calc(*LLAMA_H100[:-4], "--max-model-len", bad)
        assert out.returncode == 2 and says in out.stderr, out.stderr


def test_kv_cache_memory_bytes_is_the_pool_whatever_the_utilization():
    """`--kv-cache-memory-bytes` (vLLM's `determine_available_memory` returns it as given): the
    pool is those bytes in whole blocks, gpu_memory_utilization does not move it, and a pool that
    does not fit beside the weights is refused with the most that would."""
    def doc(*extra):
        out = calc(*LLAMA_H100, *extra, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    given = doc("--kv-cache-memory-bytes", "20G")
    page = 16 * given["kv_cache"]["bytes_per_token"]           # one 16-token block, every layer
    assert given["kv_cache"]["gpu_blocks"] == 20 * 2**30 // page
    assert given["kv_cache"]["tokens"] == given["kv_cache"]["gpu_blocks"] * 16
    assert given["memory"]["kv_cache_gib"] == pytest.approx(20.0, abs=0.01)
    assert doc("--kv-cache-memory-bytes", "20G", "--gpu-memory-utilization", "0.5")["kv_cache"] == given["kv_cache"]
    assert doc("--kv-cache-memory-bytes", "20g")["kv_cache"]["gpu_blocks"] == 20 * 10**9 // page
    assert given["setup"]["kv_cache_memory_bytes"] == 20 * 2**30
    m = given["memory"]
    most = 79.19 - m["weights_gib"] - m["activation_gib"] - m["non_torch_gib"] - m["cudagraph_gib"]
    big = calc(*LLAMA_H100, "--kv-cache-memory-bytes", f"{int(most + 1)}G")
    assert big.returncode == 2 and "does not fit beside weights" in big.stderr
    assert f"the most is about {round(most, 2)}" in big.stderr
    assert calc(*LLAMA_H100, "--kv-cache-memory-bytes", f"{int(most - 1)}G").returncode == 0


def test_num_gpu_blocks_override_is_the_pool_in_blocks():
    out = calc(*LLAMA_H100, "--num-gpu-blocks-override", "1000", "--json")
    assert out.returncode == 0, out.stderr
    kv = json.loads(out.stdout)["kv_cache"]
    assert kv["gpu_blocks"] == 1000 and kv["tokens"] == 1000 * 16
    assert kv["max_concurrency"] == pytest.approx(1000 / (8192 / 16), abs=0.01)
    big = calc(*LLAMA_H100, "--num-gpu-blocks-override", "100000")
    assert big.returncode == 2 and "--num-gpu-blocks-override 100000" in big.stderr and "does not fit" in big.stderr


def test_enforce_eager_frees_the_graph_pool_and_waits_on_kernel_launches():
    """--enforce-eager: vLLM captures no CUDA graphs, so from 0.21 (which subtracts the graph
    estimate) the pool grows by it; a small batch's step is the host launching every layer's
    kernels (perf.EAGER_LAYER_LAUNCH_S), a large batch's is the GPU's work, as with graphs."""
    from exporter.model.perf import EAGER_LAYER_LAUNCH_S
    base = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192",
            "--vllm-version", "0.21.0", "--prompt-tokens", "512", "--output-tokens", "256", "--json")

    def doc(*extra):
        out = calc(*base, *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    graphs, eager = doc("--concurrency", "1"), doc("--concurrency", "1", "--enforce-eager")
    assert graphs["memory"]["cudagraph_gib"] > 0 and eager["memory"]["cudagraph_gib"] == 0
    assert eager["memory"]["kv_cache_gib"] == pytest.approx(
        graphs["memory"]["kv_cache_gib"] + graphs["memory"]["cudagraph_gib"], abs=0.01)
    # batch 1: 32 layers of launches (15.4 ms) outlast the whole step with graphs (~7.6 ms); at
    # 256 requests the GPU's step (~30 ms) outlasts the launches
    assert eager["predicted"]["tpot_s"] >= 32 * EAGER_LAYER_LAUNCH_S > graphs["predicted"]["tpot_s"]
    busy_graphs, busy_eager = doc("--concurrency", "256"), doc("--concurrency", "256", "--enforce-eager")
    assert busy_eager["predicted"]["tpot_s"] == pytest.approx(busy_graphs["predicted"]["tpot_s"], rel=0.02)


@pytest.mark.parametrize("extra, says", [
    # vLLM's SchedulerConfig checks (V1 verify_max_model_len, V0 _verify_args)
    (("--max-num-batched-tokens", "128", "--max-num-seqs", "256"),
     "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)"),
    (("--vllm-version", "0.6.0", "--max-num-batched-tokens", "4096"),
     "max_num_batched_tokens (4096) is smaller than max_model_len (8192) without chunked prefill"),
    # ModelConfig's derived length (Llama-3.1: 131072), unless the env var vLLM honours is set
    (("--max-model-len", "200000"), "greater than the derived max_model_len (131072)"),
])
def test_scheduler_and_length_settings_vllm_refuses_are_refused(extra, says):
    out = calc(*LLAMA_H100, *extra, "--json")
    assert out.returncode == 2 and out.stdout == "" and says in out.stderr, out.stderr


def test_a_long_max_model_len_is_taken_where_vllm_takes_it():
    env = {**os.environ, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", *LLAMA_H100, "--max-model-len", "200000",
                          "--gpu", "H200", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["setup"]["max_model_len"] == 200000
    # the V0 check applies without chunked prefill only: a large enough budget starts
    assert calc(*LLAMA_H100, "--vllm-version", "0.6.0", "--max-num-batched-tokens", "8192").returncode == 0


def test_a_config_without_a_length_key_takes_the_given_max_model_len(tmp_path):
    """vLLM's _get_and_verify_max_len: with no length key in config.json a --max-model-len is
    used as given (Mamba's configs have none; vLLM 0.32 serves a tiny one at 4096); without the
    flag the length is 2048. A config that names 2048 refuses 4096."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    given = calc("--model", str(tmp_path), "--gpu", "H100", "--max-model-len", "4096", "--json")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["setup"]["max_model_len"] == 4096
    assert json.loads(calc("--model", str(tmp_path), "--gpu", "H100", "--json").stdout)["setup"]["max_model_len"] == 2048
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    named = calc("--model", str(tmp_path), "--gpu", "H100", "--max-model-len", "4096", "--json")
    assert named.returncode == 2 and "greater than the derived max_model_len (2048)" in named.stderr


def test_chunked_prefill_flag_sets_what_one_step_must_hold():
    """V0 refuses a budget below max_model_len unless --enable-chunked-prefill; V1 without
    chunked prefill raises its default budget to max_model_len (and profiles that many tokens)."""
    v0 = calc(*LLAMA_H100, "--vllm-version", "0.6.0", "--max-num-batched-tokens", "4096", "--enable-chunked-prefill",
              "--json")
    assert v0.returncode == 0, v0.stderr
    assert json.loads(v0.stdout)["setup"]["max_num_batched_tokens"] == 4096
    # few sequences, so the forward pass, not the sampler, is the profile's peak
    few = ("--max-model-len", "16384", "--max-num-seqs", "16", "--json")
    chunked = json.loads(calc(*LLAMA_H100, *few).stdout)
    whole = json.loads(calc(*LLAMA_H100, *few, "--no-enable-chunked-prefill").stdout)
    assert chunked["setup"]["max_num_batched_tokens"] == 8192 and whole["setup"]["max_num_batched_tokens"] == 16384
    assert whole["memory"]["activation_gib"] > chunked["memory"]["activation_gib"]
    assert whole["kv_cache"]["tokens"] < chunked["kv_cache"]["tokens"]


def test_vllm_use_v1_zero_runs_v0_where_it_ships_and_is_refused_where_vllm_refuses():
    """VLLM_USE_V1 is read from calc's environment as vLLM reads it: 0 on 0.8-0.10 runs V0 (its
    '# GPU blocks' accounting and profile), 0 from 0.11 exits 2 (its API server asserts V1), and
    1 where the release runs the deployment on V0 only (a T4 before 0.10.2) exits 2."""
    env = lambda value: {**os.environ, "VLLM_USE_V1": value}
    run = lambda value, *args: subprocess.run([sys.executable, "-m", "exporter", "calc", *args, "--json"],
                                              capture_output=True, text=True, timeout=120, env=env(value))
    h100 = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--max-model-len", "8192")
    v0 = run("0", *h100, "--vllm-version", "0.9.0")
    v1 = run("1", *h100, "--vllm-version", "0.9.0")
    assert v0.returncode == 0 and v1.returncode == 0, v0.stderr + v1.stderr
    assert "runs the V0 engine as VLLM_USE_V1=0 asks" in v0.stderr
    # V0 profiles one un-chunked prefill of the context (8,192 tokens) and 256 sequences' sampler
    assert json.loads(v0.stdout)["setup"]["max_num_seqs"] == 256
    assert json.loads(v1.stdout)["setup"]["max_num_seqs"] == 1024
    gone = run("0", *h100, "--vllm-version", "0.11.0")
    assert gone.returncode == 2 and "VLLM_USE_V1=0: vLLM 0.11.0 ships no V0 engine" in gone.stderr
    t4 = run("1", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "T4", "--dtype", "float16",
             "--max-model-len", "8192", "--vllm-version", "0.9.0")
    assert t4.returncode == 2 and "VLLM_USE_V1=1: vLLM 0.9.0 runs this deployment on V0 only" in t4.stderr
    assert run("maybe", *h100).returncode == 2


def test_boolean_engine_flags_take_the_value_forms_of_vllms_older_parser():
    """A V0 command line pasted as it was run: `--enable-chunked-prefill=False` and
    `--enable-chunked-prefill False` (V0's StoreBoolean) mean what `--no-enable-chunked-prefill`
    means; a value that is not a boolean, or one given to a `--no-` flag, exits 2 naming the flag."""
    few = ("--max-model-len", "16384", "--max-num-seqs", "16", "--json")
    tokens = lambda *flags: json.loads(calc(*LLAMA_H100, *few, *flags).stdout)["setup"]["max_num_batched_tokens"]
    assert tokens("--enable-chunked-prefill=False") == tokens("--enable-chunked-prefill", "false") \
        == tokens("--no-enable-chunked-prefill") == 16384
    assert tokens("--enable-chunked-prefill=true") == tokens("--enable-chunked-prefill") == 8192
    bad = calc(*LLAMA_H100, "--enable-chunked-prefill", "maybe", "--json")
    assert bad.returncode == 2 and "--enable-chunked-prefill: 'maybe' is not a boolean" in bad.stderr
    negated = calc(*LLAMA_H100, "--no-enable-prefix-caching=true", "--json")
    assert negated.returncode == 2 and "--no-enable-prefix-caching takes no value" in negated.stderr


@pytest.mark.parametrize("gpu, extra, says", [
    ("T4", ("--dtype", "bfloat16"), "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"),
    ("T4", ("--quantization", "fp8"), "fp8 is not supported for T4: minimum capability 80, current capability 75"),
    ("V100-SXM2-32GB", ("--quantization", "awq"), "awq is not supported for V100-SXM2-32GB: minimum capability 75"),
])
def test_what_the_device_cannot_run_is_refused(gpu, extra, says):
    base = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "2", "--max-model-len", "2048", "--gpu", gpu)
    out = calc(*base, *extra, "--json")
    assert out.returncode == 2 and out.stdout == "" and says in out.stderr, out.stderr
    # what vLLM does run there: auto falls back to float16 on Turing; AWQ runs on Turing
    if gpu == "T4":
        ok = calc(*base, "--json")
        assert ok.returncode == 0 and json.loads(ok.stdout)["setup"]["dtype"] == "float16"
        assert calc(*base, "--quantization", "awq").returncode == 0


@pytest.mark.parametrize("param", ["tp", "kv_cache_dtype"])
def test_a_sweep_keeps_every_other_flag_of_the_setup(param):
    """A trade-off row rebuilt for another TP or KV dtype keeps the rest of the deployment: at the
    setup's own value it is the setup (data parallel, expert parallel, the pool given in bytes,
    eager mode), and the TPs vLLM refuses are not offered."""
    out = calc("--model", "Qwen/Qwen3-30B-A3B-Instruct-2507", "--gpu", "H100", "--tp", "2", "--data-parallel", "2",
               "--enable-expert-parallel", "--kv-cache-memory-bytes", "20G", "--kv-cache-dtype", "auto",
               "--enforce-eager", "--max-model-len", "8192", "--concurrency", "4", "--sweep", param, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    own = 2 if param == "tp" else "auto"
    [row] = [r for r in doc["sweep"]["rows"] if r["value"] == own]
    assert row["kv_tokens"] == doc["kv_cache"]["tokens"]
    assert row["tpot_p50_s"] == pytest.approx(doc["predicted"]["tpot_s"], rel=0.02)
    if param == "tp":   # 32 query heads, 4 KV heads: 1, 2, 4 and 8 all run
        assert [r["value"] for r in doc["sweep"]["rows"]] == [1, 2, 4, 8]


def test_a_hybrid_mamba_moe_model_is_sized_and_predicted():
    """Nemotron-H hybrids (one block per layer: Mamba2, attention, MoE) once ended in a
    traceback; the calculator now sizes and predicts them like any other model."""
    out = calc("--model", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8", "--gpu", "H100-SXM-80GB",
               "--max-model-len", "32768", "--vllm-version", "0.19.0", "--concurrency", "32",
               "--prompt-tokens", "1024", "--output-tokens", "256", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kv_cache"]["bytes_per_token"] == 6 * 2 * 2 * 128 * 2
    assert doc["kv_cache"]["tokens"] > 0 and doc["predicted"]["tpot_s"] > 0
    # FP8 linear layers (31.6B parameters in all): about half the 58.9 GiB the BF16 release loads
    assert 28.0 < doc["memory"]["weights_gib"] < 32.0


def test_a_pre_ampere_gpu_on_a_v1_release_is_sized_as_v0_and_says_so():
    """vLLM 0.8-0.10.1 fell back to V0 below compute capability 8.0: a V100 at 0.8.5 profiles
    its whole 32,768-token context in one prefill (a public startup logged 9.88 GiB of KV cache,
    tests/model/test_public_startups_gpus.py), and calc says why the log shows '# GPU blocks'."""
    base = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "Tesla V100-SXM2-32GB", "--dtype", "float16", "--json"]
    old, new = calc(*base, "--vllm-version", "0.8.5"), calc(*base, "--vllm-version", "0.10.2")
    assert old.returncode == 0 and new.returncode == 0, old.stderr + new.stderr
    d_old, d_new = json.loads(old.stdout), json.loads(new.stdout)
    assert any("runs the V0 engine on V100-SXM2-32GB" in n and "32768 tokens" in n for n in d_old["notes"])
    assert "V0 engine" in old.stderr and not any("V0 engine" in n for n in d_new["notes"])
    assert d_old["memory"]["kv_cache_gib"] == pytest.approx(9.88, abs=0.5)
    assert d_new["memory"]["kv_cache_gib"] > d_old["memory"]["kv_cache_gib"] + 2
