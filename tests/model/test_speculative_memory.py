"""The speculative-decoding drafter's share of the KV pool and the weights
(exporter/model/drafter.py), read in vLLM's wheels 0.11.0, 0.13.0, 0.14.0 and 0.15.0
(v1/spec_decode/eagle.py `load_model`, draft_model.py, config/speculative.py,
models/llama_eagle3.py, deepseek_mtp.py).

The public pair checked (nothing was fitted on it): Qwen3-4B on one RTX 4090 under WSL2,
`--max-model-len 4096 --gpu-memory-utilization 0.90 --max-num-seqs 64`, without and with
`--speculative-config '{"model": "AngelSlim/Qwen3-4B_eagle3", "num_speculative_tokens": 3}'`
(a project's ADR table of its own startups, public on GitHub, 2026; vLLM version not stated):
"load memory" 7.56 -> 7.97 GiB (+0.41 GiB), KV cache 90,480 -> 83,952 tokens (-7.2 %). The
absolute pool is WSL2's (the project does not model what WSL2 leaves of a 24 GB card); the
drafter's part is the difference.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.discovery.vllm_args import parse_vllm_args, speculative_label
from exporter.errors import InputError
from exporter.model import drafter
from exporter.model.kv_cache import bytes_per_token, kv_capacity
from exporter.model.setup import Setup

QWEN4 = dict(model="Qwen/Qwen3-4B", gpu="RTX-4090", max_model_len=4096, max_num_seqs=64,
             gpu_memory_utilization=0.9, vllm_version="0.11.0")
EAGLE3_HEAD = '{"model": "AngelSlim/Qwen3-4B_eagle3", "num_speculative_tokens": 3}'


def test_eagle3_head_on_qwen3_4b_costs_what_the_public_pair_logged():
    base = kv_capacity(Setup.build(**QWEN4))
    spec_setup = Setup.build(**QWEN4, speculative_config=EAGLE3_HEAD)
    spec = kv_capacity(spec_setup)
    assert spec_setup.speculative.method == "eagle3"          # detected from "eagle3" in the name
    # one Llama layer reading 2 x hidden, fc 3 x hidden -> hidden and its 32,000-row lm_head, bf16
    assert spec.memory.weights_gib - base.memory.weights_gib == pytest.approx(0.41, abs=0.01)
    # its one attention layer takes a page in every block: 37 layers where there were 36
    assert spec.bytes_per_token * 36 == base.bytes_per_token * 37
    assert spec.tokens / base.tokens == pytest.approx(83952 / 90480, abs=0.02)
    assert spec.tokens < base.tokens * 36 / 37


def test_a_heads_own_config_json_decides_its_layers_and_vocabulary(tmp_path):
    """Given as a local path, the head's config.json is read as vLLM reads it: its layers, and an
    lm_head of its draft_vocab_size; a head whose vocabulary is the target's shares the target's."""
    target = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", vllm_version="0.11.0")
    head = {"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
            "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 2048,
            "draft_vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "config.json").write_text(json.dumps(head))
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "config.json").write_text(json.dumps({**head, "draft_vocab_size": 128256,
                                                                 "num_hidden_layers": 2}))

    def draft(path):
        return target.rebuilt(speculative_config=json.dumps(
            {"method": "eagle3", "model": str(tmp_path / path), "num_speculative_tokens": 3}))
    own, shared = draft("own"), draft("shared")
    assert own.speculative.draft_vocab_size == 32000 and not own.speculative.notes
    assert drafter.draft_layers(own) == 1 and drafter.draft_layers(shared) == 2
    lm_head = 32000 * 4096 * 2
    layer = drafter.weight_bytes(shared) / 2 - 3 * 4096 * 4096 * 2 / 2   # per layer, fc aside
    assert drafter.weight_bytes(own) == pytest.approx(layer + 3 * 4096 * 4096 * 2 + lm_head, rel=1e-6)
    assert kv_capacity(shared).bytes_per_token == kv_capacity(target).bytes_per_token * 34 // 32


def test_deepseek_mtp_loads_the_checkpoints_own_layer():
    """--speculative-config '{"method": "deepseek_mtp", ...}' (vLLM renames it mtp) loads layer 61
    of the checkpoint: one MoE decoder layer in its FP8 blocks, an eh_proj (2 x 7168 -> 7168, whole
    on every rank) and its own shared_head lm_head (129,280 x 7168 split over TP), both 16-bit."""
    kw = dict(model="deepseek-ai/DeepSeek-R1", gpu="H200-SXM-141GB", tp=8, vllm_version="0.11.0")
    base = kv_capacity(Setup.build(**kw))
    setup = Setup.build(**kw, speculative_config='{"method": "deepseek_mtp", "num_speculative_tokens": 1}')
    assert setup.speculative.method == "mtp" and setup.model.mtp_layers == 1
    # the checkpoint named as the draft model is read as its MTP head too (hf_config_override)
    assert Setup.build(**kw, speculative_config='{"model": "deepseek-ai/DeepSeek-R1", '
                                                '"num_speculative_tokens": 1}').speculative.method == "mtp"
    mtp = kv_capacity(setup)
    experts = 256 * 3 * 7168 * 2048 / 8              # the MoE layer's experts on one rank, ~1 B each
    replicated = 2 * 7168 * 7168 * 2 + 129280 * 7168 * 2 / 8
    delta = (mtp.memory.weights_gib - base.memory.weights_gib) * 2**30
    assert experts + replicated < delta < 1.1 * (experts + replicated)
    # one more MLA latent per token in the pool: 62 pages where there were 61
    assert mtp.bytes_per_token * 61 == base.bytes_per_token * 62
    assert mtp.tokens < base.tokens * 61 / 62


def test_mimo_mtp_swaps_its_own_lm_head_for_the_targets():
    """MiMo's MTP module has one model-level lm_head, which EagleProposer.load_model replaces by
    the target's (method mtp is not eagle3), so the layer and its input_proj (nn.Linear 2 x 4096 ->
    4096, whole) are what stays: 177.2 M + 33.6 M parameters in bf16."""
    base = Setup.build("XiaomiMiMo/MiMo-7B-Base", "H100-SXM-80GB", vllm_version="0.11.0")
    mtp = base.rebuilt(speculative_config='{"method": "mimo_mtp", "num_speculative_tokens": 1}')
    layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 11008
    delta = (kv_capacity(mtp).memory.weights_gib - kv_capacity(base).memory.weights_gib) * 2**30
    assert delta == pytest.approx((layer + 2 * 4096 * 4096) * 2, rel=0.01)


def test_ngram_takes_no_memory_and_detection_follows_vllm():
    target = Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", vllm_version="0.11.0")
    ngram = target.rebuilt(speculative_config='{"method": "[ngram]", "num_speculative_tokens": 4}')
    assert ngram.speculative.method == "ngram"
    assert kv_capacity(ngram).tokens == kv_capacity(target).tokens
    assert bytes_per_token(ngram) == bytes_per_token(target)

    def method(cfg):
        return drafter.method_of(cfg)
    assert method({"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}) == "eagle"
    assert method({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}) == "eagle3"
    assert method({"model": "ngram"}) == "ngram"
    assert method({"method": "glm4_moe_mtp"}) == "mtp"
    assert method({"model": "meta-llama/Llama-3.2-1B-Instruct"}) == "draft_model"
    with pytest.raises(InputError, match="without a speculative model"):
        method({"num_speculative_tokens": 3})
    with pytest.raises(InputError, match="method 'medusa' is not modelled"):
        method({"method": "medusa"})


@pytest.mark.parametrize("flag, kw, match", [
    ('{"method": "mtp", "num_speculative_tokens": 1}', {}, "no num_nextn_predict_layers"),
    ('{"method": "ngram"}', {}, "num_speculative_tokens must be >= 1"),
    ('{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}', {"vllm_version": "0.14.0"},
     "not supported yet"),
    ('{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 4}',
     {"vllm_version": "0.7.3"}, "V0 engine"),
    ('{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}', {"vllm_version": "0.15.0"},
     "vocabulary of 151936"),
    ('{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}',
     {"vllm_version": "0.15.0", "pp": 2}, "pipeline parallelism"),
    ('{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1}',
     {"vllm_version": "0.15.0", "tp": 2}, "draft_tensor_parallel_size 1 != tensor_parallel_size 2"),
    ('[1, 2]', {}, "a JSON object expected"),
])
def test_what_vllm_refuses_is_refused_naming_the_flag(flag, kw, match):
    args = dict(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-SXM-80GB", vllm_version="0.11.0")
    with pytest.raises(InputError, match=match):
        Setup.build(**{**args, **kw}, speculative_config=flag)


def test_a_draft_model_from_0_15_pays_its_weights_and_its_own_pages():
    """vLLM 0.15's DraftModelProposer loads the draft whole (its own embedding and lm_head) at the
    target's TP; its layers' pages (16 layers of 2 x 64-wide KV heads per rank for Llama-3.2-1B at
    TP4) sit in every block beside the target's."""
    kw = dict(model="meta-llama/Llama-3.1-70B-Instruct", gpu="H100-SXM-80GB", tp=4, vllm_version="0.15.0")
    base = kv_capacity(Setup.build(**kw))
    setup = Setup.build(**kw, speculative_config='{"model": "meta-llama/Llama-3.2-1B-Instruct", '
                                                   '"num_speculative_tokens": 4}')
    cap = kv_capacity(setup)
    assert drafter.kv_token_bytes(setup) == 16 * 2 * 2 * 64 * 2
    assert cap.bytes_per_token == base.bytes_per_token + 16 * 2 * 2 * 64 * 2
    # 1.24 B parameters with a tied 128,256 x 2,048 table, bf16, over 4 ranks
    assert cap.memory.weights_gib - base.memory.weights_gib == pytest.approx(1.236e9 * 2 / 4 / 2**30, rel=0.03)
    pool_ratio = cap.memory.kv_cache_gib / base.memory.kv_cache_gib
    assert cap.tokens / base.tokens == pytest.approx(pool_ratio * base.bytes_per_token / cap.bytes_per_token,
                                                     rel=0.002)


