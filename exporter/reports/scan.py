"""The `scan --html` report: observed vs predicted per target.

`render_scan_report(doc)` takes what `scan --json` prints — `{"targets": [...]}` or the list itself,
one entry per served model per target (../shared/INTERFACE.md) — and plots, per metric, each
target's `observed` value beside its `predicted` one. Keys it does not find are left out of the
plots and shown as "—" in the table. Wiring `scan --html FILE` is one line:
`Path(FILE).write_text(render_scan_report(doc))`.
"""
from __future__ import annotations

from typing import Any, Iterable

from exporter.reports.html import page, plot, require_plotly, section, table

# (label, observed keys, predicted keys, scale): the first key present wins, so the report reads
# both the contract's names and older/newer spellings
METRICS = (
    ("KV cache tokens", ("kv_cache_tokens",), ("kv_cache_tokens",), 1.0),
    ("TPOT (ms)", ("tpot_p50_s", "tpot_s"), ("tpot_seconds", "tpot_s"), 1000.0),
    ("TTFT (ms)", ("ttft_p50_s", "ttft_s"), ("ttft_seconds", "ttft_s"), 1000.0),
    ("TPOT p99 (ms)", ("tpot_p99_s",), ("tpot_p99_seconds", "tpot_p99_s"), 1000.0),
    ("TTFT p99 (ms)", ("ttft_p99_s",), ("ttft_p99_seconds", "ttft_p99_s"), 1000.0),
)


def _num(section: Any, keys: Iterable[str]) -> float | None:
    if not isinstance(section, dict):
        return None
    for k in keys:
        v = section.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _targets(doc: Any) -> list[dict[str, Any]]:
    items = doc.get("targets", []) if isinstance(doc, dict) else doc
    return [t for t in (items or []) if isinstance(t, dict)]


def render_scan_report(doc: Any, *, title: str = "vllm-drift scan") -> str:
    """A self-contained HTML page: one grouped bar chart per metric with data, then a table."""
    go = require_plotly()
    targets = _targets(doc)
    labels = [f"{t.get('target', '?')} · {t.get('model_name') or '?'}" for t in targets]
    plots, rows = [], []
    for label, obs_k, pred_k, scale in METRICS:
        obs = [_num(t.get("observed"), obs_k) for t in targets]
        pred = [_num(t.get("predicted"), pred_k) for t in targets]
        if not any(v is not None for v in obs + pred):
            continue
        fig = go.Figure([
            go.Bar(name="observed", x=labels, y=[None if v is None else v * scale for v in obs]),
            go.Bar(name="predicted", x=labels, y=[None if v is None else v * scale for v in pred])])
        fig.update_layout(barmode="group", title=f"{label}: observed vs predicted", height=340,
                          margin=dict(l=50, r=20, t=60, b=80), legend_orientation="h")
        plots.append(plot(fig))
    for label, t in zip(labels, targets):
        row: list[Any] = [label, t.get("vllm_version")]
        for _, obs_k, pred_k, scale in METRICS:
            o, p = _num(t.get("observed"), obs_k), _num(t.get("predicted"), pred_k)
            row += [None if o is None else round(o * scale, 3), None if p is None else round(p * scale, 3)]
        names = [str(f.get("finding")) if isinstance(f, dict) else str(f) for f in t.get("findings") or []]
        row.append(", ".join(names) or "none")
        rows.append(row)
    headers = ["target · model", "vLLM"] + [f"{m[0]} {k}" for m in METRICS for k in ("observed", "predicted")] + ["findings"]
    body = [section("Observed vs predicted per target", *plots,
                    note=f"{len(targets)} served model(s); predicted = the calculator for the detected setup."),
            section("Targets", table(headers, rows))]
    return page(title, body, subtitle="observed from each target's /metrics, predicted by the vllm-drift model")
