"""The `calc --html` report: memory breakdown, throughput and latency vs concurrency with the
recommended point, the trade-off table, speculative decoding and the GPU tiers."""
from __future__ import annotations

from typing import Any

from exporter.reports.html import esc, page, plot, require_plotly, section, table


def _ms(v: Any) -> Any:
    return None if v is None else round(v * 1000, 2)


def _fmt_ms(v: Any) -> str:
    return "—" if v is None else f"{v * 1000:,.1f} ms"


def memory_figure(doc: dict[str, Any]) -> Any:
    go = require_plotly()
    m = doc["memory"]
    total = doc["setup"]["gpu_memory_gib"]
    parts = [("weights", m["weights_gib"]), ("activations (profiled)", m["activation_gib"]),
             ("non-torch", m["non_torch_gib"]), ("CUDA graphs", m["cudagraph_gib"]),
             ("KV cache", m["kv_cache_gib"])]
    parts.append(("left free (1 - gpu_memory_utilization)", max(total - sum(v for _, v in parts), 0.0)))
    fig = go.Figure()
    for name, v in parts:
        fig.add_trace(go.Bar(name=name, x=[v], y=["GPU memory"], orientation="h",
                             hovertemplate=f"{name}: %{{x:.2f}} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", height=280, title=f"Memory per GPU ({total:.1f} GiB)",
                      xaxis_title="GiB", margin=dict(l=40, r=20, t=50, b=40), legend_traceorder="normal",
                      legend=dict(orientation="h", y=-0.45))
    return fig


def curve_figure(curve: list[dict[str, Any]], slo_tpot: float | None, slo_ttft: float | None,
                 measured: list[dict[str, Any]] | None = None) -> Any:
    """`measured`: calibration rows (`calibration.rows`) of the traffic's lengths, drawn as points
    beside the curves they calibrated."""
    go = require_plotly()
    from plotly.subplots import make_subplots
    xs = [r["concurrency"] for r in curve]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Throughput vs concurrency", "Latency vs concurrency"))
    fig.add_trace(go.Scatter(x=xs, y=[r["throughput_tokens_per_s"] for r in curve], mode="lines+markers",
                             name="output tokens/s"), row=1, col=1)
    for key, name in (("ttft_p99_s", "TTFT p99"), ("ttft_p50_s", "TTFT p50"),
                      ("tpot_p99_s", "TPOT p99"), ("tpot_p50_s", "TPOT p50")):
        fig.add_trace(go.Scatter(x=xs, y=[_ms(r[key]) for r in curve], mode="lines+markers", name=f"{name} (ms)"),
                      row=1, col=2)
    rec = [r for r in curve if r.get("recommended")]
    if rec:
        r = rec[0]
        fig.add_trace(go.Scatter(x=[r["concurrency"]], y=[r["throughput_tokens_per_s"]], mode="markers+text",
                                 marker=dict(size=14, symbol="star", color="crimson"), text=["recommended"],
                                 textposition="top left", name="recommended max_num_seqs"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[r["concurrency"]], y=[_ms(r["tpot_p99_s"])], mode="markers",
                                 marker=dict(size=14, symbol="star", color="crimson"), showlegend=False),
                      row=1, col=2)
    if measured:
        xs_m = [r["concurrency"] for r in measured]
        for key, name, symbol in (("ttft_s", "TTFT measured", "diamond"), ("tpot_s", "TPOT measured", "x")):
            fig.add_trace(go.Scatter(x=xs_m, y=[_ms(r[key]["measured"]) for r in measured], mode="markers",
                                     marker=dict(size=11, symbol=symbol, color="black"), name=f"{name} (ms)",
                                     text=[f"line {r['line']}: {r['status']}" for r in measured]), row=1, col=2)
    for v, name in ((slo_tpot, "TPOT p99 SLO"), (slo_ttft, "TTFT p99 SLO")):
        if v is not None:   # a trace, not a shape: shapes on log axes take log10 coordinates
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[v * 1000] * 2, mode="lines", name=f"{name} (ms)",
                                     line=dict(dash="dash", color="gray")), row=1, col=2)
    fig.update_xaxes(type="log", title_text="concurrent requests (closed loop)")
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    fig.update_yaxes(type="log", title_text="ms", row=1, col=2)
    fig.update_layout(height=460, margin=dict(l=50, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.28))
    return fig


