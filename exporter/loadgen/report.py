"""The sweep's self-contained HTML report: throughput vs load and latency vs load, measured points
with the model's prediction on the same axes and the knee marked, then the per-level table."""
from __future__ import annotations

import math
from typing import Any, Sequence

from exporter.loadgen.prediction import calibration_lines
from exporter.reports.html import page, plot, require_plotly, section, table


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def render(doc: dict[str, Any], predicted: Sequence[dict[str, Any]], note: str) -> str:
    go = require_plotly()
    cal = (doc.get("prediction") or {}).get("calibrated") or {}
    fitted = cal.get("points") if cal.get("applied") else None
    key = doc["level_key"]
    levels = [lv for lv in doc["levels"] if lv.get("completed")]
    xs = [lv[key] for lv in levels]
    knee = doc.get("knee")
    xlabel = "concurrent requests" if key == "concurrency" else "offered rate (requests/s)"
    if key == "concurrency" and xs:
        # a log axis takes its range (and annotations their x) in log10 units; an explicit range
        # keeps plotly from stretching the axis to an annotation placed in data units
        lo, hi = math.log10(min(xs)) - 0.15, math.log10(max(xs)) + 0.15
        axis = dict(title=xlabel, type="log", dtick=0.30103, range=[lo, hi])
    else:
        axis = dict(title=xlabel)

    def ax(x: float) -> float:          # an annotation's x on the x axis
        return math.log10(x) if key == "concurrency" else x

    tput = go.Figure()
    tput.add_trace(go.Scatter(x=xs, y=[lv["output_tokens_per_s"] for lv in levels], mode="lines+markers",
                              name="measured output tokens/s"))
    if predicted:
        tput.add_trace(go.Scatter(x=[p["x"] for p in predicted], y=[p["output_tokens_per_s"] for p in predicted],
                                  mode="lines", line=dict(dash="dash"), name="model prediction"))
    if fitted:
        tput.add_trace(go.Scatter(x=[p["x"] for p in fitted], y=[p["output_tokens_per_s"] for p in fitted],
                                  mode="lines", line=dict(dash="dot"), name="model calibrated on this sweep"))
    lat = go.Figure()
    for name, field, dash in (("TTFT p50", "ttft_p50_s", None), ("TTFT p99", "ttft_p99_s", "dot"),
                              ("TPOT p50", "tpot_p50_s", None), ("TPOT p99", "tpot_p99_s", "dot")):
        lat.add_trace(go.Scatter(x=xs, y=[_ms(lv[field]) for lv in levels], mode="lines+markers",
                                 name=f"measured {name}", line=dict(dash=dash)))
    if predicted:
        for name, field in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
            lat.add_trace(go.Scatter(x=[p["x"] for p in predicted], y=[_ms(p[field]) for p in predicted],
                                     mode="lines", line=dict(dash="dash"), name=f"predicted {name} (mean)"))
    if fitted:
        for name, field in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")):
            lat.add_trace(go.Scatter(x=[p["x"] for p in fitted], y=[_ms(p[field]) for p in fitted],
                                     mode="lines", line=dict(dash="dot"), name=f"calibrated {name} (mean)"))
    for fig, ytitle in ((tput, "output tokens/s"), (lat, "ms (log)")):
        if knee:
            fig.add_vline(x=knee[key], line=dict(color="firebrick", dash="dash"))
            fig.add_annotation(x=ax(knee[key]), xref="x", y=1, yref="paper", yanchor="bottom",
                               text=f"knee: {knee[key]:g} ({knee['reason']})", showarrow=False,
                               font=dict(color="firebrick"))
        if not predicted:
            fig.add_annotation(x=0.01, xref="paper", y=0.98, yref="paper", xanchor="left", yanchor="top",
                               text=note, showarrow=False, bgcolor="rgba(255,255,255,0.8)",
                               font=dict(color="#555"))
        fig.update_layout(xaxis=axis, yaxis=dict(title=ytitle), height=440, showlegend=True,
                          margin=dict(l=60, r=20, t=40, b=80),
                          legend=dict(orientation="h", y=-0.2, yanchor="top"))
    lat.update_yaxes(type="log")

    headers = [key, "done/failed", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
               "ITL p99 ms", "KV mean/max", "running/waiting max", "preemptions"]
    rows, mark = [], []
    for lv in doc["levels"]:
        rows.append([f"{lv[key]:g}", f"{lv['completed']}/{lv['failed']}", _f(lv.get("output_tokens_per_s"), 1),
                     _f(_ms(lv.get("ttft_p50_s")), 1), _f(_ms(lv.get("ttft_p99_s")), 1),
                     _f(_ms(lv.get("tpot_p50_s")), 2), _f(_ms(lv.get("tpot_p99_s")), 2),
                     _f(_ms(lv.get("itl_p99_s")), 2),
                     f"{_pct(lv.get('kv_usage_mean'))}/{_pct(lv.get('kv_usage_max'))}",
                     f"{_f(lv.get('running_max'), 0)}/{_f(lv.get('waiting_max'), 0)}",
                     _f(lv.get("preemptions"), 0)])
        mark.append(bool(knee) and lv[key] == knee[key])
    knee_txt = (f"Knee at {knee[key]:g}: {knee['detail']}." if knee else
                "No knee: throughput still grows by at least 10 % per doubling at the last level.")
    s = doc["server"]
    sub = f"{s['url']} — {s['model']} on {s['tp']} x {s['gpu'] or 'unknown GPU'}, vLLM {s.get('version') or '?'}"
    return page("vLLM saturation sweep", [
        section("Throughput", plot(tput), note=knee_txt),
        section("Latency", plot(lat), note=" ".join([note + "."] + _calibration_words(doc))),
        section("Levels", table(headers, rows, mark=mark),
                note=doc.get("knee_rule", "") + (f" Stopped early: {doc['stopped']}." if doc.get("stopped") else "")),
    ], subtitle=sub)


def _calibration_words(doc: dict[str, Any]) -> list[str]:
    return [line.strip().rstrip(".") + "." for line in calibration_lines(doc.get("prediction") or {})]


def _f(v: float | None, nd: int) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.0f}%"
