"""`vllm-drift serve`: the exporter daemon."""
from __future__ import annotations

import argparse
import asyncio

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


def run(args: argparse.Namespace) -> int:
    from exporter.daemon import Daemon

    cfg = build_config(args.config, targets=args.target, listen=args.listen)
    logs.configure(args.log_format, args.log_level)
    daemon = Daemon(cfg, config_path=args.config, cli_targets=args.target, cli_listen=args.listen)
    try:
        asyncio.run(daemon.run(duration=args.duration))
    except OSError as exc:   # e.g. the listen address is taken
        import errno
        import sys

        if exc.errno == errno.EADDRINUSE:
            print(f"vllm-drift serve: error: cannot listen on {cfg.listen}: the address is already in use "
                  f"(another vllm-drift? choose one with --listen HOST:PORT)", file=sys.stderr)
        else:
            print(f"vllm-drift serve: error: {exc}", file=sys.stderr)
        return 1
    return 0
