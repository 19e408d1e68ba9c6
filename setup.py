"""Build hooks only; the project is described in pyproject.toml.

Stamps the source revision into the package as `exporter/REVISION`, in the sdist and in the wheel,
for `vllm_drift_build_info{revision}` (exporter/buildinfo.py reads it). The revision comes from
`VLLM_DRIFT_REVISION` if set (a container build without .git), else `git rev-parse HEAD` in this
checkout, else the REVISION file an sdist already carries (`python -m build` builds the wheel from
the unpacked sdist). With none of them the file is not written and the revision reads "unknown".
"""
import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def _revision():
    env = os.environ.get("VLLM_DRIFT_REVISION", "").strip()
    if env:
        return env
    if (HERE / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    stamped = HERE / "exporter" / "REVISION"
    if stamped.is_file():
        return stamped.read_text(encoding="utf-8").strip() or None
    return None


def _stamp(package_dir):
    rev = _revision()
    if rev:
        Path(package_dir, "exporter").mkdir(parents=True, exist_ok=True)
        Path(package_dir, "exporter", "REVISION").write_text(rev + "\n", encoding="utf-8")


class BuildPy(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):   # an editable install reads git at run time
            _stamp(self.build_lib)


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _stamp(base_dir)


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
