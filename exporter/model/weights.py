"""Exact weight bytes from safetensors metadata (local shard headers or the Hub's).

Why: a checkpoint's parameter count derived from config.json misses what quantization adds
(scales, zero points, group indices, block-wise FP8 scales, layers kept in 16 bits) and what
multimodal towers hold; the safetensors headers list every tensor with its dtype and shape, so
the bytes vLLM loads are known exactly without reading a weight. A header is 8 bytes of
little-endian length plus that much JSON (https://huggingface.co/docs/safetensors/index#format),
so reading it costs one small read per shard, locally or as an HTTP range request on the Hub
(`huggingface_hub.HfApi.get_safetensors_metadata`).

How the tensors are split:
- embedding / LM-head tensors are left out (the KV model sizes them from vocab x hidden with
  vLLM's vocab padding and TP split, tied or not);
- vision / audio towers and projectors are counted apart as parameters (vLLM loads them in the
  model dtype);
- MTP / next-token-prediction layers past `num_hidden_layers` are left out (vLLM's main model
  skips them);
- the rest of the language model: integer / FP8 / FP4 tensors and quantization scales keep their
  stored bytes; other floating-point tensors are counted as parameters loaded in the model dtype.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, Iterable, Mapping

# bytes per element of each safetensors dtype (F4/E2M1 packs two per byte)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4,
               "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "F4": 0.5, "F6_E2M3": 0.75,
               "F6_E3M2": 0.75}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
MAX_HEADER_BYTES = 100 * 2**20   # safetensors' own limit on a header

_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|lm_head|wte|word_embeddings|embed_out|tok_embeddings)(\.|$)"
                        r"|^output\.weight$")
_TOWER = re.compile(r"(^|\.)(vision_tower|vision_model|visual|vision_encoder|multi_modal_projector|mm_projector"
                    r"|audio_tower|audio_model|vision_embed_tokens|image_newline|patch_merger|merger"
                    r"|vision|img_processor|perceiver|resampler)(\.|$)")
_SCALE = re.compile(r"(scale|scales|scale_inv|zeros|qzeros|g_idx|absmax|quant_map|quant_state|zero_point"
                    r"|weight_shape|SCB)(\.|_|$)")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class WeightInfo:
    """What the language model's safetensors tensors hold, split as the KV model needs it."""

    fixed_bytes: int        # stored-as-is bytes: integer/FP8/FP4 tensors and quantization scales
    float_params: int       # floating-point LM parameters, loaded in the model dtype
    tower_params: int       # vision/audio tower + projector parameters (model dtype)
    embedding_params: int   # embedding / LM head parameters (reported, not used for bytes)
    skipped_params: int     # layers past num_hidden_layers (MTP heads) left out
    total_bytes: int        # every tensor's stored bytes, as the checkpoint holds them
    files: int
    where: str

    def lm_bytes(self, native_bytes: int) -> int:
        """Bytes of the language model's layers (no embeddings) loaded with `native_bytes`."""
        return int(self.fixed_bytes + self.float_params * native_bytes)


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file."""
    p = Path(path)
    with p.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{p}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES:
            raise ValueError(f"{p}: safetensors header of {n} bytes exceeds {MAX_HEADER_BYTES}")
        body = f.read(n)
    if len(body) != n:
        raise ValueError(f"{p}: truncated safetensors header")
    try:
        header = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{p}: safetensors header is not a JSON object")
    return header


def summarize(tensors: Iterable[tuple[str, str, int]], *, num_layers: int | None, files: int,
              where: str) -> WeightInfo:
    """Split (name, dtype, element count) triples as described in the module docstring."""
    fixed = floats = tower = emb = skipped = total = 0
    for name, dtype, count in tensors:
        size = DTYPE_BYTES.get(dtype.upper())
        if size is None:
            raise ValueError(f"{where}: tensor {name} has unknown dtype {dtype!r}")
        total += int(count * size)
        if _TOWER.search(name):
            tower += count
            continue
        m = _LAYER.search(name)
        if num_layers is not None and m and int(m.group(1)) >= num_layers:
            skipped += count
            continue
        if _EMBEDDING.search(name) and not _SCALE.search(name):
            emb += count
            continue
        if dtype.upper() in FLOAT_DTYPES and not _SCALE.search(name.rsplit(".", 1)[-1]):
            floats += count
        else:
            fixed += int(count * size)
    return WeightInfo(fixed, floats, tower, emb, skipped, total, files, where)


def _header_tensors(header: Mapping[str, Any]) -> Iterable[tuple[str, str, int]]:
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, Mapping):
            continue
        yield name, str(info.get("dtype", "")), int(prod(info.get("shape") or [1]))


def from_local_dir(directory: str | Path, *, num_layers: int | None = None) -> WeightInfo | None:
    """Read the headers of a model directory's safetensors files (an HF snapshot dir or a model
    volume). None when the directory has no safetensors weights or a listed shard is absent."""
    d = Path(directory)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        shards = sorted(set((data.get("weight_map") or {}).values()))
    elif (d / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        return None
    if not shards or not all((d / s).is_file() for s in shards):
        return None
    triples: list[tuple[str, str, int]] = []
    for s in shards:
        triples.extend(_header_tensors(read_header(d / s)))
    return summarize(triples, num_layers=num_layers, files=len(shards), where=str(d))


def from_hub_metadata(files: list[Any], *, num_layers: int | None, where: str) -> WeightInfo:
    """From `huggingface_hub`'s SafetensorsFileMetadata of each shard (range-read headers)."""
    triples = [(name, str(t.dtype), int(prod(t.shape or [1])))
               for fm in files for name, t in fm.tensors.items()]
    return summarize(triples, num_layers=num_layers, files=len(files), where=where)
