"""`vllm-drift serve`: the exporter daemon."""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import os
import sys

import structlog

from exporter import logs
from exporter.config import DEFAULT_LISTEN, build_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the exporter and drift-detection daemon",
                       description="Scrape vLLM servers, compare them with the predicted optimum and "
                                   "export the findings for Prometheus. With no config and no --target "
                                   "it runs as a sidecar for http://127.0.0.1:8000.")
    p.add_argument("--config", metavar="PATH", help="YAML config file (reloaded on change or SIGHUP)")
    p.add_argument("--listen", metavar="HOST:PORT", help=f"address to serve on (default {DEFAULT_LISTEN})")
    p.add_argument("--target", metavar="URL", action="append", default=[],
                   help="base URL of a vLLM server (repeatable)")
    p.add_argument("--log-format", choices=logs.FORMATS, default="json")
    p.add_argument("--log-level", choices=logs.LEVELS, default="info")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (tests, demos)")
    p.set_defaults(func=run)


# glibc's mallopt(M_MMAP_THRESHOLD, bytes)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024


def large_buffers_from_mmap() -> bool:
    """Serve allocations of 32 KiB and more (scraped bodies, ~50 KB each, many per second) from
    mmap, returned to the system when freed, instead of glibc's heap: there the long-lived
    window arrays and reports allocated between them pin the freed space, and the heap only
    grows (RSS -16 % at 2,000 targets, docs/scaling.md). An operator's own
    `MALLOC_MMAP_THRESHOLD_` wins; not glibc (musl, macOS): nothing to do. True when set."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft limit on open files to the hard one, as Go programs (Prometheus, the
    exporters) do at start: the daemon holds one kept-alive socket per target, and a default
    soft limit of 1,024 would stop it near 1,000 targets - including its own listener, which
    then cannot accept a scrape. Returns (soft, hard) afterwards; None where there are no
    such limits."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft, hard


# Seconds a thread holding the GIL runs before yielding it to one that waits (CPython's default
# is 5 ms). The HTTP threads answering /metrics need the GIL a few dozen times per request
# (request line, headers, the response's writes); behind an event loop busy evaluating a large
# fleet each of those waits up to the interval, which made a /metrics answer take 0.3-0.5 s at
# 10,000 targets. A shorter interval only costs anything while a second thread wants the GIL.
GIL_SWITCH_INTERVAL = 0.0005


def run(args: argparse.Namespace) -> int:
    from exporter.daemon import Daemon

    cfg = build_config(args.config, targets=args.target, listen=args.listen)
    logs.configure(args.log_format, args.log_level)
    large_buffers_from_mmap()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    limits = raise_open_files_limit()
    if limits is not None and limits[0] < len(cfg.targets) + 256:
        structlog.get_logger("vllm_drift").warning("open-file limit below one socket per target", limit=limits[0],
                           static_targets=len(cfg.targets),
                           hint="raise it (ulimit -n, LimitNOFILE=, the container runtime's nofile) "
                                "or shard the fleet (docs/scaling.md)")
    daemon = Daemon(cfg, config_path=args.config, cli_targets=args.target, cli_listen=args.listen)
    try:
        asyncio.run(daemon.run(duration=args.duration))
    except OSError as exc:   # e.g. the listen address is taken
        import errno

        if exc.errno == errno.EADDRINUSE:
            print(f"vllm-drift serve: error: cannot listen on {cfg.listen}: the address is already in use "
                  f"(another vllm-drift? choose one with --listen HOST:PORT)", file=sys.stderr)
        else:
            print(f"vllm-drift serve: error: {exc}", file=sys.stderr)
        return 1
    return 0
