"""Which build is running: the version and the source revision, for `vllm_drift_build_info`,
`vllm-drift --version` and the status page.

The revision is resolved once, from the first of:
1. `exporter/REVISION`, written into the wheel and the sdist at build time by setup.py (from
   `git rev-parse HEAD`, or the `VLLM_DRIFT_REVISION` environment variable where the build has no
   git checkout, e.g. a container build: `--build-arg VLLM_DRIFT_REVISION=$(git rev-parse HEAD)`);
2. the commit pip recorded when installing from a VCS URL (PEP 610 `direct_url.json`);
3. `git rev-parse HEAD` when running from a source checkout (an editable install);
4. "unknown".
"""
from __future__ import annotations

import functools
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from exporter import __version__

DIST = "vllm-drift"
_PACKAGE = Path(__file__).resolve().parent


def version() -> str:
    return __version__


def python_version() -> str:
    return platform.python_version()


@functools.cache
def revision() -> str:
    return _from_file() or _from_direct_url() or _from_git() or "unknown"


def _from_file() -> str | None:
    try:
        rev = (_PACKAGE / "REVISION").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return rev or None


def _from_direct_url() -> str | None:
    try:
        text = metadata.distribution(DIST).read_text("direct_url.json")
        return (json.loads(text or "{}").get("vcs_info") or {}).get("commit_id")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return None


def _from_git() -> str | None:
    root = _PACKAGE.parent
    if not (root / ".git").exists():     # only our own checkout, never an unrelated parent repo
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None
