"""The vLLM version: one type and one reader for every place that compares versions (the
`/version` answer, the era tables' first/last releases, the calculator's release switches)."""
from __future__ import annotations

import re

Version = tuple[int, int, int]

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def read_version(text: str | tuple[int, ...] | None) -> Version | None:
    """'0.19.0', 'v0.11.2', '0.6.4.post1', '0.11.0rc1+cu128' -> (0, 19, 0) ...; None when there is
    no X.Y at the start (an unknown or unreadable version)."""
    if text is None:
        return None
    if isinstance(text, tuple):
        return tuple(int(x) for x in (*text, 0, 0)[:3])  # type: ignore[return-value]
    m = _VERSION.match(str(text).strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def format_version(v: Version) -> str:
    return ".".join(map(str, v))
