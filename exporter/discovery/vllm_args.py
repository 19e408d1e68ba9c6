"""What a vLLM server's command line says about its setup (tensor parallelism, max_num_seqs, model).

Why: `/metrics` does not tell TP, PP or the model id behind a served name, but a pod spec does:
the container's `command` + `args` are the `vllm serve` argv. Discovery reads them as hints, so
the calculator works from the configured setup instead of guessing. Pure (no I/O).

Accepted forms, as vLLM's argument parser accepts them: `--flag value`, `--flag=value`,
underscores for dashes (`--max_num_seqs`), short aliases (`-tp`, `-pp`, `-dp`, `-q`), the model
as `--model X` or as the positional of `vllm serve X`, and a shell wrapper
(`sh -c "vllm serve X --tp 2"`), whose script is split with shell rules.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from typing import Any, Callable, Sequence

from exporter.parse.cache_config import label_bool

# vLLM's human-readable token counts (`--max-num-batched-tokens 16k`, `--max-model-len 32K`):
# a lower-case suffix multiplies by a power of 1000 and takes decimals (25.6k = 25,600), an
# upper-case one by a power of 1024 and takes whole numbers only (vllm/utils/argparse_utils.py
# `human_readable_int`)
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
AUTO = -1   # `--max-model-len auto` (or -1): the largest length the KV cache holds


def token_count(text: str) -> int:
    """A token count as vLLM's flags read it: `8192`, `16k` (16,000), `32K` (32,768), `1.5m`.
    ValueError names what is wrong (a decimal before a binary suffix: vLLM refuses `1.5K`)."""
    value = str(text).strip()
    m = _HUMAN.fullmatch(value)
    if m is None:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a token count (8192, 16k = 16,000, 16K = 16,384)") from None
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ValueError(f"decimals are not allowed with the binary suffix {suffix} "
                         f"(did you mean {number}{suffix.lower()}?)")
    return int(number) * _BINARY[suffix]


def max_model_len(text: str) -> int:
    """`--max-model-len` as vLLM reads it: a token count, or `auto` / `-1` (AUTO): the largest
    length the KV cache holds, at most the model's own (vLLM's auto-fit, late 2025 releases)."""
    value = str(text).strip()
    if value == "-1" or value.lower() == "auto":
        return AUTO
    return token_count(value)


def mm_limits(text: str) -> dict[str, int]:
    """`--limit-mm-per-prompt` as vLLM reads it: a JSON object (`{"image": 2, "video": 0}`; a
    modality's value may be an object with a `count`, the dummy-size options of 0.13+) or the
    older `image=2,video=0`. ValueError names what is wrong."""
    value = str(text).strip()
    if value.startswith("{"):
        try:
            given = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{value!r} is not a JSON object: {exc.msg}") from None
        if not isinstance(given, dict):
            raise ValueError(f"{value!r} is not a JSON object of modality counts")
        items = [(k, v.get("count", 999) if isinstance(v, dict) else v) for k, v in given.items()]
    else:
        items = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            modality, eq, count = part.partition("=")
            if not eq:
                raise ValueError(f"{part!r} is not modality=count (e.g. image=2,video=0)")
            items.append((modality.strip(), count.strip()))
    out: dict[str, int] = {}
    for modality, count in items:
        try:
            out[str(modality)] = int(count)
        except (TypeError, ValueError):
            raise ValueError(f"{modality}: {count!r} is not a count") from None
    return out


def json_object(text: str) -> dict[str, Any]:
    """A flag value vLLM reads as a JSON object; ValueError naming the value otherwise."""
    try:
        given = json.loads(str(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{text!r} is not a JSON object: {exc.msg}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{text!r} is not a JSON object")
    return given


def mm_max_pixels(text: str) -> int | None:
    """The image processor's `max_pixels` in `--mm-processor-kwargs` (a JSON object; Qwen-VL
    resizes its images by it; also `size.longest_edge`, Qwen3-VL's name), None when it gives none."""
    given = json_object(text)
    value = given.get("max_pixels")
    if value is None and isinstance(given.get("size"), dict):
        value = given["size"].get("longest_edge")
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"max_pixels {value!r} is not a number of pixels") from None


