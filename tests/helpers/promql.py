"""Walking `promql_parser` expression trees (the rules, dashboard and runbook tests all need it)."""
from __future__ import annotations

from typing import Iterator


def nodes(node) -> Iterator:
    """Every node of a parsed PromQL expression, depth first (the node itself first)."""
    yield node
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from nodes(child)
    for child in getattr(node, "args", None) or []:
        yield from nodes(child)


def vector_selectors(tree) -> list:
    """The `VectorSelector` nodes (metric name + matchers) of a parsed expression."""
    return [n for n in nodes(tree) if type(n).__name__ == "VectorSelector"]
