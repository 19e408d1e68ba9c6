"""One-line errors for the mistakes people make at the prompt: a server without its scheme, and a
listen address that is taken."""
from __future__ import annotations

import socket
import subprocess


def test_scan_of_host_port_says_the_scheme_is_missing(cli_env, tmp_path):
    r = subprocess.run(["vllm-drift", "scan", "10.0.0.5:8000"], capture_output=True, text=True,
                       env=cli_env, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == ("vllm-drift scan: error: 10.0.0.5:8000: no such file, and a server URL "
                                "needs its scheme: http://10.0.0.5:8000")
    # a missing file that does not look like host:port keeps the plain message
    r = subprocess.run(["vllm-drift", "scan", "before.prom"], capture_output=True, text=True,
                       env=cli_env, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "before.prom: cannot read" in r.stderr


def test_serve_on_a_busy_port_names_the_address(cli_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(["vllm-drift", "serve", "--listen", f"127.0.0.1:{port}", "--target",
                            "http://127.0.0.1:9"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"vllm-drift serve: error: cannot listen on 127.0.0.1:{port}: the address is already in use")
