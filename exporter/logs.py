"""Structured logs on stderr: JSON lines by default, logfmt (`key=value`, what Prometheus and
Loki users read and grep) or a readable console format on request (`--log-format`).

Library loggers (apscheduler, httpx) go through the standard `logging` module at WARNING and are
rendered by the same structlog processors, so every line on stderr has one format.
"""
from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("json", "logfmt", "console")


class _Stderr:
    """`sys.stderr` as it is when a line is written, not the object it was when logging was
    configured: a host that swaps the stream later (pytest's capture does, between tests) must
    not leave the logger writing to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _Stderr()


def configure(fmt: str = "json", level: str = "info", *, stdlib: bool = True) -> None:
    """structlog's output (stderr, `fmt`, `level` and above); with `stdlib`, the standard
    `logging` root too (the daemon's libraries). A one-shot command leaves `logging` alone."""
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    shared = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, timestamper]
    renderer = _renderer(fmt)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_STDERR),
        cache_logger_on_first_use=False,
    )
    if not stdlib:
        return
    handler = logging.StreamHandler(_STDERR)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=renderer, foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.ERROR if noisy == "apscheduler" else logging.WARNING)


def _renderer(fmt: str):
    if fmt == "console":
        return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    if fmt == "logfmt":
        # ts, level and msg first, as in Prometheus' own logs; the rest in the order they were given.
        return structlog.processors.LogfmtRenderer(key_order=["timestamp", "level", "event"], drop_missing=True,
                                                   bool_as_flag=False)
    if fmt == "json":
        return structlog.processors.JSONRenderer()
    raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
