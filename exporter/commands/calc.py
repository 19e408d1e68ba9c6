"""`vllm-drift calc`: the configuration calculator.

Why a command: the same model the daemon uses to call a configuration "optimal" is useful
before anything is deployed, to size a GPU, check a max_model_len or compare tiers. It prints
what vLLM would log at startup for the setup (KV cache size, max concurrency, memory split),
the predicted latency and throughput, the recommended engine flags, the speculative-decoding
verdict and the GPU tiers; `--profile` fills traffic and SLOs from a workload preset, `--sweep`
prints one parameter's trade-off table and `--html` writes a self-contained report with plots.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

from exporter.discovery import vllm_args
from exporter.errors import CatalogError, InputError
from exporter.model import drafter
from exporter.model.calibrate import choose_kv_cache, fit_setup as fit_calibration, read_rows
from exporter.model.gpus import device_for_cli
from exporter.model.kv_cache import (KVCapacity, kv_capacity, largest_max_model_len, lora_bytes, offloaded_bytes,
                                     startup_refusal)
from exporter.model.profiles import Profile, get_profile, profiles
from exporter.model.report import make_traffic, performance_report
from exporter.model.setup import KV_CACHE_MEMORY_BYTES, V1_DEFAULT, Setup, lora_slots
from exporter.model.traffic import SLO, lengths_from_file
from exporter.model.vision import encoder_profile
from exporter.model import tradeoff
from exporter.parse.version import format_version

DESCRIPTION = """\
Predict what vLLM will do with a model on a GPU before deploying it: the KV cache it logs at
startup, memory split, latency and throughput, the engine flags to use (each with the constraint
that sets it), whether speculative decoding pays, and the cheapest GPU tiers.

Traffic: --prompt-tokens/--output-tokens are MEANS; give the tail with --prompt-tokens-p99/
--output-tokens-p99 or --lengths-from a request log, else a documented margin (p99 = 3.37 x mean)
is used and said. --profile fills traffic, SLOs and objective from a workload preset; any flag
overrides it. --sweep prints one parameter's trade-off table; --html writes a report with plots.
"""

EXAMPLES = """examples:
  vllm-drift calc --model meta-llama/Llama-3.1-8B-Instruct --gpu H100-SXM-80GB --profile chatbot
  vllm-drift calc --model Qwen/Qwen2.5-7B-Instruct --gpu L40S --sweep max_num_seqs --json
  vllm-drift calc --model meta-llama/Llama-3.1-70B-Instruct --gpu H100 --tp 4 --html report.html
  vllm-drift calc --list-profiles