def flag_type(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """`conv` as an argparse `type=`: a flag value read as vLLM reads it, its ValueError reported
    by argparse naming the flag (exit 2). Shared by the commands that take vLLM's flags."""
    def read(text: str) -> Any:
        try:
            return conv(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return read


def boolean(text: str) -> bool:
    """A boolean flag's value as vLLM's older parsers took it (`--enable-chunked-prefill=False`,
    `--enable-chunked-prefill False`: V0's StoreBoolean, nargs="?"), read as a label's boolean
    (`label_bool`); ValueError otherwise."""
    value = label_bool(text)
    if value is None:
        raise ValueError(f"{text!r} is not a boolean (true/false)")
    return value


class BooleanFlag(argparse.BooleanOptionalAction):
    """`--flag` / `--no-flag` (vLLM's BooleanOptionalAction flags), and the value forms its V0
    parser also took, `--flag=false` and `--flag False`, so a vLLM command line can be pasted
    as it was run."""

    def __init__(self, option_strings: Sequence[str], dest: str, default: Any = None, **kwargs: Any):
        super().__init__(option_strings, dest, default=default, **kwargs)
        self.nargs = "?"
        self.metavar = "BOOL"

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        negated = bool(option_string and option_string.startswith("--no-"))
        if values is None:
            setattr(namespace, self.dest, not negated)
            return
        if negated:
            parser.error(f"{option_string} takes no value (got {values!r})")
        try:
            setattr(namespace, self.dest, boolean(values))
        except ValueError as exc:
            parser.error(f"{option_string}: {exc}")


def gib(text: str) -> float:
    """A size in GiB as vLLM's float flags take it (`--cpu-offload-gb 8`, `4.5`); ValueError when
    it is not a number or is negative (vLLM's `ge=0`)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number of GiB") from None
    if value < 0 or value != value:
        raise ValueError(f"{text!r}: must be >= 0")
    return value


def speculative_label(text: str) -> str:
    """`--speculative-config` as a label value: its JSON object, compact with sorted keys (what
    `Setup.build(speculative_config=...)` reads back). ValueError when it is not a JSON object."""
    return json.dumps(json_object(text), sort_keys=True, separators=(",", ":"))


def mm_limits_label(text: str) -> str:
    """`--limit-mm-per-prompt` as a label value: `image=2,video=0`, what `mm_limits` reads back."""
    return ",".join(f"{m}={c}" for m, c in sorted(mm_limits(text).items()))


# flag (dashes, no leading --) -> hint key; value type
_VALUE_FLAGS: dict[str, tuple[str, Any]] = {
    "model": ("model", str),
    "tensor-parallel-size": ("tp", int),
    "pipeline-parallel-size": ("pp", int),
    "data-parallel-size": ("dp", int),
    "max-num-seqs": ("max_num_seqs", int),
    "max-num-batched-tokens": ("max_num_batched_tokens", token_count),
    "max-model-len": ("max_model_len", str),   # vLLM accepts `32k` too; kept as written
    "gpu-memory-utilization": ("gpu_memory_utilization", float),
    "quantization": ("quantization", str),
    "kv-cache-dtype": ("kv_cache_dtype", str),
    "dtype": ("dtype", str),
    "block-size": ("block_size", int),
    "port": ("port", int),
    "limit-mm-per-prompt": ("limit_mm_per_prompt", mm_limits_label),
    "mm-processor-kwargs": ("mm_max_pixels", mm_max_pixels),
    "speculative-config": ("speculative_config", speculative_label),
    "cpu-offload-gb": ("cpu_offload_gb", gib),
    "max-loras": ("max_loras", int),
    "max-lora-rank": ("max_lora_rank", int),
}
_SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
          "q": "quantization"}
_BOOL_FLAGS = {"enable-prefix-caching": ("enable_prefix_caching", True),
               "no-enable-prefix-caching": ("enable_prefix_caching", False),
               "enforce-eager": ("enforce_eager", True),
               "enable-expert-parallel": ("expert_parallel", True),
               "async-scheduling": ("async_scheduling", True),
               "no-async-scheduling": ("async_scheduling", False),
               "skip-mm-profiling": ("skip_mm_profiling", True),
               "enable-lora": ("enable_lora", True),
               "fully-sharded-loras": ("fully_sharded_loras", True)}
# Common flags that take a value but give no hint: their value must not be read as the model.
_OTHER_VALUE_FLAGS = frozenset((
    "host", "api-key", "download-dir", "chat-template", "tokenizer", "revision", "seed",
    "uvicorn-log-level", "load-format", "swap-space", "tool-call-parser", "config",
    "distributed-executor-backend", "lora-modules",
    "root-path", "tokenizer-mode", "hf-overrides",
    "compilation-config", "override-generation-config", "generation-config", "reasoning-parser",
))


def _expand_shell(argv: Sequence[str]) -> list[str]:
    """`sh -c "vllm serve ..."` -> the split script; anything else unchanged."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == "-c" and "vllm" in arg and " " in arg:
            try:
                # a script may chain commands; the vLLM part is what follows the last `&&`/`;`
                words = shlex.split(arg, comments=True)
            except ValueError:
                words = arg.split()
            start = 0
            for j, w in enumerate(words):
                if w in ("&&", ";", "||", "exec"):
                    start = j + 1
            out.extend(words[start:])
        else:
            out.append(arg)
    return out


def parse_vllm_args(argv: Sequence[str]) -> dict[str, object]:
    """Hints from a vLLM argv (command + args). Unknown flags are ignored; a value that does not
    convert is left out rather than guessed. `served_model_name` is the first name given."""
    words = _expand_shell(list(argv))
    hints: dict[str, object] = {}
    positional: list[str] = []
    saw_serve = False
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "serve" and not saw_serve:
            saw_serve = True
            positional.clear()
            continue
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, eq, inline = word.lstrip("-").partition("=")
        name = name.replace("_", "-")
        if word.startswith("-") and not word.startswith("--"):
            name = _SHORT.get(name, name)
        if name in _BOOL_FLAGS:
            key, value = _BOOL_FLAGS[name]
            if eq:
                # `--enable-prefix-caching=False`: the value decides (left out on a `--no-` flag,
                # which vLLM refuses with a value, or when it is not a boolean)
                if name.startswith("no-"):
                    continue
                try:
                    value = boolean(inline)
                except ValueError:
                    continue
            hints[key] = value
            continue
        if name == "served-model-name":
            if eq:
                hints["served_model_name"] = inline
            elif i < len(words) and not words[i].startswith("-"):
                hints["served_model_name"] = words[i]
                i += 1
                while i < len(words) and not words[i].startswith("-"):   # nargs="+"
                    i += 1
            continue
        spec = _VALUE_FLAGS.get(name)
        if spec is None:
            # Skip the value of a known value flag. An unknown flag is taken as boolean unless
            # the model is already known (`vllm serve MODEL --flag value`).
            takes_value = name in _OTHER_VALUE_FLAGS or bool(positional and saw_serve)
            if not eq and takes_value and i < len(words) and not words[i].startswith("-"):
                i += 1
            continue
        if eq:
            raw = inline
        elif i < len(words):
            raw = words[i]
            i += 1
        else:
            continue
        key, conv = spec
        try:
            value = conv(raw)
        except ValueError:
            continue
        if value is not None:   # a flag that says nothing here (mm-processor-kwargs without max_pixels)
            hints[key] = value
    if "model" not in hints and saw_serve and positional:
        hints["model"] = positional[0]
    return hints
