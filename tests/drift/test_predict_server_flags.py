"""Engine flags the daemon learns besides the metrics' own numbers, and that change what vLLM
sizes: `--[no-]async-scheduling` (a hint: targets[], file_sd labels, a pod's `vllm serve`
arguments, `scan --no-async-scheduling`), and a hybrid's Mamba state dtypes (the
`mamba_cache_dtype` / `mamba_ssm_cache_dtype` labels of `cache_config_info`, as resolved)."""
from __future__ import annotations

from exporter.config import TargetSpec
from exporter.discovery.kubernetes import pod_target
from exporter.drift.inputs import DriftInput
from exporter.drift.predict import identify, setup_for
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup
from exporter.parse.cache_config import read_cache_config
from exporter.parse.canonical import parse_vllm

from conftest import VLLM_CPU

GPT_OSS = "openai/gpt-oss-20b"


def _setup(spec: TargetSpec, x: DriftInput, version: str = "0.32.0"):
    ident = identify(spec, x.model_name, wait=True)
    return ident, setup_for(ident, x, version)


def test_async_scheduling_hint_sizes_sliding_windows_as_the_server_runs():
    """From 0.26 a sliding-window request is sized for every batch in flight: two under async
    scheduling (the GPU default from 0.14), one without. A server started with
    --no-async-scheduling therefore holds more full-context requests than the default predicts;
    the hint comes from the config, a file_sd label or the pod's arguments, and False is kept
    (it is a statement, not an absent hint)."""
    x = DriftInput(target="t", model_name=GPT_OSS, max_model_len=131072.0)
    base = dict(url="http://127.0.0.1:8000", model=GPT_OSS, gpu="H100", tp=2)
    default_ident, default = _setup(TargetSpec(**base), x)
    assert default_ident.async_scheduling is None and default.async_scheduling
    pod = pod_target({"metadata": {"name": "g"}, "spec": {"containers": [{"name": "vllm", "args": [
        "vllm", "serve", GPT_OSS, "--no-async-scheduling"]}]}}, 8000)
    assert pod.labels["async_scheduling"] == "false"
    for spec in (TargetSpec(**base, async_scheduling=False),
                 TargetSpec(**base, labels={"async_scheduling": "false"}),
                 TargetSpec(**base, labels={"async_scheduling": pod.labels["async_scheduling"]})):
        ident, off = _setup(spec, x)
        assert ident.async_scheduling is False and not off.async_scheduling
        assert off.max_in_flight_tokens == default.max_in_flight_tokens // 2
        assert kv_capacity(off).max_concurrency > kv_capacity(default).max_concurrency
    # before 0.26 the hint changes nothing the pool holds
    _, old_off = _setup(TargetSpec(**base, async_scheduling=False), x, "0.25.0")
    _, old_on = _setup(TargetSpec(**base), x, "0.25.0")
    assert kv_capacity(old_off).tokens == kv_capacity(old_on).tokens


def test_mamba_state_dtypes_as_the_server_reports_them():
    """vLLM 0.32's `cache_config_info` carries the hybrids' state dtypes (the CPU captures: "auto");
    a server whose temporal state runs in float16 (`--mamba-ssm-cache-dtype float16`, or a release
    whose Nemotron-H default was float16) says so in the label, and the daemon predicts its pool
    with it: a Nemotron-3 Nano state of half the bytes, a smaller attention block."""
    [snap] = parse_vllm((VLLM_CPU / "vllm-0.32.0-cpu-dp2-a.prom").read_bytes(), target="t", timestamp=0.0)
    cc = snap.config
    assert cc.mamba_cache_dtype == "auto" and cc.mamba_ssm_cache_dtype == "auto"
    model = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    spec = TargetSpec(url="http://127.0.0.1:8000", model=model, gpu="H100")
    setups = {}
    for label in ("auto", "float32", "float16"):
        x = DriftInput(target="t", model_name=model, max_model_len=32768.0, mamba_ssm_cache_dtype=label)
        setups[label] = _setup(spec, x)[1]
    assert setups["auto"].state_bytes() == setups["float32"].state_bytes()   # its config: float32
    half = setups["float16"]
    assert half.mamba_ssm_cache_dtype == "float16" and half.state_bytes() < setups["auto"].state_bytes()
    assert kv_capacity(half).tokens == kv_capacity(Setup.build(
        model, "H100", max_model_len=32768, vllm_version="0.32.0", mamba_ssm_cache_dtype="float16")).tokens
    assert kv_capacity(half).max_concurrency > kv_capacity(setups["auto"]).max_concurrency


def test_scan_keeps_no_async_scheduling_as_a_hint():
    """`scan --no-async-scheduling` is the same hint as `async_scheduling: false` in targets[];
    without the flag the hint is absent (the release's default), not False."""
    from exporter.cli import build_parser
    from exporter.commands.scan import hinted
    parser = build_parser()
    off = hinted(parser.parse_args(["scan", "x.prom", "--no-async-scheduling"]))
    on = hinted(parser.parse_args(["scan", "x.prom", "--async-scheduling"]))
    unset = hinted(parser.parse_args(["scan", "x.prom"]))
    assert (off.async_scheduling, on.async_scheduling, unset.async_scheduling) == (False, True, None)


def test_a_real_qwen35_servers_state_dtype_label_gives_its_block(tmp_path):
    """Two real vLLM 0.32 startups of one tiny Qwen3.5 (kv-layouts.json): its config names
    `mamba_ssm_dtype: float32`, which vLLM reports resolved in `cache_config_info`
    (`mamba_ssm_cache_dtype="float32"`) and which raises the attention block to 256; served with
    `--mamba-ssm-cache-dtype bfloat16` the label says so and the block stays 128. The daemon,
    given each server's own labels, predicts each server's block."""
    import json

    from exporter.model.kv_cache import kv_groups
    runs = json.loads((VLLM_CPU / "kv-layouts.json").read_text())["runs"]
    blocks = {}
    for name in ("qwen3.5", "qwen3.5-ssm-bfloat16"):
        run = runs[name]
        model_dir = tmp_path / name
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(run["config"]))
        cc = read_cache_config(run["cache_config_info"])
        spec = TargetSpec(url="http://127.0.0.1:8000", model=str(model_dir), gpu="H100", async_scheduling=False)
        x = DriftInput(target="t", model_name=name, max_model_len=4096.0, block_size=128.0,
                       mamba_cache_dtype=cc.mamba_cache_dtype, mamba_ssm_cache_dtype=cc.mamba_ssm_cache_dtype)
        setup = _setup(spec, x)[1]
        assert setup is not None
        blocks[cc.mamba_ssm_cache_dtype] = kv_groups(setup).block_size
        assert blocks[cc.mamba_ssm_cache_dtype] == int(run["cache_config_info"]["block_size"])
    assert blocks == {"float32": 256, "bfloat16": 128}
