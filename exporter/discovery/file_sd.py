"""Prometheus `file_sd` files (JSON or YAML) as a target source.

Format (as Prometheus reads it): a list of `{"targets": ["host:port", ...], "labels": {...}}`.
Labels are kept as hints: `gpu`, `tp`, `pp`, `model`, `quantization`, `max_num_seqs` fill the
matching target fields; `__scheme__` and `__metrics_path__` are honoured like Prometheus does; the
rest ride along in `labels`. Files are re-read when their mtime or size changes; a file that fails
to read or validate keeps its last good targets and is reported.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from exporter import yamlfile
from exporter.config import TargetSpec
from exporter.discovery.vllm_args import token_count
from exporter.errors import ConfigError

_HINTS = {"gpu": str, "tp": int, "pp": int, "dp": int, "model": str, "quantization": str,
          "max_num_seqs": int, "max_num_batched_tokens": token_count, "name": str}
_EXPECTED = {int: "an integer", str: "a string", token_count: "a token count (8192, 16k, 16K)"}


def parse_file_sd(path: str, text: str) -> list[TargetSpec]:
    """Targets of one file_sd document; `ConfigError` names the file and the entry."""
    try:
        data: Any = json.loads(text) if path.endswith(".json") else yamlfile.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: {str(exc).splitlines()[0]}") from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a list of target groups, got {type(data).__name__}")
    out: list[TargetSpec] = []
    for gi, group in enumerate(data):
        where = f"{path}: [{gi}]"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ConfigError(f"{where}: a target group needs a 'targets' list")
        unknown = set(group) - {"targets", "labels"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ConfigError(f"{where}.labels: expected a mapping of label names to strings")
        labels = {str(k): str(v) for k, v in labels.items()}
        scheme = labels.pop("__scheme__", "http")
        labels.pop("__metrics_path__", None)
        hints: dict[str, Any] = {}
        for key, conv in _HINTS.items():
            if key in labels:
                try:
                    hints[key] = conv(labels[key])
                except ValueError:
                    raise ConfigError(f"{where}.labels.{key}: expected {_EXPECTED[conv]}, got {labels[key]!r}") from None
        extra = {k: v for k, v in labels.items() if k not in _HINTS and not k.startswith("__")}
        for ti, target in enumerate(group["targets"]):
            url = str(target)
            if "://" not in url:
                url = f"{scheme}://{url}"
            try:
                out.append(TargetSpec(url=url, labels=extra, source=f"file_sd:{path}", **hints))
            except ValidationError as exc:
                err = exc.errors()[0]
                msg = err["msg"].removeprefix("Value error, ")
                key = str(err["loc"][0]) if err["loc"] else ""
                at = f"labels.{key}" if key in hints else f"targets[{ti}]"
                raise ConfigError(f"{where}.{at}: {msg}") from None
    return out


class FileSDSource:
    name = "file_sd"

    def __init__(self, patterns: list[str], *, refresh: float = 30.0,
                 on_error: Callable[[str, str], None] | None = None) -> None:
        self.patterns = list(patterns)
        self.on_error = on_error
        self._files: dict[str, tuple[tuple[float, int], list[TargetSpec]]] = {}
        self._errors: dict[str, str] = {}

    def _paths(self) -> list[str]:
        paths: set[str] = set()
        for pattern in self.patterns:
            paths.update(p for p in glob.glob(pattern) if os.path.isfile(p))
        return sorted(paths)

    def targets(self) -> list[TargetSpec]:
        paths = self._paths()
        for gone in set(self._files) - set(paths):
            del self._files[gone]
        out: list[TargetSpec] = []
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamp = (st.st_mtime, st.st_size)
            cached = self._files.get(path)
            if cached is None or cached[0] != stamp:
                try:
                    with open(path, encoding="utf-8") as fh:
                        specs = parse_file_sd(path, fh.read())
                    self._errors.pop(path, None)
                    self._files[path] = (stamp, specs)
                except (ConfigError, OSError, UnicodeDecodeError) as exc:
                    msg = str(exc) if isinstance(exc, ConfigError) else f"{path}: cannot read: {exc}"
                    if self._errors.get(path) != msg and self.on_error:
                        self.on_error("file_sd", msg)
                    self._errors[path] = msg
                    if cached is not None:   # keep the last good targets, remember the bad stamp
                        self._files[path] = (stamp, cached[1])
            if path in self._files:
                out.extend(self._files[path][1])
        return out

    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def close(self) -> None:
        pass
