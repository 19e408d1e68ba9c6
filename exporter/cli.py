"""The `vllm-drift` command line: one sub-command per module in `exporter.commands`.

Exit status: 0 success, 2 bad usage or bad input (one line on stderr naming what was wrong),
1 runtime failure.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from exporter import __version__, buildinfo
from exporter.errors import InputError

COMMANDS = ("serve", "scan", "calc", "catalog", "simulate", "demo", "sweep")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep it to one line
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:   # revision read only here
        print(f"vllm-drift {__version__} (revision {buildinfo.revision()}, Python {buildinfo.python_version()})")
        parser.exit(0)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` a known command's part of it: each command's module
    imports what it runs (the daemon's pipeline, aiohttp, the simulator), so `calc` need not load
    `serve`'s (about 1.5 s of the 2.5 s a `calc` took)."""
    parser = _Parser(prog="vllm-drift", description="Prometheus exporter and drift detector for fleets of vLLM servers.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print version, revision and Python version, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser,
                                title="commands (vllm-drift COMMAND --help for each)")
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"exporter.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the command is the first word; anything else (`--help`, `--version`, a typo) gets them all
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if args.command is None:   # `vllm-drift` alone: the command list
        parser.print_help()
        return 0
    # every command's logs go to stderr, never into its output (`scan --json | jq`); `serve` and
    # `demo` set their own format and level, and the standard `logging` root
    from exporter import logs
    logs.configure("console", "warning", stdlib=False)
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"vllm-drift {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`vllm-drift scan ... | head`): stop quietly, as Unix tools do;
        # stdout is pointed at /dev/null so the interpreter's final flush does not complain
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
