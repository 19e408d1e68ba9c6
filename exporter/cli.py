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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-drift", description="Prometheus exporter and drift detector for fleets of vLLM servers.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print version, revision and Python version, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser,
                                title="commands (vllm-drift COMMAND --help for each)")
    for name in COMMANDS:
        importlib.import_module(f"exporter.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
