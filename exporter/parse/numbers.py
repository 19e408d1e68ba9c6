"""Numbers from untrusted text: label values, JSON fields, window summaries."""
from __future__ import annotations

import math
from typing import Any


def finite_float(v: Any) -> float | None:
    """`v` as a finite float, or None when it is absent, a bool, not a number, NaN or infinite."""
    if v is None or isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
