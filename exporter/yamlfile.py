"""YAML documents read with libyaml's C parser when PyYAML was built with it (its wheels are).

The built-in catalogs (`model/data/models.yaml`, ~130 KB, and `gpus.yaml`, ~70 KB) are read at the
start of every `calc`, `scan` and `serve`; the pure-Python parser takes about 0.6 s over them and
the C one under 0.1 s, for the same documents (safe tags only). Errors are `yaml.YAMLError` either
way, with `problem_mark` line and column, which is what the callers' messages name.
"""
from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, with the C parser when there is one."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader, C or Python