def test_calc_flag_json_and_exit_codes():
    def calc(*extra):
        return subprocess.run([sys.executable, "-m", "exporter", "calc", "--model", "Qwen/Qwen3-4B",
                               "--gpu", "RTX-4090", "--max-model-len", "4096", "--vllm-version", "0.11.0",
                               "--json", *extra], capture_output=True, text=True, timeout=60)
    out = calc("--speculative-config", EAGLE3_HEAD, "--concurrency", "8")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    spec = doc["setup"]["speculative"]
    assert (spec["method"], spec["num_speculative_tokens"], spec["draft_layers"]) == ("eagle3", 3, 1)
    assert spec["draft_weights_gib"] == pytest.approx(0.41, abs=0.01)
    # the latency verdict is for the drafter the server runs
    assert doc["speculative_decoding"]["method"] == "eagle3"
    assert doc["speculative_decoding"]["num_speculative_tokens"] == 3
    assert any("32,000-token lm_head" in n for n in doc["notes"])
    bad = calc("--speculative-config", "{method: eagle}")
    assert bad.returncode == 2 and "--speculative-config" in bad.stderr and "JSON" in bad.stderr
    refused = calc("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
    assert refused.returncode == 2 and "num_nextn_predict_layers" in refused.stderr


def test_the_daemon_reads_the_drafter_off_a_pods_arguments():
    """A pod's `vllm serve ... --speculative-config '{...}'` rides along as a label (compact JSON);
    the daemon's prediction of the pool then counts the drafter, and a drafter the model does not
    describe leaves the prediction without it rather than without a prediction."""
    from exporter.drift.predict import ServerFlags

    hints = parse_vllm_args(["vllm", "serve", "deepseek-ai/DeepSeek-R1", "--tensor-parallel-size", "8",
                             "--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'])
    assert hints["speculative_config"] == '{"method":"deepseek_mtp","num_speculative_tokens":1}'
    assert "speculative_config" not in parse_vllm_args(["vllm", "serve", "m", "--speculative-config", "nope"])
    arch = Setup.build("deepseek-ai/DeepSeek-R1", "H200-SXM-141GB", tp=8).model
    flags = ServerFlags(tp=8, vllm_version=(0, 11, 0), speculative_config=hints["speculative_config"])
    with_mtp = flags.build(arch, Setup.build(arch, "H200-SXM-141GB", tp=8).gpu)
    assert with_mtp.speculative.method == "mtp"
    eagle_on_mla = ServerFlags(tp=8, vllm_version=(0, 11, 0),
                               speculative_config=speculative_label('{"method": "eagle", "model": "x", '
                                                                    '"num_speculative_tokens": 2}'))
    assert eagle_on_mla.build(arch, with_mtp.gpu).speculative is None


def test_the_daemon_judges_the_drafter_it_was_told_of():
    """A server whose metrics show speculation (k = 3 and its per-position acceptance) is judged
    with its own method's drafting cost when its --speculative-config is known: n-gram lookup
    costs the GPU nothing, an EAGLE-3 head a step of its own; and its pool carries the head."""
    from exporter.drift.predict import ServerFlags, predict, resolve_hints

    res = resolve_hints(["meta-llama/Llama-3.1-8B-Instruct"], "H100-SXM-80GB")
    traffic = {"prompt_mean": 512.0, "output_mean": 256.0, "running_mean": 8.0, "spec_k": 3,
               "spec_per_position": (0.7, 0.5, 0.3)}

    def judged(spec):
        return predict(res, ServerFlags(vllm_version=(0, 11, 0), speculative_config=spec), traffic=traffic,
                       slo={}, prices={})
    ngram = judged('{"method": "ngram", "num_speculative_tokens": 3}')
    eagle3 = judged('{"method": "eagle3", "model": "x/eagle3-head", "num_speculative_tokens": 3}')
    assert ngram.spec_speedup > 1.1 * eagle3.spec_speedup
    assert ngram.kv_cache_tokens == judged(None).kv_cache_tokens > eagle3.kv_cache_tokens


def test_a_draft_model_before_0_11_runs_on_v0_which_splits_the_targets_blocks():
    """vLLM 0.8-0.10 ran a separate draft model on the V0 engine; its SpecDecodeWorker profiled the
    target alone and split the target's blocks by page size (split_num_cache_blocks_evenly, the
    0.7.3 wheel). From 0.6.5 that profile counts the target's weights only (PRs #13221 and #14067,
    which would have counted the draft's, were closed unmerged); 0.6.3's free-memory accounting
    counted them."""
    kw = dict(model="Qwen/Qwen2.5-3B-Instruct", gpu="RTX-4090", max_model_len=4096, max_num_seqs=8)
    spec = '{"model": "Qwen/Qwen2.5-1.5B-Instruct", "num_speculative_tokens": 4}'
    target_page, draft_page = 36 * 2 * 2 * 128 * 2, 28 * 2 * 2 * 128 * 2
    for version in ("0.7.3", "0.9.2", "0.10.1"):
        setup = Setup.build(**kw, vllm_version=version, speculative_config=spec)
        assert setup.v0                                  # the fallback, on an Ada GPU V1 runs otherwise
        alone = kv_capacity(Setup.build(**kw, vllm_version="0.7.3"))
        with_draft = kv_capacity(setup)
        assert with_draft.memory.weights_gib == alone.memory.weights_gib
        assert with_draft.gpu_blocks == pytest.approx(alone.gpu_blocks * target_page / (target_page + draft_page),
                                                      abs=1)
    old = dict(kw, vllm_version="0.6.3")
    counted = kv_capacity(Setup.build(**old, speculative_config=spec))
    assert counted.memory.weights_gib - kv_capacity(Setup.build(**old)).memory.weights_gib == \
        pytest.approx(1.54e9 * 2 / 2**30, rel=0.02)
