"""`vllm:cache_config_info`'s labels, read once into a typed value.

vLLM exports the cache config as label strings ("0.9", "True", "None", "auto"); every reader of
the config (the `observed` object, the drift input, the calculator's view) takes these fields,
so one label means one thing everywhere. A label that is absent, "None" or unreadable is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

from exporter.parse.numbers import finite_float


@dataclass(frozen=True, slots=True)
class CacheConfig:
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None      # 0.24+: hybrid-aware pool size
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    cache_dtype: str | None = None
    max_model_len: int | None = None
    kv_cache_memory_bytes: float | None = None   # 0.10.2-0.11.0
    num_gpu_blocks_override: int | None = None   # --num-gpu-blocks-override: the pool as given
    kv_cache_max_concurrency: float | None = None
    sliding_window: int | None = None
    mamba_cache_dtype: str | None = None          # 0.10.1+: hybrids' state dtypes, as resolved
    mamba_ssm_cache_dtype: str | None = None


def read_cache_config(labels: Mapping[str, str]) -> CacheConfig:
    return _read(tuple(labels.items()))


@lru_cache(maxsize=4096)   # a target repeats the same labels every scrape
def _read(items: tuple[tuple[str, str], ...]) -> CacheConfig:
    cfg = dict(items)
    return CacheConfig(
        num_gpu_blocks=_int(cfg.get("num_gpu_blocks")), block_size=_int(cfg.get("block_size")),
        kv_cache_size_tokens=_int(cfg.get("kv_cache_size_tokens")),
        gpu_memory_utilization=finite_float(cfg.get("gpu_memory_utilization")),
        enable_prefix_caching=label_bool(cfg.get("enable_prefix_caching")), cache_dtype=_str(cfg.get("cache_dtype")),
        max_model_len=_int(cfg.get("max_model_len")), kv_cache_memory_bytes=finite_float(cfg.get("kv_cache_memory_bytes")),
        kv_cache_max_concurrency=finite_float(cfg.get("kv_cache_max_concurrency")),
        sliding_window=_int(cfg.get("sliding_window")),
        mamba_cache_dtype=_str(cfg.get("mamba_cache_dtype")),
        mamba_ssm_cache_dtype=_str(cfg.get("mamba_ssm_cache_dtype")),
        num_gpu_blocks_override=_int(cfg.get("num_gpu_blocks_override")))


def _int(v: str | None) -> int | None:
    x = finite_float(v)
    return None if x is None else int(x)


def label_bool(v: object) -> bool | None:
    """A boolean as a label (or a config value) carries it; None when absent or unknown."""
    if v is None:
        return None
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    return None        # "None" (some 0.8-0.10 servers): unknown


def _str(v: str | None) -> str | None:
    return None if v in (None, "", "None") else str(v)
