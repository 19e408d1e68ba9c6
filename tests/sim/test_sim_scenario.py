"""Scenario files: every built-in loads and runs and shows its problem; bad files are rejected
with an InputError naming the file and the key."""
from __future__ import annotations

import pytest

from exporter.errors import InputError
from exporter.sim.scenario import FINDINGS, build, builtin_names, load_scenario

REQUIRED = {"healthy", "kv-pressure", "max-num-seqs-too-low", "oversized-max-model-len",
            "low-gpu-memory-utilization", "idle-overprovisioned", "wrong-tier",
            "spec-decode-harmful", "prefix-caching-off", "small-pool-pressure", "max-tokens-bound",
            "cpu-bound-healthy"}


HEALTHY = {"healthy", "cpu-bound-healthy", "max-tokens-bound"}


def test_all_required_builtins_exist_with_ground_truth():
    names = set(builtin_names())
    assert REQUIRED <= names
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name
        assert set(sc.ground_truth) <= set(FINDINGS)
        # the healthy ones: nothing to find (cpu-bound-healthy: busy, max-tokens-bound: length
        # stops of the clients' own max_tokens)
        assert (sc.ground_truth == ()) == (name in HEALTHY), name
        assert sc.detect_within_s and sc.detect_within_s > 0, f"{name}: detect_within missing"
        assert not set(sc.ground_truth) & set(sc.acceptable)


def run(name: str, seconds: float, seed: int = 3):
    st = build(load_scenario(name), seed=seed)
    samples = []
    for t in range(0, int(seconds) + 1, 2):
        st.tick(float(t))
        m = st.engine.metrics
        samples.append((m.running, m.waiting, m.kv_usage, m.counters["preemptions"]))
    return st, samples


def test_scenarios_show_their_problem_within_a_minute():
    """What the drift check needs to see in its 60 s window at default speed."""
    _, s = run("kv-pressure", 60)
    assert s[-1][3] > s[0][3] and max(x[2] for x in s) >= 0.95
    st, s = run("max-num-seqs-too-low", 60)
    cap = st.engine.cfg.max_num_seqs
    assert all(x[0] <= cap for x in s) and sum(x[0] == cap and x[1] > 0 for x in s) > len(s) / 2
    assert max(x[2] for x in s) < 0.5
    st, s = run("low-gpu-memory-utilization", 60)
    assert st.resolved.gpu_memory_utilization <= 0.6 and s[-1][3] > s[0][3]
    st, s = run("idle-overprovisioned", 60)
    assert max(x[0] for x in s) < 0.05 * st.engine.cfg.max_num_seqs and max(x[2] for x in s) < 0.1
    st, _ = run("oversized-max-model-len", 60)
    prompts = st.engine.metrics.hist["prompt_tokens"]
    assert st.max_model_len >= 8 * prompts.sum / prompts.count
    st, _ = run("prefix-caching-off", 10)
    assert not st.engine.cfg.enable_prefix_caching and st.engine.metrics.counters["prefix_queries"] == 0
    st, _ = run("spec-decode-harmful", 30)
    c = st.engine.metrics.counters
    assert c["spec_draft_tokens"] > 0 and c["spec_accepted"] / c["spec_draft_tokens"] < 0.3


def test_healthy_stays_healthy_over_ten_minutes():
    for seed in (1, 2, 3):
        _, s = run("healthy", 600, seed)
        assert s[-1][3] == 0, "no preemptions"
        assert max(x[1] for x in s) <= 2, "no real queue"
        assert max(x[2] for x in s) < 0.85, "KV comfortable"
        assert sum(x[0] for x in s) / len(s) >= 8, "a real batch, not idle"


def test_phases_change_traffic_mid_run():
    sc = load_scenario("traffic-shift")
    assert len(sc.phases) == 2 and sc.phases[1].at_s == 300
    st = build(sc, seed=1)
    for t in range(0, 240, 5):
        st.tick(float(t))
    assert st.engine.metrics.counters["preemptions"] == 0
    for t in range(240, 700, 5):
        st.tick(float(t))
    assert st.engine.metrics.counters["preemptions"] > 0


def write(tmp_path, text: str):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return str(p)


BASE = "model: meta-llama/Llama-3.1-8B-Instruct\ngpu: L4\ntraffic: {rate: 1}\n"


