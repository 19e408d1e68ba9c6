"""`vllm_drift_build_info{version,revision,python_version}` and `vllm-drift --version` name the
running build: the package version, the source revision (git here: an editable checkout) and the
interpreter."""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from exporter import __version__, buildinfo
from exporter.export.collector import Exposition


def head() -> str:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def test_build_info_labels():
    text = Exposition().render().decode()
    (line,) = [l for l in text.splitlines() if l.startswith("vllm_drift_build_info{")]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels == {"version": __version__, "revision": buildinfo.revision(),
                      "python_version": platform.python_version()}
    assert line.endswith(" 1.0")
    if not (REPO / "exporter" / "REVISION").exists():    # an editable checkout reads git
        assert labels["revision"] == head()


def test_version_flag(cli_env):
    r = subprocess.run([sys.executable, "-m", "exporter", "--version"], capture_output=True, text=True,
                       timeout=60, env=cli_env)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.strip() == (f"vllm-drift {__version__} (revision {buildinfo.revision()}, "
                                f"Python {platform.python_version()})")