"""

# Built-in traffic when neither a flag nor a profile gives it (means; tails get the margin).
DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256

# (group, flags, argparse keywords). Adding an option is one row here; `dest` defaults as argparse
# derives it. Traffic/SLO options default to None so a profile can fill what was not given.
ARGUMENTS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("setup", ("--model",), dict(metavar="ID|PATH", help="Hugging Face id (read from the HF cache, else the Hub unless "
                                 "HF_HUB_OFFLINE=1), a local config.json / model dir, or a catalog id "
                                 "(see `vllm-drift catalog models`)")),
    ("setup", ("--gpu",), dict(metavar="NAME", help="GPU catalog name, alias or the name nvidia-smi/amd-smi prints "
                               "(H100, L40S-48GB, 'Tesla V100-SXM2-32GB', ...; see `vllm-drift catalog gpus`)")),
    ("setup", ("--gpu-memory-gib",), dict(type=float, metavar="GIB", help="total memory per GPU (overrides the "
                                          "catalog; without --gpu, or with an unknown one, describes the device)")),
    ("setup", ("--gpu-memory-in-use",), dict(type=float, metavar="GIB", help="GiB other processes already hold on "
                                             "each GPU when the server starts (a desktop, another server on the "
                                             "device): from 0.9.1 vLLM refuses to start when the rest is under "
                                             "gpu_memory_utilization x total; 0.6.4 and V1 0.8-0.9.0 charge it "
                                             "against the KV cache; V0 runs out of memory allocating it")),
    ("setup", ("--gpu-bandwidth-gbs",), dict(type=float, metavar="GBS", help="memory bandwidth per GPU, GB/s "
                                             "(overrides the catalog or describes an unknown device)")),
    ("setup", ("--gpu-tflops",), dict(type=float, metavar="TFLOPS", help="dense FP16/BF16 TFLOPS per GPU "
                                      "(overrides the catalog or describes an unknown device)")),
    ("setup", ("--gpu-file",), dict(metavar="FILE", help="YAML rows adding or overriding GPUs (schema of the "
                                    "`gpus:` config section, see docs/gpus.md)")),
    ("setup", ("--tp",), dict(type=int, default=1, metavar="N", help="tensor-parallel size (default 1)")),
    ("setup", ("--pp",), dict(type=int, default=1, metavar="N", help="pipeline-parallel size (default 1)")),
    ("setup", ("--data-parallel",), dict(type=int, default=1, metavar="N",
                                         help="data-parallel engines (--data-parallel-size); MoE experts "
                                              "spread over tp x N GPUs (default 1)")),
    ("setup", ("--enable-expert-parallel",), dict(action="store_true",
                                                  help="whole MoE experts per GPU instead of tensor-split experts")),
    ("setup", ("--dtype",), dict(default="auto", metavar="DTYPE", help="model dtype: auto, bfloat16, float16, float32")),
    ("setup", ("--quantization",), dict(metavar="SCHEME", help="weight quantization: fp8, awq, gptq, w8a8, w4a16, nvfp4, mxfp4")),
    ("setup", ("--vllm-version",), dict(metavar="X.Y.Z", help="vLLM release whose defaults and accounting to follow")),
    ("engine flags", ("--kv-cache-dtype",), dict(metavar="auto|fp8", help="KV cache dtype (default: fp8 for FP8/FP4 "
                                                 "weights given with --quantization, as such deployments run; "
                                                 "otherwise auto, vLLM's own)")),
    ("engine flags", ("--gpu-memory-utilization",), dict(type=float, metavar="F", help="default: vLLM's for the version")),
    ("engine flags", ("--kv-cache-memory-bytes",), dict(type=vllm_args.flag_type(vllm_args.token_count),
                                                        metavar="BYTES", help="KV cache per GPU as given, ignoring "
                                                        "--gpu-memory-utilization (40G = 40 GiB, 40g = 40e9 bytes)")),
    ("engine flags", ("--num-gpu-blocks-override",), dict(type=int, metavar="N", help="KV cache blocks per GPU as "
                                                          "given (vLLM's testing override)")),
    ("engine flags", ("--enable-chunked-prefill",), dict(action=vllm_args.BooleanFlag, default=None,
                                                         help="default: vLLM's for the version (always from "
                                                              "V1; V0 above 32k context)")),
    ("engine flags", ("--enable-prefix-caching",), dict(action=vllm_args.BooleanFlag, default=None,
                                                        help="default: vLLM's for the version (on from V1, for "
                                                             "Mamba / linear-attention hybrids from 0.28)")),
    ("engine flags", ("--async-scheduling",), dict(action=vllm_args.BooleanFlag, default=None,
                                                   help="default: vLLM's for the version (on from 0.14; from 0.26 "
                                                        "a sliding-window request is sized for two batches in "
                                                        "flight; vLLM's CPU build runs without)")),
    ("engine flags", ("--mamba-cache-dtype",), dict(metavar="DTYPE", help="Mamba / linear-attention "
                                                    "state dtype: auto (the model's), float32, float16, bfloat16")),
    ("engine flags", ("--mamba-ssm-cache-dtype",), dict(metavar="DTYPE", help="their temporal (SSM) state's "
                                                        "dtype; default: what the model's config names (Nemotron-H, "
                                                        "Qwen3.5), else --mamba-cache-dtype's")),
    ("engine flags", ("--enforce-eager",), dict(action="store_true", help="no CUDA graphs: no graph memory, "
                                                "and a step waits on the host launching its kernels")),
    ("engine flags", ("--max-model-len",), dict(type=vllm_args.flag_type(vllm_args.max_model_len), metavar="N",
                                                help="as vLLM reads it (32k = 32,000, 32K = 32,768; auto or -1: the "
                                                     "largest the KV cache holds); default: the model's max position "
                                                     "embeddings, lowered to what fits")),
    ("engine flags", ("--max-num-seqs",), dict(type=int, metavar="N", help="default: vLLM's for the GPU and version")),
    ("engine flags", ("--max-num-batched-tokens",), dict(type=vllm_args.flag_type(vllm_args.token_count),
                                                         metavar="N", help="as vLLM reads it (16k, 16K); default: "
                                                                           "vLLM's for the GPU and version")),
    ("engine flags", ("--block-size",), dict(type=int, metavar="N", help="KV block size in tokens (default 16)")),
    ("engine flags", ("--limit-mm-per-prompt",), dict(type=vllm_args.flag_type(vllm_args.mm_limits),
                                                      metavar="JSON", help="multimodal items per prompt as vLLM "
                                                      "reads it ('{\"image\": 2, \"video\": 0}' or image=2,video=0): "
                                                      "what the startup profile encodes")),
    ("engine flags", ("--mm-processor-kwargs",), dict(type=vllm_args.flag_type(vllm_args.mm_max_pixels),
                                                      metavar="JSON", dest="mm_max_pixels",
                                                      help="the image processor's max_pixels (Qwen-VL: "
                                                           "'{\"max_pixels\": 1003520}'), the size of the dummy "
                                                           "image the startup profile encodes")),
    ("engine flags", ("--skip-mm-profiling",), dict(action="store_true", help="no multimodal encoder in the "
                                                    "startup profile (from vLLM 0.10.1)")),
    ("engine flags", ("--cpu-offload-gb",), dict(type=vllm_args.flag_type(vllm_args.gib), metavar="GIB", help="GiB of each GPU's decoder-layer "
                                                 "weights vLLM keeps in pinned host memory: less memory, every step "
                                                 "reads them over the host link (PCIe, NVLink-C2C)")),
    ("engine flags", ("--enable-lora",), dict(action="store_true", help="LoRA adapters: vLLM preallocates "
                                              "their stacked buffers beside every linear layer")),
    ("engine flags", ("--max-loras",), dict(type=int, metavar="N", help="adapters held at once (default 1)")),
    ("engine flags", ("--max-lora-rank",), dict(type=int, metavar="R", help="largest adapter rank (default 16)")),
    ("engine flags", ("--fully-sharded-loras",), dict(action="store_true", help="split the LoRA buffers over TP")),
    ("engine flags", ("--speculative-config",), dict(type=vllm_args.flag_type(vllm_args.speculative_label),
                                                     metavar="JSON", help="speculative decoding as vLLM reads it "
                                                     "('{\"method\": \"eagle3\", \"model\": \"<head>\", "
                                                     "\"num_speculative_tokens\": 3}'; ngram, eagle, eagle3, mtp, "
                                                     "a draft model): the drafter's weights and KV pages, and its "
                                                     "tokens for the latency")),
    ("traffic", ("--profile",), dict(metavar="NAME", help="workload preset: " + ", ".join(profiles())
                                     + " (any traffic/SLO flag overrides it; --list-profiles)")),
    ("traffic", ("--list-profiles",), dict(action="store_true", help="print the workload presets and exit")),
    ("traffic", ("--prompt-tokens",), dict(type=int, metavar="N", help=f"MEAN prompt length (default {DEFAULT_PROMPT_TOKENS})")),
    ("traffic", ("--output-tokens",), dict(type=int, metavar="N", help=f"MEAN output length (default {DEFAULT_OUTPUT_TOKENS})")),
    ("traffic", ("--prompt-tokens-p99",), dict(type=int, metavar="N", help="p99 prompt length (default: mean x 3.37, "
                                                "a lognormal tail margin, stated in the output)")),
    ("traffic", ("--output-tokens-p99",), dict(type=int, metavar="N", help="p99 output length (default: mean x 3.37)")),
    ("traffic", ("--lengths-from",), dict(metavar="FILE", help="per-request lengths (CSV or JSON Lines with "
                                          "prompt_tokens, output_tokens): their means and p99s")),
    ("traffic", ("--rate",), dict(type=float, metavar="RPS", help="open-loop arrival rate, requests per second")),
    ("traffic", ("--concurrency",), dict(type=int, metavar="N", help="closed-loop concurrency (clients)")),
    ("traffic", ("--prefix-hit-ratio",), dict(type=float, metavar="F", help="share of prompt tokens hit in the prefix cache")),
    ("SLOs and speculation", ("--ttft-slo",), dict(type=float, metavar="SECONDS", help="time-to-first-token p99 objective")),
    ("SLOs and speculation", ("--tpot-slo",), dict(type=float, metavar="SECONDS", help="time-per-output-token p99 objective")),
    ("SLOs and speculation", ("--spec-tokens",), dict(type=int, default=0, metavar="K",
                                                      help="speculative tokens per step (0: judge k=3 EAGLE across acceptance 0.3-0.9)")),
    ("SLOs and speculation", ("--spec-acceptance",), dict(type=float, metavar="F", help="measured per-token draft acceptance rate")),
    ("calibration", ("--calibrate",), dict(action="append", default=[], metavar="FILE.csv",
                                           help="measured rows (columns of throughput-observations.csv, as `sweep --out` "
                                                "writes) that fit the step-time model before predicting; repeatable")),
    ("output", ("--sweep",), dict(metavar="PARAM", choices=tradeoff.PARAMS,
                                  help="trade-off table for one parameter: " + ", ".join(tradeoff.PARAMS))),
    ("output", ("--html",), dict(metavar="FILE", type=Path, help="write a self-contained HTML report with plots "
                                 "(needs the [report] extra: pip install 'vllm-drift[report]')")),
    ("output", ("--json",), dict(action="store_true", help="print one JSON document")),
]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calc", help="predict KV capacity, latency and the best configuration for a model/GPU",
        description=DESCRIPTION,
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups: dict[str, Any] = {}
    for group, flags, kw in ARGUMENTS:
        if group not in groups:
            groups[group] = p.add_argument_group(group)
        groups[group].add_argument(*flags, **kw)
    p.set_defaults(func=run)


# ---- inputs ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Inputs:
    """Traffic and SLOs after profile + flags: what the calculation used, and where it came from."""
    prompt_tokens: float
    output_tokens: float
    prompt_tokens_p99: float | None
    output_tokens_p99: float | None
    prefix_hit_ratio: float
    ttft_slo: float | None
    tpot_slo: float | None
    objective: str
    profile: Profile | None
    overridden: list[str]
    lengths_from: dict[str, Any] | None = None


_PROFILE_FIELDS = (("prompt_tokens", "prompt_tokens_mean"), ("output_tokens", "output_tokens_mean"),
                   ("prompt_tokens_p99", "prompt_tokens_p99"), ("output_tokens_p99", "output_tokens_p99"),
                   ("prefix_hit_ratio", "prefix_hit_ratio"), ("ttft_slo", "ttft_p99_s"),
                   ("tpot_slo", "tpot_p99_s"))


def resolve_inputs(args: argparse.Namespace) -> Inputs:
    """Each value from, in order: its flag, --lengths-from, the profile, the built-in default."""
    prof = get_profile(args.profile) if args.profile else None
    measured = lengths_from_file(args.lengths_from) if args.lengths_from else {}
    values: dict[str, Any] = {}
    overridden = []
    for flag, attr in _PROFILE_FIELDS:
        given = getattr(args, flag)
        if given is None:
            given = measured.get(flag)
        if given is not None:
            values[flag] = given
            if prof is not None and getattr(prof, attr) != given:
                overridden.append("--" + flag.replace("_", "-") if flag not in measured else "--lengths-from")
        else:
            values[flag] = getattr(prof, attr) if prof is not None else None
    values["prompt_tokens"] = values["prompt_tokens"] or DEFAULT_PROMPT_TOKENS
    values["output_tokens"] = values["output_tokens"] or DEFAULT_OUTPUT_TOKENS
    values["prefix_hit_ratio"] = values["prefix_hit_ratio"] or 0.0
    inp = Inputs(**values, objective=prof.objective if prof else "cost", profile=prof,
                 overridden=list(dict.fromkeys(overridden)),
                 lengths_from={"file": str(args.lengths_from), "requests": measured["requests"]} if measured else None)
    _validate(args, inp)
    return inp


def _validate(args: argparse.Namespace, inp: Inputs) -> None:
    if inp.prompt_tokens < 1 or inp.output_tokens < 1:
        raise InputError("--prompt-tokens and --output-tokens must be >= 1")
    for flag, p99, mean in (("--prompt-tokens-p99", inp.prompt_tokens_p99, inp.prompt_tokens),
                            ("--output-tokens-p99", inp.output_tokens_p99, inp.output_tokens)):
        if p99 is not None and p99 < mean:
            raise InputError(f"{flag} ({p99:g}) must be >= the mean ({mean:g})")
    if args.rate is not None and args.rate <= 0:
        raise InputError(f"--rate must be positive (got {args.rate})")
    if args.concurrency is not None and args.concurrency < 1:
        raise InputError(f"--concurrency must be >= 1 (got {args.concurrency})")
    if not 0 <= inp.prefix_hit_ratio < 1:
        raise InputError(f"--prefix-hit-ratio must be in [0, 1) (got {inp.prefix_hit_ratio})")
    for flag, v in (("--ttft-slo", inp.ttft_slo), ("--tpot-slo", inp.tpot_slo)):
        if v is not None and not v > 0:
            raise InputError(f"{flag} must be > 0 seconds (got {v})")
    if args.spec_acceptance is not None and not 0 <= args.spec_acceptance < 1:
        raise InputError(f"--spec-acceptance must be in [0, 1) (got {args.spec_acceptance})")
    if args.spec_tokens < 0:
        raise InputError(f"--spec-tokens must be >= 0 (got {args.spec_tokens})")


def resolve(args: argparse.Namespace):
    """`--model` through the resolution chain (exporter/model/resolve.py: local path, HF cache,
    catalog id, Hub, catalog by name), once per run; the error names every source tried."""
    from exporter.model.resolve import resolve_model
    if getattr(args, "_resolved", None) is not None:
        return args._resolved
    try:
        args._resolved = resolve_model(args.model)
    except CatalogError as exc:
        tried = str(exc).partition(": ")[2] or str(exc)
        if "closest" not in tried:
            # no name was close enough for the resolver: still point at the nearest ids
            from exporter.model.architectures import catalog_ids
            stems = {i.split("/")[-1].lower(): i for i in catalog_ids()}
            close = difflib.get_close_matches(args.model.split("/")[-1].lower(), list(stems), n=3, cutoff=0.0)
            tried += (f"; closest catalog ids: {', '.join(stems[c] for c in close)} "
                      "(all: `vllm-drift catalog models`)")
        raise CatalogError(f"unknown model {args.model!r}: {tried}") from None
    return args._resolved


def calibration_rows(args: argparse.Namespace) -> list:
    """The rows of `--calibrate`'s files, read once per run (the KV choice and the fit use them)."""
    if getattr(args, "_calibration_rows", None) is None:
        args._calibration_rows = read_rows(args.calibrate)
    return args._calibration_rows


