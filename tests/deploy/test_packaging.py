"""Packaging as a user meets it: `python -m build` makes an sdist and a wheel (the wheel from the
unpacked sdist), the wheel installs into a fresh venv without the Kubernetes client, carries every
file the package has in git, and the installed command works: `--version` with the source
revision, a `calc`, `serve` with build_info and the status page, the one-line error naming the
`[kubernetes]` extra, and all of it still working once pip/setuptools are removed (as in the
container's final stage)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, dead_url, free_port

pytestmark = pytest.mark.slow


def run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", 600)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)


def git_head() -> str | None:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return None
    r = run(["git", "-C", REPO, "rev-parse", "HEAD"], timeout=30)
    return r.stdout.strip() if r.returncode == 0 else None


def git_files(under: str) -> set[str]:
    r = run(["git", "-C", REPO, "ls-files", under], timeout=30)
    return {line for line in r.stdout.splitlines() if line}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # default mode: the sdist first, then the wheel built from the unpacked sdist
    r = run([sys.executable, "-m", "build", "--outdir", out, REPO])
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    run([sys.executable, "-m", "venv", env_dir], timeout=120).check_returncode()
    (wheel,) = dist.glob("vllm_drift-*.whl")
    r = run([env_dir / "bin" / "pip", "install", "-q", wheel])
    assert r.returncode == 0, r.stderr[-2000:]
    return env_dir


def test_sdist_and_wheel_carry_every_packaged_file_and_the_revision(dist):
    (sdist,) = dist.glob("vllm_drift-*.tar.gz")
    (wheel,) = dist.glob("vllm_drift-*.whl")
    with tarfile.open(sdist) as tf:
        sd_names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    with zipfile.ZipFile(wheel) as zf:
        wh_names = set(zf.namelist())
        revision = zf.read("exporter/REVISION").decode().strip()
    for required in ("pyproject.toml", "setup.py", "README.md", "exporter/REVISION"):
        assert required in sd_names, required
    tracked = git_files("exporter")
    if tracked:   # every tracked file of the package ends up in the wheel (data files included)
        missing = sorted(f for f in tracked if f not in wh_names)
        assert not missing, f"in git but not in the wheel: {missing[:10]}"
    head = git_head()
    assert re.fullmatch(r"[0-9a-f]{40}", revision) and (head is None or revision == head)


def test_core_install_leaves_out_the_kubernetes_client(venv):
    py = venv / "bin" / "python"
    assert run([venv / "bin" / "pip", "show", "kubernetes"]).returncode != 0
    r = run([py, "-c", "import importlib.util as u; print(u.find_spec('kubernetes') is None)"])
    assert r.stdout.strip() == "True"


def test_extra_brings_the_kubernetes_client(dist, venv):
    (wheel,) = dist.glob("vllm_drift-*.whl")
    report = run([venv / "bin" / "pip", "install", "--dry-run", "--quiet", "--report", "-", f"{wheel}[kubernetes]"])
    assert report.returncode == 0, report.stderr[-1000:]
    names = {i["metadata"]["name"].lower() for i in json.loads(report.stdout)["install"]}
    assert "kubernetes" in names


def test_installed_command_version_calc_and_missing_extra(venv, tmp_path):
    exe = venv / "bin" / "vllm-drift"
    v = run([exe, "--version"], cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("vllm-drift ") and "revision " in v.stdout, v
    head = git_head()
    if head:
        assert head in v.stdout
    calc = run([exe, "calc", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"], cwd=tmp_path)
    assert calc.returncode == 0, calc.stderr[-1000:]
    assert json.loads(calc.stdout)["kv_cache"]["tokens"] > 0
    cfg = tmp_path / "k8s.yaml"
    cfg.write_text("kubernetes:\n  namespace: llm\n")
    r = run([exe, "serve", "--config", cfg, "--duration", "5"], cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "k8s.yaml: kubernetes:" in r.stderr
    assert "pip install 'vllm-drift[kubernetes]'" in r.stderr


def test_installed_daemon_serves_build_info_and_the_status_page_without_build_tools(venv, tmp_path):
    """Last in the module: it removes pip, setuptools and wheel from the venv, as the container's
    final stage has none, and the daemon must not need them."""
    pip = venv / "bin" / "pip"
    assert run([pip, "uninstall", "--yes", "pip", "setuptools", "wheel"]).returncode == 0
    assert not (venv / "bin" / "pip").exists()
    port = free_port()
    dead = dead_url()
    proc = subprocess.Popen([str(venv / "bin" / "vllm-drift"), "serve", "--listen", f"127.0.0.1:{port}",
                             "--target", dead, "--duration", "60", "--log-format", "logfmt"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, text=True)
    page = metrics = ""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and dead not in page:
            time.sleep(0.5)
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert dead in page and "down" in page
    (line,) = [l for l in metrics.splitlines() if l.startswith("vllm_drift_build_info{")]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert set(labels) == {"version", "revision", "python_version"}
    head = git_head()
    assert labels["revision"] == (head or labels["revision"]) and labels["revision"] != "unknown"
    py = run([venv / "bin" / "python", "-c", "import platform; print(platform.python_version())"]).stdout.strip()
    assert labels["python_version"] == py
    # logfmt on stderr: key=value pairs, time, level and message first
    first = next(l for l in err.splitlines() if l.strip())
    assert re.match(r'timestamp=\S+ level=\w+ event=', first), first
