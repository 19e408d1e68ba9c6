"""The vision encoder's share of vLLM's startup profile (exporter/model/vision.py) against public
startup logs of Qwen2.5-VL-7B-Instruct, and its rules release by release (read in vLLM's wheels
0.8.5-0.34: `v1/worker/gpu_model_runner.py` profile_run, `MultiModalBudget`, qwen2_vl.py).

The logs, each with the flags it was started with (nothing here was fitted on them; the per-patch
cost is counted from the tower's tensors, vision.py):
- L4 (22.03 GiB as the device reports it), vLLM 0.9.0.1, `--max-model-len 2048`, the rest default:
  "Model loading took 15.6271 GiB", "Encoder cache will be initialized with a budget of 16384
  tokens, and profiled with 1 image items", "Available KV cache memory: 1.81 GiB", "GPU KV cache
  size: 33,824 tokens" (a public OpenShift AI / KServe "Bring-Your-Own-Model" guide, `oc logs
  qwen25-vl-7b-instruct-predictor`, 2025-08-31). Without the encoder, calc said 48,160 (+42 %).
- A100-SXM4-80GB, vLLM 0.23.0 (`vllm/vllm-openai:v0.23.0`), `--gpu-memory-utilization 0.22`,
  max_model_len the model's 128,000: "profiled with 1 video items" of 114,688 tokens, "Estimated
  CUDA graph memory: 0.53 GiB", "Available KV cache memory: -14.28 GiB", then "No available
  memory for the cache blocks" (a public docker log of that image, 2026-07-01).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.discovery import vllm_args
from exporter.errors import InputError
from exporter.model.kv_cache import kv_capacity
from exporter.model.setup import Setup
from exporter.model.vision import encoder_profile

VL7 = "Qwen/Qwen2.5-VL-7B-Instruct"
GIB = 2**30


def test_l4_startup_at_0_9_is_the_logged_pool():
    cap = kv_capacity(Setup.build(VL7, "L4", max_model_len=2048, vllm_version="0.9.0.1"))
    assert cap.tokens == pytest.approx(33824, rel=0.03)
    assert cap.memory.kv_cache_gib == pytest.approx(1.81, abs=0.06)
    enc = encoder_profile(Setup.build(VL7, "L4", max_model_len=2048, vllm_version="0.9.0.1"))
    # the log's own line: "a budget of 16384 tokens, and profiled with 1 image items"
    assert (enc.modality, enc.items, enc.item_tokens, enc.patches) == ("image", 1, 16384, 65536)


def test_a100_at_0_23_is_refused_on_the_dummy_video_with_the_logged_deficit():
    setup = Setup.build(VL7, "A100-SXM4-80GB", gpu_memory_utilization=0.22, vllm_version="0.23.0")
    enc = encoder_profile(setup)
    assert (enc.modality, enc.items, enc.item_tokens) == ("video", 1, 114688)
    cap = kv_capacity(setup, check_fits=False, allow_no_pool=True)
    assert not cap.fits and cap.tokens == 0
    assert cap.memory.kv_cache_gib == pytest.approx(-14.28, abs=0.5)
    for checked in (True, False):   # every other caller gets vLLM's refusal as an error
        with pytest.raises(InputError, match=r"No available memory for the cache blocks.*video.*--limit-mm-per-prompt"):
            kv_capacity(setup, check_fits=checked)


def test_calc_refuses_with_exit_2_and_still_prints_the_document():
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", VL7, "--gpu", "A100-80GB",
                          "--gpu-memory-utilization", "0.22", "--vllm-version", "0.23.0", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kv_cache"]["fits"] is False and doc["kv_cache"]["tokens"] == 0
    assert doc["memory"]["kv_cache_gib"] < -13
    assert doc["memory"]["encoder_profile"]["modality"] == "video"
    assert "No available memory" in doc["error"] and "No available memory" in out.stderr


def test_what_the_operator_changes_changes_the_profile():
    base = dict(vllm_version="0.23.0")
    pool = lambda **kw: kv_capacity(Setup.build(VL7, "A100-80GB", **base, **kw)).memory.kv_cache_gib  # noqa: E731
    default = pool()
    # no video: the image dummy (65,536 patches) is profiled instead of 458,752
    assert pool(mm_limits={"video": 0}) > default + 10
    # a short context shortens the dummy video (frames in pairs of one image's 16,384 tokens)
    short = encoder_profile(Setup.build(VL7, "A100-80GB", max_model_len=40000, **base))
    assert (short.modality, short.item_tokens) == ("video", 32768)
    # a smaller pixel budget shrinks every dummy item: 1,003,520 px = 1,280 tokens per image, and
    # one of them (2,048 // 1,280: an A100 keeps the 2,048-token batch) of 4 x 1,280 patches
    small = encoder_profile(Setup.build(VL7, "A100-80GB", mm_max_pixels=1003520, mm_limits={"video": 0}, **base))
    assert (small.item_tokens, small.items, small.patches) == (1280, 1, 5120)
    # --skip-mm-profiling (from 0.10.1) and every modality at 0 leave the language model alone
    text_only = kv_capacity(Setup.build(VL7, "A100-80GB", skip_mm_profiling=True, **base)).memory.activation_gib
    assert pool(skip_mm_profiling=True) > pool(mm_limits={"video": 0})
    assert encoder_profile(Setup.build(VL7, "A100-80GB", mm_limits={"image": 0, "video": 0}, **base)) is None
    assert text_only < kv_capacity(Setup.build(VL7, "A100-80GB", **base)).memory.activation_gib
    # the flag did not exist before 0.10.1: the profile runs
    assert encoder_profile(Setup.build(VL7, "A100-80GB", skip_mm_profiling=True, vllm_version="0.9.2")) is not None


def test_release_rules():
    def enc(v, **kw):
        return encoder_profile(Setup.build(VL7, "H100-SXM-80GB", vllm_version=v, **kw))
    # before 0.11 the dummy video was built one frame pair long: an image's worth of patches
    assert enc("0.10.1").patches == 65536 and enc("0.11.0").patches == 7 * 65536
    # items per batch: ceil(budget / T) before 0.10.1, floor from it (a 1,280-token image, 8,192 budget)
    small = dict(mm_max_pixels=1003520, mm_limits={"video": 0})
    assert enc("0.9.2", **small).items == 7 and enc("0.10.1", **small).items == 6
    # 0.11.x kept each output padded to the encoder budget (8,192 rows), 0.12.x to T, later unpadded
    hidden = Setup.build(VL7, "H100-SXM-80GB").model.hidden_size
    assert enc("0.11.0", **small).kept_bytes == 6 * 8192 * hidden * 2
    assert enc("0.13.0", **small).kept_bytes == 6 * 1280 * hidden * 2
    # V0 (a T4 before 0.10.2) is not modelled: its profile ran every modality inside one forward
    assert encoder_profile(Setup.build(VL7, "T4", vllm_version="0.8.5", dtype="float16",
                                       max_model_len=4096, gpu_memory_gib=40)) is None


def test_tp_splits_the_mlp_not_the_residual_stream():
    one = encoder_profile(Setup.build(VL7, "H100-SXM-80GB", tp=1, mm_limits={"video": 0}))
    four = encoder_profile(Setup.build(VL7, "H100-SXM-80GB", tp=4, mm_limits={"video": 0}))
    assert 0.3 * one.forward_bytes < four.forward_bytes < 0.6 * one.forward_bytes


def test_text_models_and_towers_not_modelled_have_no_encoder_term():
    assert encoder_profile(Setup.build("Qwen/Qwen2.5-7B-Instruct", "L4")) is None
    # the shared H100 rows' multimodal models: Kimi-VL's MoonViT is not modelled
    assert encoder_profile(Setup.build("moonshotai/Kimi-VL-A3B-Instruct", "H100-80GB")) is None


@pytest.mark.parametrize("text, want", [
    ('{"image": 2, "video": 0}', {"image": 2, "video": 0}),
    ("image=2,video=0", {"image": 2, "video": 0}),
    ('{"image": {"count": 3, "width": 512, "height": 512}}', {"image": 3}),
])
def test_limit_mm_per_prompt_reads_as_vllm_does(text, want):
    assert vllm_args.mm_limits(text) == want


@pytest.mark.parametrize("text", ["image", '{"image": "many"}', "[1, 2]", '{"image": 2'])
def test_limit_mm_per_prompt_errors_name_the_problem(text):
    with pytest.raises(ValueError):
        vllm_args.mm_limits(text)


def test_mm_processor_kwargs_max_pixels():
    assert vllm_args.mm_max_pixels('{"max_pixels": 1003520, "min_pixels": 3136}') == 1003520
    assert vllm_args.mm_max_pixels('{"size": {"longest_edge": 4194304}}') == 4194304
    assert vllm_args.mm_max_pixels('{"fps": 2}') is None
    with pytest.raises(ValueError, match="not a JSON object"):
        vllm_args.mm_max_pixels("max_pixels=100")


def test_the_daemon_takes_the_servers_multimodal_flags_from_its_pod_or_labels():
    """A watched server's pool is predicted with the flags it runs: a pod's `vllm serve` arguments
    ride along as labels (kubernetes discovery), as do file_sd / static labels."""
    from exporter.config import TargetSpec
    from exporter.discovery.kubernetes import pod_target
    from exporter.drift.inputs import DriftInput
    from exporter.drift.predict import identify, setup_for

    x = DriftInput(target="t", model_name=VL7, max_model_len=128000.0)
    base = dict(url="http://127.0.0.1:8000", model=VL7, gpu="A100-80GB")
    pod = pod_target({"metadata": {"name": "vl"}, "spec": {"containers": [{"name": "vllm", "args": [
        "vllm", "serve", VL7, "--limit-mm-per-prompt", '{"video": 0}',
        "--mm-processor-kwargs", '{"max_pixels": 1003520}']}]}}, 8000)
    assert pod.labels["limit_mm_per_prompt"] == "video=0" and pod.labels["mm_max_pixels"] == "1003520"

    def profile(spec):
        ident = identify(spec, VL7, wait=True)
        return encoder_profile(setup_for(ident, x, "0.23.0"))
    assert profile(TargetSpec(**base)).modality == "video"
    shrunk = profile(TargetSpec(**base, labels=pod.labels))
    assert (shrunk.modality, shrunk.item_tokens) == ("image", 1280)
    assert profile(TargetSpec(**base, labels={"skip_mm_profiling": "true"})) is None
    # an unreadable label is vLLM's default, not an error
    assert profile(TargetSpec(**base, labels={"limit_mm_per_prompt": "video"})).modality == "video"


def test_qwen3_vl_profiles_its_video_only_in_0_11_and_0_12():
    """Qwen3-VL's dummy video holds the video processor's pixel budget over all its frames
    (12,288 embeddings, 49,152 patches): fewer than one image's 16,384, but 0.11.x-0.12.x counted
    12.5 tokens per video embedding (its timestamp text), so the video won the encoder budget. A
    public startup of Qwen3-VL-30B-A3B-Instruct on 4 x RTX 3090 at 0.11.0 (`--tensor-parallel-size
    4 --max-model-len 65536`, the Sipeed NanoKVM-Pro "Experimental AI Agent" guide, 2025-10-06)
    logged "Encoder cache will be initialized with a budget of 153600 tokens, and profiled with 1
    video items"."""
    def enc(v):
        return encoder_profile(Setup.build("Qwen/Qwen3-VL-30B-A3B-Instruct", "RTX-3090-24GB", tp=4,
                                           max_model_len=65536, vllm_version=v))
    e = enc("0.11.0")
    assert (e.modality, e.items, e.item_tokens, e.patches) == ("video", 1, 153600, 49152)
    assert enc("0.12.0").modality == "video"
    assert (enc("0.13.0").modality, enc("0.13.0").item_tokens) == ("image", 16384)
    # the outputs carry three deepstack levels beside each embedding (4 x 2,048 wide), and 0.11.x
    # padded them to the 153,600-token budget: 2.3 GiB kept through the language model's run
    assert e.kept_bytes == 153600 * 2048 * 4 * 2
    assert enc("0.13.0").kept_bytes == 16384 * 2048 * 4 * 2


