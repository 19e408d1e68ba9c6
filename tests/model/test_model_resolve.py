"""Model resolution without the internet, through the real `huggingface_hub` client.

Sources exercised: an HF cache directory in the real `models--org--name/snapshots/<rev>/` layout
holding the public config.json files of tests/fixtures/hf-configs/; a loopback Hub (tests/helpers/fake_hub.py)
answering huggingface_hub's HEAD / GET / range reads; a loopback vLLM `/v1/models` whose `root` is a
local model directory; and `vllm-drift calc` in a subprocess for the CLI's one-line errors.
"""
from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.cli import main as cli_main
from exporter.errors import CatalogError
from exporter.model.kv_cache import weights_bytes
from exporter.model.resolve import HubSettings, clear_cache, resolve_model
from exporter.model.setup import Setup
from exporter.model.weights import from_local_dir
from conftest import dead_url
from fake_hub import COMMIT, FakeHub, hf_cache_entry, safetensors_header_only, sharded
from loopback import Site, static

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"

# hub id -> (KV bytes per token at TP1 in the model dtype, quantization, default max_model_len)
EXPECTED = {
    "Qwen/Qwen2-7B-Instruct": (2 * 28 * 4 * 128 * 2, None, 32768),
    "meta-llama/Meta-Llama-3-8B-Instruct": (2 * 32 * 8 * 128 * 2, None, 8192),
    "deepseek-ai/DeepSeek-V2-Lite": (27 * (512 + 64) * 2, None, 4096 * 40),   # MLA latent, YaRN x40
    "Qwen/Qwen1.5-MoE-A2.7B": (2 * 24 * 16 * 128 * 2, None, 8192),
    "Qwen/Qwen2.5-7B-Instruct-AWQ": (2 * 28 * 4 * 128 * 2, "awq", 32768),
    "Qwen/Qwen1.5-7B-Chat-GPTQ-Int4": (2 * 32 * 32 * 128 * 2, "gptq", 32768),
    "Qwen/Qwen3-8B-FP8": (2 * 36 * 8 * 128 * 2, "fp8", 40960),
    "microsoft/Phi-3-mini-128k-instruct": (2 * 32 * 32 * 96 * 2, None, 131072),  # longrope: no x factor
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": (2 * 40 * 8 * 128 * 2, None, 131072),
}


def config_bytes(repo_id: str) -> bytes:
    return (CONFIGS / repo_id.replace("/", "--") / "config.json").read_bytes()


@pytest.fixture(autouse=True)
def _fresh():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def hf_cache(tmp_path):
    """Every fixture config.json in an HF cache directory (config only, no weights)."""
    cache = tmp_path / "hub"
    for repo_id in EXPECTED:
        hf_cache_entry(cache, repo_id, {"config.json": config_bytes(repo_id)})
    return cache