def sweep_figure(sw: dict[str, Any]) -> Any:
    go = require_plotly()
    from plotly.subplots import make_subplots
    rows = [r for r in sw["rows"] if r.get("throughput_tokens_per_s")]
    xs = [str(r["value"]) for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=xs, y=[r["throughput_tokens_per_s"] for r in rows], name="output tokens/s",
                         marker_color=["crimson" if r["recommended"] else "steelblue" for r in rows]))
    fig.add_trace(go.Scatter(x=xs, y=[_ms(r["tpot_p99_s"]) for r in rows], name="TPOT p99 (ms)",
                             mode="lines+markers"), secondary_y=True)
    fig.add_trace(go.Scatter(x=xs, y=[_ms(r["ttft_p99_s"]) for r in rows], name="TTFT p99 (ms)",
                             mode="lines+markers"), secondary_y=True)
    fig.update_layout(title=f"Trade-off: {sw['param']} (red bar = recommended)", height=380,
                      margin=dict(l=50, r=50, t=60, b=40), legend_orientation="h")
    fig.update_xaxes(title_text=sw["param"], type="category")
    fig.update_yaxes(title_text="tokens/s", secondary_y=False)
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=True)
    return fig


def spec_figure(sd: dict[str, Any]) -> Any:
    go = require_plotly()
    rows = sd["by_acceptance"]
    fig = go.Figure(go.Scatter(x=[r["acceptance"] for r in rows], y=[r["speedup"] for r in rows],
                               mode="lines+markers", name="speed-up"))
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="break-even")
    fig.update_layout(title=f"Speculative decoding at batch {sd['batch']} (k={sd['num_speculative_tokens']})",
                      xaxis_title="per-token acceptance", yaxis_title="decode speed-up", height=320,
                      margin=dict(l=50, r=20, t=60, b=40))
    return fig


def _same_lengths(row: dict[str, Any], traffic: dict[str, Any]) -> bool:
    if not traffic:
        return False
    want = (traffic["prompt_tokens"]["mean"], traffic["output_tokens"]["mean"])
    return all(abs(a - b) <= 0.01 * b for a, b in zip((row["input_len"], row["output_len"]), want))


def calibration_section(cal: dict[str, Any]) -> str:
    """What `--calibrate` fitted: the rows against the a-priori and the calibrated model."""
    from exporter.model.calibrate import describe
    summary = [list(pair) for pair in describe(cal)]

    def trio(d: dict[str, Any]) -> str:
        return " / ".join(_fmt_ms(d[k]).removesuffix(" ms") for k in ("measured", "prior", "calibrated"))
    rows = cal.get("rows") or []
    detail = table(["line", "clients", "prompt / output", "TPOT ms: measured / a priori / calibrated",
                    "TTFT ms: measured / a priori / calibrated", "vLLM", "status"],
                   [[r["line"], f"{r['concurrency']:g}", f"{r['input_len']:g} / {r['output_len']:g}",
                     trio(r["tpot_s"]), trio(r["ttft_s"]), r.get("engine_version") or "—", r["status"]]
                    for r in rows]) if rows else ""
    return section("Calibration (--calibrate)", table(None, summary), detail,
                   note="Rows of the calibration files that match this model, GPU, TP and weights. "
                        "The calibrated model predicts above and sizes the recommended flags; the tiers "
                        "stay a priori.")


def sweep_table(sw: dict[str, Any]) -> str:
    headers = [sw["param"], "KV tokens", "max concurrency", "tokens/s", "TTFT p50 ms", "TTFT p99 ms",
               "TPOT p50 ms", "TPOT p99 ms", "$/Mtok", "meets SLO", "binding constraint"]
    rows = [[r["value"], r["kv_tokens"], r["max_concurrency"], r["throughput_tokens_per_s"], _ms(r["ttft_p50_s"]),
             _ms(r["ttft_p99_s"]), _ms(r["tpot_p50_s"]), _ms(r["tpot_p99_s"]), r["dollars_per_million_tokens"],
             "—" if r["meets_slo"] is None else r["meets_slo"], r["binding"]] for r in sw["rows"]]
    return table(headers, rows, mark=[r["recommended"] for r in sw["rows"]])