def test_scan_takes_the_multimodal_flags_as_the_pod_labels_give_them():
    from exporter.cli import build_parser
    from exporter.commands.scan import hinted
    parser = build_parser()
    spec = hinted(parser.parse_args(["scan", "x.prom", "--limit-mm-per-prompt", '{"video": 0}',
                                     "--mm-processor-kwargs", '{"max_pixels": 1003520}', "--skip-mm-profiling"]))
    assert spec.labels == {"limit_mm_per_prompt": "video=0", "mm_max_pixels": "1003520", "skip_mm_profiling": "true"}
    assert hinted(parser.parse_args(["scan", "x.prom"])).labels == {}
    bad = subprocess.run([sys.executable, "-m", "exporter", "scan", "x.prom", "--limit-mm-per-prompt", "video"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--limit-mm-per-prompt" in bad.stderr and "modality=count" in bad.stderr


def test_the_daemon_reads_a_smaller_multimodal_profile_off_the_observed_pool():
    """A Qwen2.5-VL server started with `--limit-mm-per-prompt '{"video": 0}'` (or
    --skip-mm-profiling) that the daemon was not told about holds gigabytes more pool than vLLM's
    default profile leaves: that is read as the smaller profile, not as a wrong GPU hint (which
    would leave the server unscored). A pool no profile explains is still a GPU mismatch."""
    from exporter.drift.predict import ServerFlags, predict, resolve_hints

    res = resolve_hints([VL7], "L40S")
    flags = ServerFlags(vllm_version=(0, 19, 0))
    default = kv_capacity(Setup.build(VL7, "L40S", vllm_version="0.19.0")).tokens
    no_video = kv_capacity(Setup.build(VL7, "L40S", vllm_version="0.19.0", mm_limits={"video": 0})).tokens
    assert no_video > 1.8 * default            # ~13 GiB of a 44 GiB card
    p = predict(res, flags, traffic={}, slo={}, prices={}, observed_kv_tokens=float(no_video) * 1.01)
    assert p.hint_mismatch is None and p.kv_cache_tokens == pytest.approx(no_video)
    assert any("video=0" in n for n in p.notes)
    # the default pool needs no explanation; one twice the card's does
    assert predict(res, flags, traffic={}, slo={}, prices={},
                   observed_kv_tokens=float(default)).kv_cache_tokens == pytest.approx(default)
    assert predict(res, flags, traffic={}, slo={}, prices={},
                   observed_kv_tokens=float(no_video) * 3).hint_mismatch is not None


def test_a_pip_install_without_flashinfer_is_described_by_vllms_own_switch():
    """vLLM 0.10.1 and 0.11.0 list flashinfer-python only as the `flashinfer` extra, so a plain
    `pip install vllm` samples in PyTorch ("FlashInfer is not available. Falling back to the
    PyTorch-native implementation", as the 4 x RTX 3090 Qwen3-VL log says) and its dummy sampler
    sorts the vocabulary: calc takes VLLM_USE_FLASHINFER_SAMPLER=0 for it, as vLLM does. With it
    that startup's pool (2.31 GiB logged) is within 0.35 GiB."""
    qwen3 = dict(model="Qwen/Qwen3-VL-30B-A3B-Instruct", gpu="RTX-3090-24GB", tp=4, max_model_len=65536,
                 vllm_version="0.11.0")
    native = kv_capacity(Setup.build(**qwen3, flashinfer_sampler=False))
    assert native.memory.kv_cache_gib == pytest.approx(2.31, abs=0.35)
    assert kv_capacity(Setup.build(**qwen3)).memory.activation_gib < native.memory.activation_gib - 0.5
    # the switch forces FlashInfer's kernel on where the release defaults it off (0.11.1-0.16)
    text = dict(model="Qwen/Qwen2.5-7B-Instruct", gpu="A100-80GB", max_model_len=16384)
    assert (kv_capacity(Setup.build(**text, vllm_version="0.12.0", flashinfer_sampler=True)).memory.activation_gib
            < kv_capacity(Setup.build(**text, vllm_version="0.12.0")).memory.activation_gib)

    def calc(env):
        import os
        out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", qwen3["model"], "--gpu", qwen3["gpu"],
                              "--tp", "4", "--max-model-len", "65536", "--vllm-version", "0.11.0", "--json"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        return out
    assert json.loads(calc({"VLLM_USE_FLASHINFER_SAMPLER": "0"}).stdout)["kv_cache"]["tokens"] == native.tokens
    bad = calc({"VLLM_USE_FLASHINFER_SAMPLER": "yes"})
    assert bad.returncode == 2 and "VLLM_USE_FLASHINFER_SAMPLER" in bad.stderr


@pytest.mark.parametrize("model, gpu, version, flags, items", [
    # gemma-3-27b-it on ROCm at 0.11.0rc2 (--max-model-len 4096 --limit-mm-per-prompt image=2): "Encoder
    # cache will be initialized with a budget of 8192 tokens, and profiled with 31 image items"
    ("google/gemma-3-27b-it", "MI300X", "0.11.0", dict(max_model_len=4096, mm_limits={"image": 2}), 31),
    # a MedGemma-4b (Gemma 3 4B) server on an RTX 5070 Ti in 2026 (--max-model-len 4096
    # --max-num-seqs 8): "a budget of 2048 tokens, profiled with 7 image items"
    ("google/gemma-3-4b-it", "RTX-5070-Ti-16GB", None, dict(max_model_len=4096, max_num_seqs=8), 7),
    # Qwen3-VL-8B with --max-num-seqs 5, --limit-mm-per-prompt image=1 and max_pixels 1003520 (1,280
    # tokens an image): "a budget of 8192 tokens, and profiled with 5 image items" (a 2026 build)
    ("Qwen/Qwen3-VL-8B-Instruct", "L40S", None, dict(max_model_len=4096, max_num_seqs=5, mm_limits={"image": 1},
                                                    mm_max_pixels=1003520, max_num_batched_tokens=8192), 5),
])
def test_items_per_batch_as_public_logs_count_them(model, gpu, version, flags, items):
    """Gemma 3's placeholder adds its start/end and newline tokens to the 256 embeddings (260 a
    dummy image: 8192 // 260 = 31, 2048 // 260 = 7); the cap of max_num_seqs x the per-prompt
    limit binds before the budget does (8192 // 1280 = 6 > 5 x 1)."""
    assert encoder_profile(Setup.build(model, gpu, vllm_version=version, **flags)).items == items


def test_gemma3_on_rocm_at_0_11_samples_natively_and_keeps_padded_outputs():
    """gemma-3-27b-it on an AMD Instinct (ROCm; MI300X inferred from the repository's README and
    the pool) at vLLM 0.11.0rc2, `--max-model-len 4096 --limit-mm-per-prompt image=2`
    (github.com/TaintsAndTokenizersInc/vllm_multimodal_rocm_examples, example_logs.md): "Model
    loading took 51.7891 GiB", 31 image items at an 8,192 budget, "Available KV cache memory:
    109.86 GiB", "GPU KV cache size: 205,696 tokens". Three things decide it: vLLM samples
    natively off CUDA (no FlashInfer on ROCm: the vocabulary sort of 1,024 rows x 262,208), 0.11.x
    kept each of the 31 outputs padded to the 8,192-token budget (2.5 GiB), and the encoder's own
    peak (3.3 GiB) is below both. Before: 215,120 (+4.6 %) with the CUDA images' FlashInfer
    sampler assumed."""
    setup = Setup.build("google/gemma-3-27b-it", "MI300X", vllm_version="0.11.0", max_model_len=4096,
                        mm_limits={"image": 2})
    assert not setup.flashinfer_sampling
    cap = kv_capacity(setup)
    assert cap.tokens == pytest.approx(205696, rel=0.02)
    assert cap.memory.kv_cache_gib == pytest.approx(109.86, abs=1.0)
    enc = encoder_profile(setup)
    assert enc.items == 31 and enc.kept_bytes == 31 * 8192 * 5376 * 2