@pytest.fixture
def offline_cache_env(hf_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    return hf_cache


def run_calc(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = cli_main(["calc", *args, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else None), out.err


# ---- 3. the HF cache, offline ---------------------------------------------------------------

@pytest.mark.parametrize("repo_id", list(EXPECTED))
def test_calc_answers_a_hub_id_from_the_hf_cache_offline(repo_id, offline_cache_env, capsys):
    kv_bytes, quant, max_len = EXPECTED[repo_id]
    code, doc, err = run_calc(capsys, "--model", repo_id, "--gpu", "H100", "--max-model-len", "4096")
    assert code == 0, err
    assert doc["model"]["source"] == "hf-cache" and doc["model"]["via"] == "hint"
    assert doc["model"]["config"].startswith(str(offline_cache_env))
    assert doc["kv_cache"]["bytes_per_token"] == kv_bytes
    assert doc["setup"]["quantization"] == quant
    assert doc["kv_cache"]["tokens"] > 0
    res = resolve_model(repo_id, settings=HubSettings())
    assert res.arch.max_position_embeddings == max_len


def test_configs_are_read_generically(offline_cache_env):
    s = HubSettings()
    dsv2 = resolve_model("deepseek-ai/DeepSeek-V2-Lite", settings=s).arch
    assert dsv2.attention == "mla" and dsv2.num_kv_heads == 1
    assert dsv2.moe_layers == tuple(range(1, 27)) and dsv2.shared_experts == 2   # first_k_dense_replace
    assert abs(dsv2.total_params / 15.7e9 - 1) < 0.01                              # model card: 15.7B
    moe = resolve_model("Qwen/Qwen1.5-MoE-A2.7B", settings=s).arch
    assert moe.moe_layers == tuple(range(24)) and moe.shared_expert_intermediate_size == 5632
    assert abs(moe.total_params / 14.3e9 - 1) < 0.01                               # model card: 14.3B
    assert abs(moe.active_params / 2.7e9 - 1) < 0.06                               # "A2.7B"
    fp8 = resolve_model("Qwen/Qwen3-8B-FP8", settings=s)
    assert any("block-wise [128, 128]" in n for n in fp8.notes)
    mm = resolve_model("mistralai/Mistral-Small-3.1-24B-Instruct-2503", settings=s)
    assert mm.arch.num_layers == 40 and any("text_config" in n for n in mm.notes)
    assert abs(mm.arch.total_params / 24.0e9 - 1) < 0.01     # text backbone + Pixtral tower estimate
    phi = resolve_model("microsoft/Phi-3-mini-128k-instruct", settings=s)
    assert any("longrope" in n for n in phi.notes)
    assert abs(resolve_model("Qwen/Qwen2-7B-Instruct", settings=s).arch.total_params - 7_615_616_512) < 1e6


def test_a_base_model_is_not_silently_mapped_to_its_instruct_entry(offline_cache_env):
    res = resolve_model("meta-llama/Llama-3.1-8B", settings=HubSettings())
    assert res.source == "catalog"
    assert any("alias of 'meta-llama/Llama-3.1-8B-Instruct'" in n for n in res.notes)
    # a name the catalog only matches by its stem says the architecture is assumed
    res = resolve_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", settings=HubSettings())
    assert res.source == "catalog" and res.arch.quantization == "gptq-int8"
    assert any("matched by name" in n and "assumed" in n for n in res.notes)


def test_the_hf_cache_beats_the_catalog_for_a_catalog_id(offline_cache_env):
    # DeepSeek-V2-Lite is a catalog alias; the host's own copy of the config answers first
    assert resolve_model("deepseek-ai/DeepSeek-V2-Lite", settings=HubSettings()).source == "hf-cache"


def test_unknown_model_type_goes_through_the_generic_path(tmp_path):
    cfg = json.loads(config_bytes("Qwen/Qwen2-7B-Instruct"))
    cfg["model_type"] = "acme_decoder"
    d = tmp_path / "acme"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    res = resolve_model(str(d), settings=HubSettings(offline=True))
    assert res.source == "local" and res.arch.num_layers == 28
    assert any("generic decoder path" in n for n in res.notes)


# a Hub id the shipped catalog does not list (its fields are Qwen2-7B-Instruct's, served below as
# if from the cache or the Hub)
UNLISTED = "example-org/Qwen2-7B-Instruct-finetune"


def test_calc_without_any_source_is_one_line_naming_what_was_tried(tmp_path, cli_env):
    env = {**cli_env, "HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", UNLISTED,
                          "--gpu", "H100"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"vllm-drift calc: error: unknown model '{UNLISTED}': not a catalog id")
    assert f"not in HF cache at {tmp_path / 'empty'}, hub offline" in lines[0]
    # the daemon's form of the same failure
    env_cache = HubSettings(cache_dir=str(tmp_path / "empty"), offline=True)
    with pytest.raises(CatalogError) as e:
        resolve_model(UNLISTED, settings=env_cache)
    assert str(e.value).startswith(f"no config for {UNLISTED}: not a catalog id")
    assert str(e.value).endswith(f"not in HF cache at {tmp_path / 'empty'}, hub offline")


def test_calc_subprocess_reads_the_cache_named_by_hf_hub_cache(hf_cache, cli_env):
    env = {**cli_env, "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", "Qwen/Qwen2-7B-Instruct",
                          "--gpu", "A100-80GB"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "model_config" in out.stdout and "hf-cache (via hint: Qwen/Qwen2-7B-Instruct)" in out.stdout


# ---- 4. the Hub, through huggingface_hub against a loopback hub ------------------------------

def qwen_gptq_tensors() -> dict[str, tuple[str, list[int]]]:
    """The tensor list of Qwen1.5-7B-Chat-GPTQ-Int4 (AutoGPTQ layout: int32-packed 4-bit weights,
    fp16 scales per 128-group, packed zeros, g_idx; fp16 embeddings, norms and biases)."""
    h, inter, vocab, gs = 4096, 11008, 151936, 128
    t: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("F16", [vocab, h])}

    def gptq(name: str, n_in: int, n_out: int) -> None:
        t[name + ".qweight"] = ("I32", [n_in // 8, n_out])
        t[name + ".qzeros"] = ("I32", [n_in // gs, n_out // 8])
        t[name + ".scales"] = ("F16", [n_in // gs, n_out])
        t[name + ".g_idx"] = ("I32", [n_in])

    for i in range(32):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            gptq(p + "self_attn." + proj, h, h)
            t[p + f"self_attn.{proj}.bias"] = ("F16", [h])
        gptq(p + "self_attn.o_proj", h, h)
        gptq(p + "mlp.gate_proj", h, inter)
        gptq(p + "mlp.up_proj", h, inter)
        gptq(p + "mlp.down_proj", inter, h)
        t[p + "input_layernorm.weight"] = ("F16", [h])
        t[p + "post_attention_layernorm.weight"] = ("F16", [h])
    t["model.norm.weight"] = ("F16", [h])
    t["lm_head.weight"] = ("F16", [vocab, h])
    return t


def stored_bytes(tensors, keep) -> int:
    size = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}
    return sum(math.prod(s) * size[d] for n, (d, s) in tensors.items() if keep(n))


GPTQ = "Qwen/Qwen1.5-7B-Chat-GPTQ-Int4"


def test_hub_answers_through_huggingface_hub_with_exact_weight_bytes(tmp_path):
    tensors = qwen_gptq_tensors()
    files = {"config.json": config_bytes(GPTQ), **sharded(tensors, 3)}
    with FakeHub({GPTQ: files}) as hub:
        s = HubSettings(endpoint=hub.url, cache_dir=str(tmp_path / "hub"), offline=False, timeout=5)
        res = resolve_model(GPTQ, settings=s)
        seen = list(hub.requests)
    assert res.source == "hub" and res.arch.quantization == "gptq"
    w = res.arch.weights
    assert w is not None and w.files == 3
    lm = lambda n: "embed_tokens" not in n and "lm_head" not in n  # noqa: E731
    assert w.lm_bytes(2) == stored_bytes(tensors, lm)          # packed ints + scales + fp16 extras
    assert w.total_bytes == stored_bytes(tensors, lambda n: True)
    # only the headers were read: one range read per shard, starting at byte 0
    ranged = [(p, r) for m, p, r in seen if r]
    assert len(ranged) == 3 and all(r.startswith("bytes=0-") for _, r in ranged)
    # config.json and the index landed in our cache dir: offline, the cache answers next time
    clear_cache()
    again = resolve_model(GPTQ, settings=HubSettings(cache_dir=str(tmp_path / "hub"), offline=True))
    assert again.source == "hf-cache" and again.arch.num_layers == 32


def test_exact_weight_bytes_reach_the_kv_model(tmp_path):
    tensors = qwen_gptq_tensors()
    snap = hf_cache_entry(tmp_path / "hub", GPTQ, {"config.json": config_bytes(GPTQ), **sharded(tensors, 2)})
    assert from_local_dir(snap) is not None
    res = resolve_model(GPTQ, settings=HubSettings(cache_dir=str(tmp_path / "hub"), offline=True))
    assert res.source == "hf-cache" and res.arch.weights is not None
    setup = Setup.build(res.arch, "H100", max_model_len=4096)
    exact = weights_bytes(setup)
    formula = weights_bytes(Setup.build(res.arch.__class__(**{**res.arch.__dict__, "weights": None}),
                                        "H100", max_model_len=4096))
    m = res.arch
    rope = m.max_position_embeddings * m.rotary_dim * 2
    checkpoint = stored_bytes(tensors, lambda n: True)        # every tensor fp16 or packed int32
    assert m.weight_bytes == checkpoint
    assert exact - rope == pytest.approx(checkpoint, rel=1e-9)  # TP1: the whole checkpoint on the GPU
    assert exact != formula and abs(exact / formula - 1) < 0.05   # the formula was close, not exact


def test_hub_not_found_offline_and_unreachable_are_one_clause_each(tmp_path):
    with FakeHub({}) as hub:
        s = HubSettings(endpoint=hub.url, cache_dir=str(tmp_path), offline=False, timeout=5)
        with pytest.raises(CatalogError) as e:
            resolve_model("acme/unknown-7b", settings=s)
        assert f"hub {hub.url}: HTTP 404 not found" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(CatalogError) as e:
            resolve_model("acme/unknown-7b", settings=HubSettings(endpoint=hub.url, cache_dir=str(tmp_path),
                                                                  offline=True))
        assert str(e.value).endswith("hub offline")
        n = len(hub.requests)
        # the failure is remembered for retry_seconds: no second round trip
        with pytest.raises(CatalogError):
            resolve_model("acme/unknown-7b", settings=s)
        assert len(hub.requests) == n
    closed = dead_url()
    t0 = time.monotonic()
    with pytest.raises(CatalogError) as e:
        resolve_model("acme/other-7b", settings=HubSettings(endpoint=closed, cache_dir=str(tmp_path),
                                                            offline=False, timeout=2))
    assert "ConnectError" in str(e.value) and time.monotonic() - t0 < 5   # no 5x retry backoff


# ModelOpt <= 0.29 wrote the quantization beside config.json, in hf_quant_config.json, and left
# config.json without quantization_config (nvidia/Llama-3.1-8B-Instruct-FP4, nvidia/DeepSeek-V3.1-NVFP4):
# the file's layout as ModelOpt writes it
MODELOPT_FP4 = json.dumps({"producer": {"name": "modelopt", "version": "0.22.1"},
                           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                                            "group_size": 16, "exclude_modules": ["lm_head"]}}).encode()
LLAMA3 = "meta-llama/Meta-Llama-3-8B-Instruct"


def _fp4_checks(res, plain) -> None:
    """NVFP4 weights (4.5 bits with scales) and an FP8 KV cache (kv_cache_quant_algo, vLLM >= 0.13)."""
    assert res.arch.quantization == "nvfp4" and res.arch.kv_cache_quant == "fp8"
    assert any("modelopt NVFP4" in n for n in res.arch.notes)
    fp4 = Setup.build(res.arch, "B200", max_model_len=4096, vllm_version="0.19.0")
    bf16 = Setup.build(plain.arch, "B200", max_model_len=4096, vllm_version="0.19.0")
    assert 0.3 < weights_bytes(fp4) / weights_bytes(bf16) < 0.4


def test_modelopt_hf_quant_config_json_beside_config_json_is_read_as_vllm_reads_it(tmp_path):
    plain = resolve_model(str(CONFIGS / LLAMA3.replace("/", "--")), settings=HubSettings(offline=True))
    assert plain.arch.quantization is None
    # a local model directory
    local = tmp_path / "Llama-3-8B-FP4"
    local.mkdir()
    (local / "config.json").write_bytes(config_bytes(LLAMA3))
    (local / "hf_quant_config.json").write_bytes(MODELOPT_FP4)
    _fp4_checks(resolve_model(str(local), settings=HubSettings(offline=True)), plain)
    # the HF cache (a vLLM host's snapshot holds both files)
    cache = tmp_path / "hub"
    hf_cache_entry(cache, "nvidia/Llama-3-8B-FP4", {"config.json": config_bytes(LLAMA3),
                                                    "hf_quant_config.json": MODELOPT_FP4})
    res = resolve_model("nvidia/Llama-3-8B-FP4", settings=HubSettings(cache_dir=str(cache), offline=True))
    assert res.source == "hf-cache"
    _fp4_checks(res, plain)
    # config.json's own quantization_config wins, as in vLLM
    (local / "config.json").write_text(json.dumps({**json.loads(config_bytes(LLAMA3)), "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic"}}))
    clear_cache()
    assert resolve_model(str(local), settings=HubSettings(offline=True)).arch.quantization == "fp8"


def test_the_hub_is_asked_for_hf_quant_config_json_only_without_quantization_config(tmp_path):
    plain_id = "example-org/Llama-3-8B-Instruct-copy"   # not a catalog id: the Hub answers it
    repos = {"nvidia/Llama-3-8B-FP4": {"config.json": config_bytes(LLAMA3), "hf_quant_config.json": MODELOPT_FP4},
             plain_id: {"config.json": config_bytes(LLAMA3)},
             "Qwen/Qwen3-8B-FP8": {"config.json": config_bytes("Qwen/Qwen3-8B-FP8")}}
    with FakeHub(repos) as hub:
        s = HubSettings(endpoint=hub.url, cache_dir=str(tmp_path / "hub"), offline=False, timeout=5, weights=False)
        fp4 = resolve_model("nvidia/Llama-3-8B-FP4", settings=s)
        plain = resolve_model(plain_id, settings=s)
        fp8 = resolve_model("Qwen/Qwen3-8B-FP8", settings=s)
        asked = [(m, p) for m, p, _ in hub.requests if "hf_quant_config.json" in p]
    assert fp4.source == plain.source == "hub"
    _fp4_checks(fp4, plain)
    # a model without the file: one 404, no note; a config with quantization_config: not asked
    assert plain.arch.quantization is None and not any("hf_quant_config" in n for n in plain.notes)
    assert any("Llama-3-8B-Instruct-copy" in p for _, p in asked)
    assert not any("Qwen3-8B-FP8" in p for _, p in asked) and fp8.arch.quantization == "fp8"


# ---- 2. the server's /v1/models root: a model volume the sidecar shares ----------------------

def test_sidecar_resolves_a_v1_models_root_that_is_a_local_model_dir(tmp_path):
    from exporter.scrape import Scraper
    model_dir = tmp_path / "models" / "acme-finetune"          # not a catalog model, no hub id
    model_dir.mkdir(parents=True)
    cfg = json.loads(config_bytes("meta-llama/Meta-Llama-3-8B-Instruct"))
    (model_dir / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": ("BF16", [128256, 4096]),
               "model.layers.0.self_attn.q_proj.weight": ("BF16", [4096, 4096]),
               "model.layers.0.self_attn.k_proj.weight": ("BF16", [1024, 4096])}
    (model_dir / "model.safetensors").write_bytes(safetensors_header_only(tensors))
    models = {"object": "list", "data": [{"id": "acme", "object": "model", "root": str(model_dir),
                                          "max_model_len": 8192}]}

    async def read(url):
        s = Scraper()
        try:
            return await s.metadata(url)
        finally:
            await s.aclose()

    with Site(static({"/v1/models": json.dumps(models).encode()})) as site:
        meta = asyncio.run(read(site.url))
    root = meta.root["acme"]
    res = resolve_model(None, "acme", root, settings=HubSettings(offline=True, cache_dir=str(tmp_path / "c")))
    assert res.source == "local" and res.via == "root" and res.arch.num_kv_heads == 8
    assert res.arch.weights.float_params == 4096 * 4096 + 1024 * 4096
    with pytest.raises(CatalogError) as e:   # the served name alone says nothing
        resolve_model(None, "acme", None, settings=HubSettings(offline=True, cache_dir=str(tmp_path / "c")))
    assert "no config for acme" in str(e.value)


def test_hf_cache_layout_written_by_the_tests_is_what_huggingface_hub_reads(hf_cache):
    from huggingface_hub import scan_cache_dir
    repos = {r.repo_id: r for r in scan_cache_dir(hf_cache).repos}
    assert set(repos) == set(EXPECTED)
    assert all(next(iter(r.revisions)).commit_hash == COMMIT for r in repos.values())


# ---- the daemon's seam: never block the event loop on the Hub --------------------------------

def test_nowait_answers_local_sources_at_once_and_the_hub_in_the_background(tmp_path):
    import threading

    from exporter.model.resolve import resolve_model_nowait
    with FakeHub({GPTQ: {"config.json": config_bytes(GPTQ)}}) as hub:
        s = HubSettings(endpoint=hub.url, cache_dir=str(tmp_path), offline=False, timeout=5, weights=False)
        # an exact catalog id needs no network: answered at once, the hub never asked
        assert resolve_model_nowait(None, "meta-llama/Llama-3.1-8B-Instruct", None, settings=s).source == "catalog"
        assert hub.requests == []
        hub.gate = threading.Event()           # the hub now stalls until released
        assert resolve_model_nowait(GPTQ, settings=s) is None
        hub.gate.set()
        deadline = time.monotonic() + 10
        res = None
        while res is None and time.monotonic() < deadline:
            time.sleep(0.05)
            res = resolve_model_nowait(GPTQ, settings=s)
        assert res is not None and res.source == "hub" and res.arch.quantization == "gptq"


def test_the_huggingface_config_section_drives_the_settings(tmp_path, monkeypatch):
    from exporter.config import config_from_dict
    from exporter.errors import ConfigError
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = config_from_dict({"huggingface": {"offline": True, "timeout": "3s", "cache_dir": str(tmp_path),
                                            "endpoint": "http://127.0.0.1:1"}})
    s = HubSettings.from_config(cfg.huggingface)
    assert s.is_offline() and s.timeout == 3.0 and s.hub_cache() == tmp_path
    assert s.hub_endpoint() == "http://127.0.0.1:1"
    with pytest.raises(CatalogError) as e:
        resolve_model("acme/x-7b", settings=s)
    assert str(e.value).endswith("hub offline")
    # unset: HF_HUB_OFFLINE decides, read at call time
    default = HubSettings.from_config(config_from_dict({}).huggingface)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert default.is_offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not default.is_offline()
    with pytest.raises(ConfigError, match="huggingface.ofline"):
        config_from_dict({"huggingface": {"ofline": True}})


def test_the_pipeline_asks_again_while_a_hub_lookup_is_pending(tmp_path):
    """A served model whose /v1/models root is a Hub id the host has not cached: the daemon's
    pipeline answers 'being looked up' without blocking, then predicts once the Hub answered."""
    import threading

    from exporter.config import config_from_dict
    from exporter.parse.metadata import Metadata
    from exporter.pipeline import Pipelines
    with FakeHub({GPTQ: {"config.json": config_bytes(GPTQ)}}) as hub:
        cfg = config_from_dict({"huggingface": {"offline": False, "endpoint": hub.url,
                                                "cache_dir": str(tmp_path), "weights": False},
                                "targets": [{"url": "http://127.0.0.1:1", "gpu": "A100-80GB"}]})
        fleet = Pipelines(cfg)
        pipe = fleet.pipeline(cfg.targets[0], "chat")
        meta = Metadata(served_models=("chat",), root={"chat": GPTQ})
        hub.gate = threading.Event()
        first = pipe.identity(meta)
        assert first.resolved.pending and first.resolved.model is None
        assert "being looked up on the Hub" in first.resolved.notes[0]
        hub.gate.set()
        deadline = time.monotonic() + 10
        ident = first
        while ident.resolved.pending and time.monotonic() < deadline:
            time.sleep(0.05)
            ident = pipe.identity(meta)
        assert ident.resolved.model is not None and ident.resolved.model.quantization == "gptq"
        assert any("model config: hub (via root: " in n for n in ident.resolved.notes)
        # a one-shot fleet (scan) waits instead
        clear_cache()
        scan = Pipelines(cfg, one_shot=True).pipeline(cfg.targets[0], "chat")
        assert scan.identity(meta).resolved.model is not None
