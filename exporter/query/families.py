"""Prometheus query results back into exposition families, so query mode and scrape mode share the
canonicaliser (`exporter.parse.canonical.canonicalise`) and everything after it.

Why rebuild families instead of a second canonicaliser: vLLM's naming across eras (renames,
deprecated twins, the `engine` label, histogram layouts) is handled in one place; a series read
from Prometheus is the same sample the target exposed, plus the labels Prometheus attached. Those
are removed here: `job`, `instance`, the configured target label, and any other label that has
one value on every series of the target (relabelling adds such labels: `namespace`, `pod`, ...),
except `model_name` and `engine`, which vLLM sets itself. Pure.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from exporter.parse import eras
from exporter.parse.exposition import Family, Sample

# sample name -> (family name as prometheus_client groups it, type)
_FAMILY_OF: dict[str, tuple[str, str]] = {}
_CANONICAL: list[str] = []
for _m in eras.V0_NAMES + eras.V1_NAMES:
    # every name of the era tables: canonical keys, plus those the version guess reads
    wanted = True
    if _m.kind == "gauge":
        _FAMILY_OF[_m.exposed] = (_m.exposed, "gauge")
        names = [_m.exposed]
    elif _m.kind == "counter":
        base = _m.exposed[: -len("_total")] if _m.exposed.endswith("_total") else _m.exposed
        _FAMILY_OF[_m.exposed] = _FAMILY_OF[base + "_created"] = (base, "counter")
        names = [_m.exposed, base + "_created"]
    else:
        for suffix in ("_bucket", "_sum", "_count", "_created"):
            _FAMILY_OF[_m.exposed + suffix] = (_m.exposed, "histogram")
        names = [_m.exposed + s for s in ("_bucket", "_sum", "_count", "_created")]
    if wanted:
        _CANONICAL.extend(n for n in names if n not in _CANONICAL)

#: Every sample name the era tables know (what query mode asks Prometheus for): the canonical
#: signals and the families whose presence dates the vLLM version.
CANONICAL_SAMPLE_NAMES: tuple[str, ...] = tuple(sorted(_CANONICAL))
KEEP_LABELS = frozenset(("model_name", "engine", "le", "finished_reason", "position"))
PROMETHEUS_LABELS = frozenset(("job", "instance"))


def name_regex() -> str:
    """A PromQL regex matching exactly the canonical sample names (`:` needs no escape)."""
    return "|".join(CANONICAL_SAMPLE_NAMES)


def target_constant_labels(series: list[tuple[dict[str, str], float]], target_label: str) -> frozenset[str]:
    """The labels Prometheus (and relabelling) attached to every series of the target: `job`,
    `instance`, the target label, and any other label with one value on all of its series."""
    drop = set(PROMETHEUS_LABELS)
    drop.add(target_label)
    if len(series) > 1:
        first = series[0][0]
        constant = {k: v for k, v in first.items() if k not in KEEP_LABELS and k != "__name__"}
        for labels, _ in series[1:]:
            if not constant:
                break
            for k in [k for k, v in constant.items() if labels.get(k) != v]:
                del constant[k]
        drop.update(constant)
    return frozenset(drop)


def rows_constant_labels(rows: list[tuple[str, Mapping[str, str], float]], target_label: str) -> frozenset[str]:
    """`target_constant_labels` for (name, labels, value) rows."""
    return target_constant_labels([(labels, value) for _, labels, value in rows], target_label)


def rows_to_families(rows: Iterable[tuple[str, Mapping[str, str], float]], drop: frozenset[str]) -> list[Family]:
    """(name, labels, value) rows -> exposition families in the canonicaliser's shape, without the
    labels in `drop`. Sample order within a family does not matter: the canonicaliser sorts
    histogram bounds itself."""
    families: dict[str, Family] = {}
    family_of = _FAMILY_OF
    for name, labels, value in rows:
        fam = families.get(name)
        if fam is None:
            fam_name, kind = family_of.get(name, (name, "unknown"))
            fam = families.get(fam_name)
            if fam is None:
                fam = Family(fam_name, kind, "")
                families[fam_name] = fam
            families[name] = fam
        rest = {k: v for k, v in labels.items() if k not in drop}
        fam.samples.append(Sample(name, rest, float(value), None))
    seen: set[int] = set()
    out = []
    for fam in families.values():
        if id(fam) not in seen:
            seen.add(id(fam))
            out.append(fam)
    return out