def render_calc_report(doc: dict[str, Any], *, curve: list[dict[str, Any]], sweep: dict[str, Any]) -> str:
    s, rec, p = doc["setup"], doc["recommendation"], doc["predicted"]
    prof = doc.get("profile")
    slo = (prof or {}).get("slo") or {}
    tr = doc.get("traffic") or {}
    sections = []
    summary = [["model", s["model"]], ["GPU", f"{s['tp'] * s['pp']} x {s['gpu']} (tp {s['tp']}, pp {s['pp']})"],
               ["vLLM", s["vllm_version"]], ["objective", doc.get("objective")]]
    if prof:
        summary.append(["profile", f"{prof['name']}: {prof['title']}"])
    if tr:
        summary += [["prompt tokens mean / p99", f"{tr['prompt_tokens']['mean']:g} / {tr['prompt_tokens']['p99']:g} "
                                                 f"({tr['prompt_tokens']['p99_source']})"],
                    ["output tokens mean / p99", f"{tr['output_tokens']['mean']:g} / {tr['output_tokens']['p99']:g} "
                                                 f"({tr['output_tokens']['p99_source']})"]]
    sections.append(section("Summary", table(None, summary)))
    sections.append(section("Recommended flags", table(["flag", "value", "binding constraint"],
                                                       [[k, v, rec["binding"].get(k, "")] for k, v in rec.items()
                                                        if k != "binding"]),
                            note=f"Predicted at the {p['operating_point']}: {p['output_tokens_per_s'] or 0:,.0f} "
                                 f"output tokens/s, TTFT p99 {_fmt_ms(p['ttft_p99_s'])}, TPOT p99 "
                                 f"{_fmt_ms(p.get('tpot_p99_s'))}, meets SLO: "
                                 f"{'—' if p['meets_slo'] is None else ('yes' if p['meets_slo'] else 'no')}."))
    kv = doc["kv_cache"]
    sections.append(section("Memory", plot(memory_figure(doc)),
                            note=f"KV cache: {kv['tokens']:,} tokens, {kv['gpu_blocks']:,} blocks, "
                                 f"max concurrency {kv['max_concurrency']} at max_model_len {s['max_model_len']:,}."))
    cal = doc.get("calibration")
    measured = [r for r in (cal or {}).get("rows", []) if _same_lengths(r, tr)]
    basis = ("calibrated on the measured rows (black marks: those of these lengths)" if p.get("basis") == "calibrated"
             else "a priori")
    sections.append(section("Throughput and latency vs concurrency",
                            plot(curve_figure(curve, slo.get("tpot_p99_s"), slo.get("ttft_p99_s"), measured)),
                            note="Closed-loop load at the recommended flags; the star is the recommended "
                                 f"max_num_seqs. Model: {basis}."))
    if cal is not None:
        sections.append(calibration_section(cal))
    sections.append(section(f"Trade-off table: {sweep['param']}", plot(sweep_figure(sweep)), sweep_table(sweep),
                            note="One parameter varied, the rest at the recommended setup; highlighted row = recommended; "
                                 + ("calibrated model." if sweep.get("basis") == "calibrated" else "a-priori model.")))
    sd = doc.get("speculative_decoding")
    if sd:
        sections.append(section("Speculative decoding", plot(spec_figure(sd)),
                                note=f"{sd['verdict']}. {sd['assumption']}."))
    tiers = doc.get("tiers") or []
    if tiers:
        sections.append(section("GPU tiers", table(
            ["GPU", "TP", "replicas", "$/hour", "$/Mtok", "meets SLO", "batch", "note"],
            [[t["gpu"] + (" (current)" if t.get("current") else ""), t["tp"], t["replicas"], t["dollars_per_hour"],
              t["dollars_per_million_tokens"], "—" if t["meets_slo"] is None else t["meets_slo"], t["max_num_seqs"],
              t["why"]] for t in tiers], mark=[bool(t.get("current")) for t in tiers])))
    if doc.get("notes"):
        sections.append(section("Notes", "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in doc["notes"]) + "</ul>"))
    return page(f"vllm-drift calc: {s['model']} on {s['gpu']}", sections,
                subtitle="Predicted by the vllm-drift performance model; every number is an estimate.")
