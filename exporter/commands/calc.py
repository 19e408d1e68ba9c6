"""`vllm-drift calc`: the configuration calculator.

Why a command: the same model the daemon uses to call a configuration "optimal" is useful
before anything is deployed, to size a GPU, check a max_model_len or compare tiers. It prints
what vLLM would log at startup for the setup (KV cache size, max concurrency, memory split),
the predicted latency and throughput, the recommended engine flags and the GPU tiers.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter.model.kv_cache import KVCapacity, kv_capacity
from exporter.model.setup import Setup


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calc", help="predict KV capacity, latency and the best configuration for a model/GPU",
        description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, metavar="ID|PATH",
                   help="Hugging Face id (read from the HF cache, else the Hub unless HF_HUB_OFFLINE=1), "
                        "a local config.json / model dir, or a catalog id")
    p.add_argument("--gpu", required=True, metavar="NAME", help="GPU catalog name or alias (H100, L40S-48GB, ...)")
    p.add_argument("--gpu-memory-gib", type=float, metavar="F", help="total memory per GPU (overrides the catalog)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size (default 1)")
    p.add_argument("--pp", type=int, default=1, metavar="N", help="pipeline-parallel size (default 1)")
    p.add_argument("--dtype", default="auto", help="model dtype: auto, bfloat16, float16, float32")
    p.add_argument("--quantization", metavar="Q", help="weight quantization: fp8, awq, gptq, w8a8, w4a16, fp4, mxfp4")
    p.add_argument("--kv-cache-dtype", default="auto", metavar="auto|fp8", help="KV cache dtype (default auto)")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="F", help="default: vLLM's for the version")
    p.add_argument("--max-model-len", type=int, metavar="N", help="default: the model's max position embeddings")
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="default: vLLM's for the GPU and version")
    p.add_argument("--max-num-batched-tokens", type=int, metavar="N", help="default: vLLM's for the GPU and version")
    p.add_argument("--block-size", type=int, metavar="N", help="KV block size in tokens (default 16)")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="vLLM release whose accounting to follow")
    t = p.add_argument_group("traffic")
    t.add_argument("--prompt-tokens", type=int, default=1024, metavar="N", help="mean prompt length (default 1024)")
    t.add_argument("--output-tokens", type=int, default=256, metavar="N", help="mean output length (default 256)")
    t.add_argument("--rate", type=float, metavar="RPS", help="arrival rate, requests per second")
    t.add_argument("--concurrency", type=int, metavar="N", help="closed-loop concurrency")
    t.add_argument("--prefix-hit-ratio", type=float, default=0.0, metavar="F", help="share of prompt tokens hit in the prefix cache")
    s = p.add_argument_group("SLOs and speculation")
    s.add_argument("--ttft-slo", type=float, metavar="S", help="time-to-first-token objective, seconds")
    s.add_argument("--tpot-slo", type=float, metavar="S", help="time-per-output-token objective, seconds")
    s.add_argument("--spec-tokens", type=int, default=0, metavar="K", help="speculative tokens per step (0 = off)")
    s.add_argument("--spec-acceptance", type=float, metavar="F", help="per-token draft acceptance rate")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def resolve(args: argparse.Namespace):
    """`--model` through the resolution chain (exporter/model/resolve.py), once per run."""
    from exporter.model.resolve import resolve_model
    if getattr(args, "_resolved", None) is None:
        args._resolved = resolve_model(args.model)
    return args._resolved


def build_setup(args: argparse.Namespace) -> Setup:
    return Setup.build(
        resolve(args).arch, args.gpu, tp=args.tp, pp=args.pp, dtype=args.dtype,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, gpu_memory_gib=args.gpu_memory_gib,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        vllm_version=args.vllm_version)


def _validate_traffic(args: argparse.Namespace) -> None:
    from exporter.errors import InputError
    if args.prompt_tokens < 1 or args.output_tokens < 1:
        raise InputError("--prompt-tokens and --output-tokens must be >= 1")
    if args.rate is not None and args.rate <= 0:
        raise InputError(f"--rate must be positive (got {args.rate})")
    if args.concurrency is not None and args.concurrency < 1:
        raise InputError(f"--concurrency must be >= 1 (got {args.concurrency})")
    if not 0 <= args.prefix_hit_ratio < 1:
        raise InputError(f"--prefix-hit-ratio must be in [0, 1) (got {args.prefix_hit_ratio})")
    if args.spec_acceptance is not None and not 0 <= args.spec_acceptance <= 1:
        raise InputError(f"--spec-acceptance must be in [0, 1] (got {args.spec_acceptance})")
    if args.spec_tokens < 0:
        raise InputError(f"--spec-tokens must be >= 0 (got {args.spec_tokens})")


def kv_sections(setup: Setup, cap: KVCapacity) -> dict[str, Any]:
    """The `kv_cache`, `memory` and `setup` sections of the JSON document."""
    m = cap.memory
    return {
        "setup": {
            "model": setup.model.name, "gpu": setup.gpu.name, "tp": setup.tp, "pp": setup.pp,
            "dtype": setup.dtype, "quantization": setup.quantization,
            "kv_cache_dtype": setup.kv_cache_dtype,
            "gpu_memory_utilization": setup.gpu_memory_utilization,
            "gpu_memory_gib": setup.gpu_memory_gib, "max_model_len": setup.max_model_len,
            "max_num_seqs": setup.max_num_seqs,
            "max_num_batched_tokens": setup.max_num_batched_tokens,
            "block_size": setup.block_size,
            "vllm_version": ".".join(str(x) for x in setup.vllm_version),
        },
        "kv_cache": {
            "bytes_per_token": cap.bytes_per_token, "tokens": cap.tokens,
            "gpu_blocks": cap.gpu_blocks, "max_concurrency": round(cap.max_concurrency, 2),
            "block_size": cap.block_size, "num_groups": cap.num_groups,
            "blocks_per_request": cap.blocks_per_request,
        },
        "memory": {
            "weights_gib": round(m.weights_gib, 3), "activation_gib": round(m.activation_gib, 3),
            "non_torch_gib": round(m.non_torch_gib, 3), "cudagraph_gib": round(m.cudagraph_gib, 3),
            "kv_cache_gib": round(m.kv_cache_gib, 3), "requested_gib": round(m.requested_gib, 3),
        },
    }


def performance_sections(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    """`predicted`, `recommendation` and `tiers`, from the performance model."""
    from exporter.model.report import performance_report
    return performance_report(
        setup, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
        concurrency=args.concurrency, rate=args.rate, prefix_hit_ratio=args.prefix_hit_ratio,
        ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo, spec_tokens=args.spec_tokens,
        spec_acceptance=args.spec_acceptance)


def fit_setup(args: argparse.Namespace) -> tuple[Setup, KVCapacity, list[str]]:
    """The setup and its KV capacity. An explicit `--max-model-len` that does not fit is an error,
    as it is for vLLM; the *default* (the model's own maximum) is lowered to the largest length
    the pool holds, with a note, since the question asked was not about that length."""
    import dataclasses

    from exporter.model.kv_cache import largest_max_model_len

    setup = build_setup(args)
    if args.max_model_len is not None:
        return setup, kv_capacity(setup), []
    loose = kv_capacity(setup, check_fits=False)
    if loose.blocks_per_request <= loose.gpu_blocks:
        return setup, loose, []
    largest = largest_max_model_len(setup, loose.gpu_blocks)
    if largest < 1:
        return setup, kv_capacity(setup), []   # raises with vLLM's message
    fitted = dataclasses.replace(setup, max_model_len=largest)
    note = (f"the model's default max_model_len {setup.max_model_len} does not fit the KV cache; "
            f"using the largest that does, {largest} (pass --max-model-len to choose)")
    return fitted, kv_capacity(fitted), [note]


def run(args: argparse.Namespace) -> int:
    _validate_traffic(args)
    setup, cap, notes = fit_setup(args)
    doc = {"model": resolve(args).as_dict()}
    doc.update(kv_sections(setup, cap))
    doc.update(performance_sections(setup, args))
    if notes:
        doc["notes"] = notes
        for note in notes:
            print(f"vllm-drift calc: note: {note}", file=sys.stderr)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(doc))
    return 0


# ---- human output ------------------------------------------------------------------------------

def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title, "-" * len(title)]
    for k, v in rows:
        if isinstance(v, dict):  # e.g. the binding constraint of each recommendation
            lines.append(f"  {k}:")
            sub = max((len(str(x)) for x in v), default=0)
            lines += [f"    {x:<{sub}}  {_fmt(y)}" for x, y in v.items()]
        else:
            lines.append(f"  {k:<{width}}  {_fmt(v)}")
    return "\n".join(lines) + "\n\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return "-" if v is None else str(v)


def render(doc: dict[str, Any]) -> str:
    s = doc["setup"]
    out = []
    if isinstance(doc.get("model"), dict):
        m = doc["model"]
        out.append(f"Model config: {m['source']} (via {m['via']}: {m['name']})\n"
                   + "".join(f"  - {n}\n" for n in m.get("notes") or []) + "\n")
    out += [_table(f"Setup: {s['model']} on {s['tp'] * s['pp']} x {s['gpu']}", list(s.items())[2:])]
    kv = doc["kv_cache"]
    out.append(_table("KV cache (as vLLM logs it at startup)", [
        ("GPU KV cache size (tokens)", kv["tokens"]), ("GPU blocks", kv["gpu_blocks"]),
        (f"max concurrency at {s['max_model_len']:,} tokens", kv["max_concurrency"]),
        ("KV bytes per token per GPU", kv["bytes_per_token"]), ("KV cache groups", kv["num_groups"])]))
    mem = doc["memory"]
    out.append(_table("Memory per GPU (GiB)", [(k.removesuffix("_gib"), v) for k, v in mem.items()]))
    for key in ("predicted", "recommendation"):
        section = doc.get(key)
        if isinstance(section, dict):
            out.append(_table(key.capitalize(), list(section.items())))
    tiers = doc.get("tiers")
    if isinstance(tiers, list) and tiers:
        cols = ["gpu", "tp", "replicas", "dollars_per_hour", "dollars_per_million_tokens", "meets_slo"]
        cells = [[_fmt(t.get(c)) for c in cols] for t in tiers if isinstance(t, dict)]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
        def line(values: list[str]) -> str:
            return "  " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                    for i, (v, w) in enumerate(zip(values, widths)))
        lines = ["GPU tiers", "---------", line(cols)] + [line(r) for r in cells]
        out.append("\n".join(lines) + "\n")
    return "".join(out)
