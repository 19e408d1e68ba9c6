"""Error types shared by every part of vllm-drift.

`InputError` is the one documented error for bad input (a config file, a scenario, an exposition
payload, an unknown model or GPU). The CLI turns it into exit status 2 and one line on stderr; the
daemon logs and counts it and keeps its last good state. Anything else is a bug or a runtime
failure (exit 1).
"""


class InputError(Exception):
    """Bad input. The message names what was wrong and where (file, key, target or line)."""


class ConfigError(InputError):
    """A configuration file or option is invalid."""


class ParseError(InputError):
    """An exposition payload could not be read. `reason` is the scrape-error label it counts under."""

    reason = "parse"


class CatalogError(InputError):
    """An unknown model, GPU or other catalog name; the message lists the closest names."""


# The fixed set of scrape failure reasons (bounded label cardinality).
REASONS = ("connect", "timeout", "http_status", "body_too_large", "decode", "read", "parse",
           "not_vllm", "router")


class ScrapeError(Exception):
    """A target could not be fetched; `reason` (one of REASONS) labels the error counter."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
