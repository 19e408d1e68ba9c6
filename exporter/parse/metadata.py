"""What a vLLM server's `/version` and `/v1/models` answers say, read from their JSON bodies.

Both are optional: a body that is missing, not JSON, or shaped otherwise leaves its fields unknown.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Metadata:
    """What `/version` and `/v1/models` tell; either may be unknown."""

    vllm_version: str | None = None
    served_models: tuple[str, ...] = ()
    max_model_len: dict[str, int] | None = None   # served name -> max_model_len
    root: dict[str, str] | None = None            # served name -> model path/id (`root`)
    fetched_at: float = 0.0


def read_metadata(version_body: bytes | None, models_body: bytes | None, fetched_at: float) -> Metadata:
    version = None
    served: tuple[str, ...] = ()
    lengths: dict[str, int] = {}
    roots: dict[str, str] = {}
    if version_body is not None:
        doc = _json(version_body)
        if isinstance(doc, dict) and isinstance(doc.get("version"), str):
            version = doc["version"]
    if models_body is not None:
        doc = _json(models_body)
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, list):
            names = []
            for entry in data:
                if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                    continue
                if entry.get("parent"):   # LoRA adapters name their base model as parent
                    continue
                names.append(entry["id"])
                if isinstance(entry.get("max_model_len"), int):
                    lengths[entry["id"]] = entry["max_model_len"]
                if isinstance(entry.get("root"), str):
                    roots[entry["id"]] = entry["root"]
            served = tuple(names)
    return Metadata(version, served, lengths or None, roots or None, fetched_at)


def _json(body: bytes) -> Any:
    """The decoded document, or None. A hostile target can nest arrays deeply enough to exhaust
    the decoder's recursion limit (RecursionError) inside the size cap: that is bad input too."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
