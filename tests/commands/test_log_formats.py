"""`serve --log-format json|logfmt|console`: every stderr line in the chosen format, library
loggers included, and a bad choice is a usage error (exit 2)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import dead_url, free_port

LOGFMT_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)(?:\s+|$)')


def parse_logfmt(line: str) -> list[tuple[str, str]]:
    pairs, pos = [], 0
    while pos < len(line):
        m = LOGFMT_PAIR.match(line, pos)
        assert m, f"not logfmt at column {pos}: {line!r}"
        value = m.group(2)
        pairs.append((m.group(1), json.loads(value) if value.startswith('"') else value))
        pos = m.end()
    return pairs


def serve_stderr(fmt: str, cli_env) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{free_port()}",
                        "--target", dead_url(), "--duration", "3", "--log-format", fmt],
                       capture_output=True, text=True, timeout=60, env=cli_env)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stderr.splitlines() if line.strip()]


def test_serve_logs_logfmt(cli_env):
    lines = serve_stderr("logfmt", cli_env)
    records = [dict(parse_logfmt(line)) for line in lines]
    for line in lines:
        assert [k for k, _ in parse_logfmt(line)][:3] == ["timestamp", "level", "event"], line
    failed = next(r for r in records if r["event"] == "scrape failed")
    assert failed["level"] == "warning" and failed["reason"] == "connect" and "cannot connect" in failed["error"]
    assert records[-1]["event"] == "stopped"


def test_serve_logs_json(cli_env):
    records = [json.loads(line) for line in serve_stderr("json", cli_env)]
    assert any(r["event"] == "scrape failed" and r["level"] == "warning" for r in records)


def test_library_loggers_share_the_format(cli_env):
    """In a child process: logs.configure sets process-wide logging state."""
    code = ("import logging, structlog\nfrom exporter import logs\nlogs.configure('logfmt', 'info')\n"
            "logging.getLogger('httpx').warning('pool %s exhausted', 'main')\n"
            "structlog.get_logger('x').info('checked', ok=True, n=3)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=cli_env)
    err = r.stderr.splitlines()
    lib = dict(parse_logfmt(next(l for l in err if "exhausted" in l)))
    assert lib["event"] == "pool main exhausted" and lib["logger"] == "httpx" and lib["level"] == "warning"
    ours = dict(parse_logfmt(next(l for l in err if "checked" in l)))
    assert ours["ok"] == "true" and ours["n"] == "3"


def test_unknown_log_format_is_a_usage_error(cli_env):
    r = subprocess.run([sys.executable, "-m", "exporter", "serve", "--log-format", "xml"],
                       capture_output=True, text=True, timeout=60, env=cli_env)
    assert r.returncode == 2 and "--log-format" in r.stderr and "logfmt" in r.stderr


def test_logs_follow_a_replaced_stderr(cli_env):
    """A stream swapped after configure (as pytest's capture does between tests) gets the lines;
    the one logging was configured with may be closed by then and is not written to."""
    code = ("import io, logging, sys, structlog\nfrom exporter import logs\n"
            "first = io.StringIO(); sys.stderr = first\nlogs.configure('logfmt', 'info')\n"
            "second = io.StringIO(); sys.stderr = second; first.close()\n"
            "structlog.get_logger('x').info('after swap', n=1)\n"
            "logging.getLogger('httpx').warning('library after swap')\n"
            "sys.stderr = sys.__stderr__\nprint(second.getvalue(), end='')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=cli_env)
    assert r.returncode == 0, r.stderr
    events = [dict(parse_logfmt(line))["event"] for line in r.stdout.splitlines() if line.strip()]
    assert events == ["after swap", "library after swap"], r.stdout + r.stderr
