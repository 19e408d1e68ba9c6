"""The `scan --html` report: observed vs predicted per target.

`render_scan_report(results)` takes the list `scan --json` prints (one dict per served model per
target; see ../shared/INTERFACE.md) and reads, where present, observed and predicted TTFT/TPOT
and throughput. Keys it does not find are left out of the plots and shown as "—" in the table.
"""
from __future__ import annotations

from typing import Any, Iterable

from exporter.reports.html import page, plot, require_plotly, section, table

# (label, observed keys, predicted keys): the first key present wins, so small schema changes in
# the scan document do not break the report
METRICS = (
    ("TTFT p99 (ms)", ("ttft_p99_s",), ("predicted_ttft_p99_s", "predicted_ttft_s"), 1000.0),
    ("TPOT p99 (ms)", ("tpot_p99_s",), ("predicted_tpot_p99_s", "predicted_tpot_s"), 1000.0),
    ("TPOT p50 (ms)", ("tpot_p50_s",), ("predicted_tpot_s",), 1000.0),
    ("output tokens/s", ("output_tokens_per_s", "generation_tokens_per_s"), ("predicted_output_tokens_per_s",), 1.0),
)


def _find(d: dict[str, Any], keys: Iterable[str]) -> Any:
    for src in (d, d.get("observed") or {}, d.get("predicted") or {}, d.get("snapshot") or {}):
        if not isinstance(src, dict):
            continue
        for k in keys:
            v = src.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return v
    return None


def _pred(d: dict[str, Any], keys: Iterable[str]) -> Any:
    pred = d.get("predicted")
    if isinstance(pred, dict):
        for k in keys:
            base = k.removeprefix("predicted_")
            for kk in (k, base):
                v = pred.get(kk)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return v
    return _find({k: d.get(k) for k in keys}, keys)


def render_scan_report(results: list[dict[str, Any]], *, title: str = "vllm-drift scan") -> str:
    go = require_plotly()
    labels = [f"{r.get('target', '?')} · {r.get('model_name', r.get('model', '?'))}" for r in results]
    sections = []
    rows = []
    for label, r in zip(labels, results):
        row = [label]
        for _, obs_k, pred_k, scale in METRICS:
            o, p = _find(r, obs_k), _pred(r, pred_k)
            row += ["—" if o is None else round(o * scale, 2), "—" if p is None else round(p * scale, 2)]
        findings = r.get("findings") or []
        row.append(", ".join(str(f.get("finding", f)) if isinstance(f, dict) else str(f) for f in findings) or "none")
        rows.append(row)
    for label, obs_k, pred_k, scale in METRICS:
        obs = [_find(r, obs_k) for r in results]
        pred = [_pred(r, pred_k) for r in results]
        if not any(v is not None for v in obs + pred):
            continue
        fig = go.Figure([
            go.Bar(name="observed", x=labels, y=[None if v is None else v * scale for v in obs]),
            go.Bar(name="predicted", x=labels, y=[None if v is None else v * scale for v in pred])])
        fig.update_layout(barmode="group", title=f"{label}: observed vs predicted", height=340,
                          margin=dict(l=50, r=20, t=60, b=80), legend_orientation="h")
        sections.append(plot(fig))
    headers = ["target · model"] + [f"{lab} {kind}" for lab, *_ in METRICS for kind in ("obs", "pred")] + ["findings"]
    body = [section("Observed vs predicted per target", *sections,
                    note=f"{len(results)} served model(s). Predicted = the calculator for the detected setup.")]
    body.append(section("Table", table(headers, rows)))
    return page(title, body, subtitle="observed from the targets' /metrics, predicted by the vllm-drift model")