@pytest.mark.parametrize("text,key", [
    (BASE + "vllm: {max_num_seqz: 4}\n", "vllm.max_num_seqz"),
    (BASE + "vllm: {max_num_seqs: many}\n", "vllm.max_num_seqs"),
    (BASE + "vllm: {gpu_memory_utilization: 1.5}\n", "vllm.gpu_memory_utilization"),
    (BASE + "vllm: {enable_prefix_caching: maybe}\n", "vllm.enable_prefix_caching"),
    ("model: x\ngpu: L4\ntraffic: {rate: -1}\n", "traffic.rate"),
    ("model: x\ngpu: L4\ntraffic: {burst: 2}\n", "traffic.burst"),
    ("model: x\ngpu: L4\ntraffic: {}\n", "traffic.rate"),
    ("gpu: L4\ntraffic: {rate: 1}\n", "model"),
    (BASE + "traffic_typo: 1\n", "traffic_typo"),
    (BASE + "ground_truth: [kv_presure]\n", "ground_truth"),
    (BASE + "phases: [{traffic: {rate: 2}}]\n", "phases[0].at"),
    (BASE + "phases: [{at: soon, traffic: {rate: 2}}]\n", "phases[0].at"),
    (BASE.replace("{rate: 1}", "{rate: 1, prompt: {mean: 10, kind: zipf}}"), "traffic.prompt.kind"),
    (BASE + "vllm: {speculative: {num_speculative_tokens: 2, acceptance: 2}}\n",
     "vllm.speculative.acceptance"),
])
def test_bad_scenario_files_name_the_file_and_key(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert path in msg and key in msg, msg


def test_bad_yaml_and_unknown_names(tmp_path):
    path = write(tmp_path, "model: [unclosed\n")
    with pytest.raises(InputError, match="bad.yaml.*line"):
        load_scenario(path)
    with pytest.raises(InputError, match="unknown scenario 'no-such'.*healthy"):
        load_scenario("no-such")
    with pytest.raises(InputError, match="empty scenario"):
        load_scenario(write(tmp_path, ""))


def test_unknown_model_or_gpu_and_unfitting_context_are_input_errors(tmp_path):
    with pytest.raises(InputError):
        build(load_scenario(write(tmp_path, BASE.replace("gpu: L4", "gpu: Z9000"))))
    with pytest.raises(InputError, match="max_model_len"):
        build(load_scenario(write(tmp_path, BASE + "vllm: {num_gpu_blocks: 10, max_model_len: 4096}\n")))


def test_user_scenario_file_runs(tmp_path):
    path = write(tmp_path, "model: meta-llama/Llama-3.1-8B-Instruct\ngpu: L4\n"
                 "vllm: {max_model_len: 4096, num_gpu_blocks: 600}\n"
                 "traffic: {rate: 2, prompt: {mean: 500}, output: {mean: 300}}\n")
    st = build(load_scenario(path), seed=1)
    st.tick(30.0)
    assert st.engine.metrics.counters["generation_tokens"] > 0
    assert st.engine.cfg.num_gpu_blocks == 600


def test_model_gpu_version_and_speed_overrides():
    sc = load_scenario("healthy")
    base = build(sc, seed=1)
    bigger = build(sc, seed=1, gpu="L40S")
    assert bigger.engine.cfg.num_gpu_blocks > 2 * base.engine.cfg.num_gpu_blocks
    other = build(sc, seed=1, model="Qwen/Qwen3-8B")
    assert other.model_name == "Qwen/Qwen3-8B"
    assert other.engine.cfg.num_gpu_blocks != base.engine.cfg.num_gpu_blocks
    assert build(sc, seed=1, version="0.7.0").era.key == "0.7"
    fast = build(sc, seed=1, speed=6.0)
    fast.tick(10.0)
    assert fast.engine.now == pytest.approx(sc.warmup_s + 60.0, abs=2.0)
    with pytest.raises(InputError, match="--vllm-version"):
        build(sc, version="latest")


def test_fleet_config_errors_name_the_key(tmp_path):
    from exporter.sim.fleet import load_fleet_config
    p = tmp_path / "fleet.yaml"
    for text, key in (("targets: 0\n", "targets"), ("targets: 5\nengins: 2\n", "engins"),
                      ("targets: 5\nscenarios: healthy\n", "scenarios"),
                      ("targets: 5\nspeed: -1\n", "speed"), ("- 1\n", "targets")):
        p.write_text(text)
        with pytest.raises(InputError) as err:
            load_fleet_config(str(p))
        assert str(p) in str(err.value) and key in str(err.value), str(err.value)
    p.write_text("targets: 12\nengines: 3\nscenarios: [healthy, kv-pressure]\nvllm_versions: [0.7.0, 0.32.0]\n")
    spec = load_fleet_config(str(p))
    assert (spec.targets, spec.engines) == (12, 3)


def test_the_documented_scenario_format_is_valid():
    import textwrap

    import yaml

    import exporter.sim as sim
    from exporter.sim.scenario import parse_scenario
    doc = textwrap.dedent(sim.__doc__.split("::", 1)[1])
    sc = parse_scenario(yaml.safe_load(doc), "exporter/sim/__init__.py")
    assert sc.flags.spec_tokens == 3 and sc.phases[1].at_s == 300
    assert sc.restarts[0][0] == 480 and sc.restarts[0][1].gpu_memory_utilization == 0.8
    assert sc.restarts[0][1].spec_tokens == 3      # the rest of the flags carry over
    assert sc.phases[0].traffic.burst_period_s == 30 and sc.phases[0].traffic.client_timeout_s == 600
    assert sc.phases[1].traffic.rate == 3.0 and sc.phases[1].traffic.max_tokens == 1024
    st = build(sc, seed=1)
    st.tick(5.0)
    assert st.engine.metrics.counters["steps"] > 0


def test_a_phase_with_vllm_flags_is_a_redeploy(tmp_path):
    """Config drift over time: at minute 2 the server restarts with a lower
    gpu_memory_utilization -- counters start again from zero and cache_config_info changes."""
    from prometheus_client.parser import text_string_to_metric_families
    path = write(tmp_path, BASE.replace("traffic: {rate: 1}", "traffic: {rate: 0.5}")
                 + "vllm: {max_model_len: 4096, gpu_memory_utilization: 0.9}\n"
                 "phases:\n  - at: 2m\n    vllm: {gpu_memory_utilization: 0.8}\n")
    sc = load_scenario(path)
    assert len(sc.restarts) == 1 and sc.restarts[0][1].gpu_memory_utilization == 0.8
    st = build(sc, seed=1, start_time=1.7e9)

    def sample(name, label=None):
        fams = {f.name: f for f in text_string_to_metric_families(st.exposition())}
        s = fams[name].samples[0]
        return s.labels[label] if label else s.value
    st.tick(110.0)
    gen_before = sample("vllm:generation_tokens")
    blocks_before = int(sample("vllm:cache_config_info", "num_gpu_blocks"))
    created_before = sample("vllm:generation_tokens_created")
    st.tick(130.0)
    assert sample("vllm:generation_tokens") < gen_before          # a counter reset
    assert int(sample("vllm:cache_config_info", "num_gpu_blocks")) < blocks_before
    assert sample("vllm:cache_config_info", "gpu_memory_utilization") == "0.8"
    assert sample("vllm:generation_tokens_created") >= created_before + 119
    st.tick(200.0)
    assert st.sim_time == pytest.approx(200.0, abs=1.0) and sample("vllm:generation_tokens") > 0


def test_a_redeploy_that_cannot_start_fails_at_load(tmp_path):
    path = write(tmp_path, BASE + "vllm: {max_model_len: 4096}\n"
                 "phases:\n  - at: 1m\n    vllm: {num_gpu_blocks: 8}\n")
    with pytest.raises(InputError, match="redeploy"):
        build(load_scenario(path))


def test_a_pool_given_in_bytes_or_blocks_is_sized_by_the_calculator(tmp_path):
    """`kv_cache_memory_bytes` / `num_gpu_blocks` in a scenario size the simulated pool as
    `calc --kv-cache-memory-bytes` / `--num-gpu-blocks-override` do (one accounting), and a pool
    that cannot fit beside the weights is refused naming the scenario file."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from exporter.sim.scenario import resolve
    base = load_scenario("healthy")
    for extra, flag in (({"kv_cache_memory_bytes": 4 * 2**30}, ("--kv-cache-memory-bytes", str(4 * 2**30))),
                        ({"num_gpu_blocks": 700}, ("--num-gpu-blocks-override", "700"))):
        p = tmp_path / "sc.yaml"
        text = (Path(base.source).read_text() if Path(base.source).exists() else None)
        assert text is not None
        p.write_text(text.replace("vllm:\n", "vllm:\n" + "".join(f"  {k}: {v}\n" for k, v in extra.items()), 1))
        res = resolve(load_scenario(str(p)))
        f = base.flags
        out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", base.model, "--gpu", base.gpu,
                              "--max-model-len", str(f.max_model_len), "--max-num-batched-tokens",
                              str(f.max_num_batched_tokens), "--vllm-version", base.vllm_version, *flag,
                              "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert res.config.num_gpu_blocks == json.loads(out.stdout)["kv_cache"]["gpu_blocks"]
    p.write_text(text.replace("vllm:\n", "vllm:\n  kv_cache_memory_bytes: 40000000000\n", 1))
    with pytest.raises(InputError, match=f"{p}: vllm: --kv-cache-memory-bytes .* does not fit beside weights"):
        resolve(load_scenario(str(p)))
