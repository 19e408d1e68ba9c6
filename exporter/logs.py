"""Structured logs: JSON lines on stderr by default, a readable console format on request.

Library loggers (apscheduler, httpx) go through the standard `logging` module at WARNING and are
rendered by the same structlog processors, so every line on stderr has one format.
"""
from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure(fmt: str = "json", level: str = "info") -> None:
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    shared = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, timestamper]
    renderer = (structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()) if fmt == "console"
                else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=renderer, foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for noisy in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.ERROR if noisy == "apscheduler" else logging.WARNING)