def build_setup(args: argparse.Namespace) -> Setup:
    return _build_setup(args)


def _build_setup(args: argparse.Namespace) -> Setup:
    gpu = device_for_cli(args.gpu, gpu_file=args.gpu_file, memory_gib=args.gpu_memory_gib,
                         bandwidth_gbs=args.gpu_bandwidth_gbs, tflops=args.gpu_tflops)
    arch = resolve(args).arch
    mml = args.max_model_len
    if (mml is not None and mml > arch.max_position_embeddings and arch.length_in_config
            and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() not in ("1", "true")):
        # vLLM's _get_and_verify_max_len, with the same way out (and the same exception: a config
        # with no length key takes the given length, Mamba's among them)
        raise InputError(f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
                         f"({arch.max_position_embeddings}) of {arch.name}: vLLM refuses to start; set "
                         f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to override, as vLLM takes it")
    return Setup.build(
        arch, gpu, tp=args.tp, pp=args.pp, dtype=args.dtype,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, gpu_memory_gib=args.gpu_memory_gib,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        vllm_version=args.vllm_version, dp=getattr(args, "data_parallel", 1) or 1,
        expert_parallel=bool(getattr(args, "enable_expert_parallel", False)),
        kv_cache_memory_bytes=getattr(args, "kv_cache_memory_bytes", None),
        num_gpu_blocks_override=getattr(args, "num_gpu_blocks_override", None),
        enforce_eager=bool(getattr(args, "enforce_eager", False)),
        enable_chunked_prefill=getattr(args, "enable_chunked_prefill", None),
        enable_prefix_caching=getattr(args, "enable_prefix_caching", None),
        async_scheduling=getattr(args, "async_scheduling", None),
        mamba_cache_dtype=getattr(args, "mamba_cache_dtype", None),
        mamba_ssm_cache_dtype=getattr(args, "mamba_ssm_cache_dtype", None),
        mm_limits=getattr(args, "limit_mm_per_prompt", None),
        skip_mm_profiling=bool(getattr(args, "skip_mm_profiling", False)),
        mm_max_pixels=getattr(args, "mm_max_pixels", None),
        flashinfer_sampler=_env_flag("VLLM_USE_FLASHINFER_SAMPLER"),
        use_v1=_env_flag("VLLM_USE_V1"),
        speculative_config=_speculative(args),
        cpu_offload_gb=getattr(args, "cpu_offload_gb", None),
        gpu_memory_in_use_gib=getattr(args, "gpu_memory_in_use", None),
        max_loras=lora_slots(getattr(args, "enable_lora", False), getattr(args, "max_loras", None)),
        max_lora_rank=getattr(args, "max_lora_rank", None),
        fully_sharded_loras=bool(getattr(args, "fully_sharded_loras", False)))


def _speculative(args: argparse.Namespace):
    """`--speculative-config` read, a draft model resolved like --model (Setup.build checks it)."""
    flag = getattr(args, "speculative_config", None)
    if not flag:
        return None
    from exporter.model.resolve import resolve_model

    def draft(name: str):
        try:
            return resolve_model(name).arch
        except CatalogError as exc:
            raise InputError(f"--speculative-config: draft model {name!r}: {exc}") from None
    return drafter.from_flag(flag, resolve=draft)


def _env_flag(name: str) -> bool | None:
    """A vLLM environment switch as vLLM's envs.py reads it (`bool(int(value))`), None when unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return bool(int(value))
    except ValueError:
        raise InputError(f"{name}={value!r}: vLLM reads it as 0 or 1") from None


def fit_setup(args: argparse.Namespace) -> tuple[Setup, KVCapacity, list[str]]:
    """The setup and its KV capacity. An explicit `--max-model-len` that does not fit is an error,
    as it is for vLLM; the *default* (the model's own maximum) is lowered to the largest length
    the pool holds, with a note, since the question asked was not about that length."""
    setup = build_setup(args)
    notes = list(resolve(args).notes)   # e.g. a name answered by another catalog entry
    assumed = setup.kv_cache_dtype
    if args.kv_cache_dtype is None and args.calibrate:
        # not given: the measured rows say which pool the server had
        setup, why = choose_kv_cache(setup, calibration_rows(args), quantization=args.quantization,
                                     vllm_version=args.vllm_version)
        notes += [why] if why else []
    if (args.kv_cache_dtype is None and args.quantization and setup.kv_cache_dtype == "fp8"
            and assumed == "fp8"):
        notes.append(f"KV cache fp8 assumed for {setup.quantization} weights, as such checkpoints are served "
                     "(ModelOpt's carry FP8 KV scales; benchmark recipes pass --kv-cache-dtype fp8); "
                     "pass --kv-cache-dtype auto for vLLM's default with a runtime --quantization")
    if setup.v0 and setup.vllm_version >= V1_DEFAULT:
        # V1 fell back to V0 on this GPU (setup.V1_BEFORE_AMPERE): what the operator will see differs
        profile = (f"a chunked prefill of {setup.max_num_batched_tokens} tokens" if setup.enable_chunked_prefill
                   else f"one un-chunked prefill of {setup.max_num_batched_tokens} tokens (V0 chunks prefills "
                        "by itself only above 32k context)")
        reason = ("as VLLM_USE_V1=0 asks" if setup.use_v1 is False
                  else f"on {setup.gpu.name} (compute capability {setup.gpu.compute_capability}; V1 needs 8.0 "
                       "before 0.10.2)")
        notes.append(f"vLLM {format_version(setup.vllm_version)} runs the V0 engine {reason}: it "
                     f"logs '# GPU blocks' and its memory profile is {profile}")
    if setup.kv_cache_memory_bytes and setup.vllm_version < KV_CACHE_MEMORY_BYTES:
        notes.append(f"--kv-cache-memory-bytes: vLLM {format_version(setup.vllm_version)} may not have it "
                     f"(added in 0.10.2 by vllm PR #21489); the pool is the bytes as given")
    if setup.flashinfer_sampler is None and setup.flashinfer_sampling:
        notes.append(f"vLLM {format_version(setup.vllm_version)} profiles FlashInfer's sampler where FlashInfer is "
                     f"installed (vLLM's images); a pip install without the flashinfer extra sorts the vocabulary "
                     f"in PyTorch, a larger peak: run calc with VLLM_USE_FLASHINFER_SAMPLER=0 for it")
    enc = encoder_profile(setup)
    if enc is not None:
        notes.append(f"multimodal: vLLM's startup profile encodes {enc.describe()}, "
                     f"{enc.kept_bytes / 2**30:.2f} GiB of outputs kept through the language model's dummy run "
                     f"(the activation is the larger phase; --limit-mm-per-prompt, --mm-processor-kwargs and "
                     f"--skip-mm-profiling change it)")
    refused = startup_refusal(setup)
    if refused:   # before any profile: vLLM prints no KV line to report
        raise InputError(refused)
    auto = args.max_model_len == vllm_args.AUTO
    if args.max_model_len is not None and not auto:   # checked in run(): refused, but --json still prints
        return setup, kv_capacity(setup, check_fits=False, allow_no_pool=True), notes
    loose = kv_capacity(setup, check_fits=False, allow_no_pool=True)
    if loose.fits:
        if auto:
            notes.append(f"max_model_len auto: the model's {setup.max_model_len} fits the KV cache")
        return setup, loose, notes
    if loose.memory.kv_cache_gib <= 0:
        return setup, loose, notes   # no pool at all: refused in run(), --json still prints
    largest = largest_max_model_len(setup, loose.fit_blocks)
    if largest < 1:
        return setup, kv_capacity(setup), notes   # raises with vLLM's message
    fitted = dataclasses.replace(setup, max_model_len=largest)
    if auto:   # vLLM's auto-fit logs "Auto-fit max_model_len: reduced from X to Y"
        notes.append(f"max_model_len auto: reduced from {setup.max_model_len} to {largest}, the largest the "
                     f"KV cache holds, as vLLM's auto-fit does")
    else:
        notes.append(f"the model's default max_model_len {setup.max_model_len} does not fit the KV cache; "
                     f"using the largest that does, {largest} (pass --max-model-len to choose)")
    return fitted, kv_capacity(fitted), notes


def kv_sections(setup: Setup, cap: KVCapacity) -> dict[str, Any]:
    """The `setup`, `kv_cache` and `memory` sections of the JSON document."""
    m = cap.memory
    return {
        "setup": {
            "model": setup.model.name, "gpu": setup.gpu.name, "tp": setup.tp, "pp": setup.pp,
            "data_parallel": setup.dp, "expert_parallel": setup.expert_parallel,
            "dtype": setup.dtype, "quantization": setup.quantization,
            "kv_cache_dtype": setup.kv_cache_dtype,
            "gpu_memory_utilization": setup.gpu_memory_utilization,
            "gpu_memory_gib": setup.gpu_memory_gib, "gpu_memory_in_use_gib": setup.gpu_memory_in_use_gib,
            "max_model_len": setup.max_model_len,
            "max_num_seqs": setup.max_num_seqs,
            "max_num_batched_tokens": setup.max_num_batched_tokens,
            "block_size": setup.block_size, "kv_cache_memory_bytes": setup.kv_cache_memory_bytes,
            "num_gpu_blocks_override": setup.num_gpu_blocks_override, "enforce_eager": setup.enforce_eager,
            "enable_prefix_caching": setup.enable_prefix_caching,
            "async_scheduling": setup.async_scheduling,
            "mamba_cache_dtype": setup.mamba_cache_dtype, "mamba_ssm_cache_dtype": setup.mamba_ssm_cache_dtype,
            "cpu_offload_gb": setup.cpu_offload_gb,
            **({"max_loras": setup.max_loras, "max_lora_rank": setup.max_lora_rank,
                "fully_sharded_loras": setup.fully_sharded_loras} if setup.max_loras else {}),
            "vllm_version": ".".join(str(x) for x in setup.vllm_version),
            **({"speculative": {"method": setup.speculative.method,
                                "num_speculative_tokens": setup.speculative.num_speculative_tokens,
                                "model": setup.speculative.model,
                                "draft_layers": drafter.draft_layers(setup),
                                "draft_kv_bytes_per_token": drafter.kv_token_bytes(setup),
                                "draft_weights_gib": round(drafter.weight_bytes(setup) / 2**30, 3)}}
               if setup.speculative is not None else {}),
            **({"limit_mm_per_prompt": dict(setup.mm_limits) or None, "skip_mm_profiling": setup.skip_mm_profiling,
                "mm_max_pixels": setup.mm_max_pixels} if setup.model.vision else {}),
        },
        "kv_cache": {
            "bytes_per_token": cap.bytes_per_token, "tokens": cap.tokens,
            "gpu_blocks": cap.gpu_blocks, "max_concurrency": round(cap.max_concurrency, 2),
            "block_size": cap.block_size, "num_groups": cap.num_groups,
            "blocks_per_request": cap.blocks_per_request,
            "fits": cap.fits,
        },
        "memory": {
            "weights_gib": round(m.weights_gib, 3), "activation_gib": round(m.activation_gib, 3),
            "non_torch_gib": round(m.non_torch_gib, 3), "cudagraph_gib": round(m.cudagraph_gib, 3),
            "kv_cache_gib": round(m.kv_cache_gib, 3), "requested_gib": round(m.requested_gib, 3),
            **({"lora_gib": round(max(lora_bytes(setup, st) for st in range(setup.pp)) / 2**30, 3)}
               if setup.max_loras else {}),
            **({"cpu_offload_gib": round(sum(offloaded_bytes(setup, st)[0] for st in range(setup.pp)) / 2**30, 3),
                "host_read_gbs": round(setup.gpu.host_read_bytes_per_s / 1e9, 1)}
               if setup.cpu_offload_gb else {}),
            **({"encoder_profile": {"modality": enc.modality, "items": enc.items, "item_tokens": enc.item_tokens,
                                    "vit_patches": enc.patches, "forward_gib": round(enc.forward_bytes / 2**30, 3),
                                    "kept_outputs_gib": round(enc.kept_bytes / 2**30, 3)}}
               if (enc := encoder_profile(setup)) else {}),
        },
    }


def performance_sections(setup: Setup, args: argparse.Namespace, inp: Inputs) -> dict[str, Any]:
    """`traffic`, `predicted`, `recommendation`, `speculative_decoding`, `tiers`, `notes`; with
    `--calibrate`, fitted on the measured rows first (and a `calibration` section)."""
    fit, notes = None, []
    if args.calibrate:
        fit, notes = fit_calibration(setup, calibration_rows(args), quantization=args.quantization,
                                     vllm_version=args.vllm_version, report=True)
    args._calibration = fit.calibration if fit is not None and fit.rows_used and not fit.rejected else None
    doc = performance_report(
        setup, prompt_tokens=inp.prompt_tokens, output_tokens=inp.output_tokens,
        prompt_tokens_p99=inp.prompt_tokens_p99, output_tokens_p99=inp.output_tokens_p99,
        concurrency=args.concurrency, rate=args.rate, prefix_hit_ratio=inp.prefix_hit_ratio,
        ttft_slo=inp.ttft_slo, tpot_slo=inp.tpot_slo, spec_tokens=args.spec_tokens,
        spec_acceptance=args.spec_acceptance,
        calibration=args._calibration)
    if fit is not None:
        doc["calibration"] = fit.as_dict()
        doc["notes"] = notes + doc.get("notes", [])
    return doc


def profile_section(inp: Inputs) -> dict[str, Any] | None:
    if inp.profile is None:
        return None
    d = inp.profile.as_dict()
    d["overridden_by_flags"] = inp.overridden
    return d


def _tuned(setup: Setup, rec: dict[str, Any]) -> Setup:
    return setup.with_(max_num_seqs=rec["max_num_seqs"], gpu_memory_utilization=rec["gpu_memory_utilization"],
                       max_model_len=rec["max_model_len"], max_num_batched_tokens=rec["max_num_batched_tokens"])


def sweep_section(setup: Setup, args: argparse.Namespace, inp: Inputs, doc: dict[str, Any], param: str) -> dict[str, Any]:
    rec = doc["recommendation"]
    traffic = make_traffic(prompt_tokens=inp.prompt_tokens, output_tokens=inp.output_tokens,
                           prompt_tokens_p99=inp.prompt_tokens_p99, output_tokens_p99=inp.output_tokens_p99,
                           prefix_hit_ratio=inp.prefix_hit_ratio)
    return tradeoff.sweep(_tuned(setup, rec), traffic, SLO(inp.ttft_slo, inp.tpot_slo), param,
                          recommended=rec.get(param), objective=inp.objective,
                          concurrency=args.concurrency, rate=args.rate,
                          calibration=getattr(args, "_calibration", None))


def curve_section(setup: Setup, inp: Inputs, doc: dict[str, Any],
                  calibration: Any = None) -> list[dict[str, Any]]:
    rec = doc["recommendation"]
    traffic = make_traffic(prompt_tokens=inp.prompt_tokens, output_tokens=inp.output_tokens,
                           prompt_tokens_p99=inp.prompt_tokens_p99, output_tokens_p99=inp.output_tokens_p99,
                           prefix_hit_ratio=inp.prefix_hit_ratio)
    return tradeoff.concurrency_curve(_tuned(setup, rec), traffic, SLO(inp.ttft_slo, inp.tpot_slo),
                                      mark=rec["max_num_seqs"], calibration=calibration)


def _refusal(setup: Setup, cap: KVCapacity, largest: int) -> str:
    """vLLM's own refusal when one max_model_len request does not fit the pool, with the
    largest length that would (`check_enough_kv_cache_memory` in v1/core/kv_cache_utils.py:
    "... is larger than the maximum number of tokens that can be stored in KV cache ...
    the estimated maximum model length is N")."""
    if cap.fit_blocks != cap.gpu_blocks or cap.memory.kv_cache_gib <= 0:
        # a release that checks a stage for the whole model, or no pool at all: kv_capacity's words
        try:
            kv_capacity(setup)
        except InputError as exc:
            return str(exc)
    return (f"max_model_len {setup.max_model_len} does not fit: one request needs "
            f"{cap.blocks_per_request} KV blocks but the pool has {cap.gpu_blocks} "
            f"({cap.tokens} tokens, {cap.memory.kv_cache_gib:.2f} GiB per GPU); the estimated "
            f"maximum model length is {largest} (lower --max-model-len, raise "
            f"--gpu-memory-utilization or use more GPUs)")


def run(args: argparse.Namespace) -> int:
    from exporter.reports import terminal as out

    if args.list_profiles:
        out.print_profiles(json_out=args.json)
        return 0
    missing = [f for f in ("model", "gpu") if not getattr(args, f) and not (f == "gpu" and args.gpu_memory_gib)]
    if missing:
        raise InputError("missing " + " and ".join(f"--{m}" for m in missing)
                         + " (see `vllm-drift catalog models|gpus`)")
    inp = resolve_inputs(args)
    if args.html is not None:
        from exporter.reports.html import require_plotly
        require_plotly()   # fail before the work, with the one-line hint
        if not args.html.parent.is_dir():
            raise InputError(f"--html {args.html}: directory {args.html.parent} does not exist")
    setup, cap, notes = fit_setup(args)
    doc: dict[str, Any] = {"model": resolve(args).as_dict(), "profile": profile_section(inp),
                           "objective": inp.objective}
    doc.update(kv_sections(setup, cap))
    model, gpu, *rest = doc["setup"].items()   # the Setup table lists what follows model and gpu
    doc["setup"] = dict([model, gpu, ("model_config", resolve(args).describe()), *rest])
    if not doc["kv_cache"]["fits"]:
        # refused as vLLM refuses (exit 2), but --json still prints what the pool holds
        largest = largest_max_model_len(setup, cap.fit_blocks)
        message = _refusal(setup, cap, largest)
        doc["kv_cache"]["estimated_max_model_len"] = largest
        doc["error"] = message
        if args.json:
            json.dump(doc, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        raise InputError(message)
    doc.update(performance_sections(setup, args, inp))
    doc["notes"] = notes + doc.get("notes", [])
    if inp.lengths_from:
        doc["traffic"]["lengths_from"] = inp.lengths_from
    if args.sweep:
        doc["sweep"] = sweep_section(setup, args, inp, doc, args.sweep)
    for note in doc["notes"]:
        print(f"vllm-drift calc: note: {note}", file=sys.stderr)
    if args.html is not None:
        from exporter.reports.calc import render_calc_report
        sweep = doc.get("sweep") or sweep_section(setup, args, inp, doc, "max_num_seqs")
        html = render_calc_report(doc, curve=curve_section(setup, inp, doc, getattr(args, "_calibration", None)),
                                  sweep=sweep)
        try:
            args.html.write_text(html, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--html {args.html}: cannot write ({exc.strerror})") from None
        print(f"vllm-drift calc: wrote {args.html}", file=sys.stderr)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        out.print_calc(doc)
    return 0
