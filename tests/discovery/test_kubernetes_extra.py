"""The Kubernetes client is the optional `[kubernetes]` extra: without it a `kubernetes:` config is
bad input naming the extra (exit 2 at start, a failed reload that keeps the old config in the
daemon); with it the config loads. The fresh-venv half (the core install really lacks the client)
is in tests/deploy/test_packaging.py."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

HIDE = "import sys; sys.modules['kubernetes'] = None\n"   # `import kubernetes` now raises ImportError


def run_py(code: str, cli_env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=cli_env, cwd=cwd)


def test_without_the_client_serve_exits_2_naming_the_extra(tmp_path, cli_env):
    (tmp_path / "k.yaml").write_text("kubernetes:\n  namespace: llm\n")
    r = run_py("""
        from exporter.cli import main
        sys.exit(main(["serve", "--config", "k.yaml", "--duration", "1"]))
    """, cli_env, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert "k.yaml: kubernetes: " in r.stderr and "pip install 'vllm-drift[kubernetes]'" in r.stderr


def test_without_the_client_a_reload_to_kubernetes_fails_and_keeps_the_config(tmp_path, cli_env):
    (tmp_path / "c.yaml").write_text("targets:\n  - url: http://127.0.0.1:9\n")
    r = run_py("""
        from exporter.config import build_config
        from exporter.daemon import Daemon
        d = Daemon(build_config("c.yaml"), config_path="c.yaml")
        open("c.yaml", "w").write("kubernetes:\\n  namespace: llm\\n")
        print(d.reload())
        print(d.reload_failures, [t.url for t in d.cfg.targets])
    """, cli_env, tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.strip().splitlines()[-2:]
    assert "pip install 'vllm-drift[kubernetes]'" in first
    assert second == "1.0 ['http://127.0.0.1:9']"


def test_with_the_client_the_config_loads(tmp_path):
    pytest.importorskip("kubernetes", reason="the [kubernetes] extra is part of the test extra")
    from exporter.config import load_config

    (tmp_path / "k.yaml").write_text("kubernetes:\n  namespace: llm\n  label_selector: app=vllm\n")
    cfg = load_config(str(tmp_path / "k.yaml"))
    assert cfg.kubernetes.namespace == "llm"


def test_require_client_names_the_extra(cli_env, tmp_path):
    r = run_py("""
        from exporter.discovery.kubernetes import require_client
        try:
            require_client()
        except ValueError as e:
            print(e)
    """, cli_env, tmp_path)
    assert "pip install 'vllm-drift[kubernetes]'" in r.stdout, r.stderr
