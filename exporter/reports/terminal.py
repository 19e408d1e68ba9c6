"""Terminal tables for calc and catalog output (rich). Piped output stays plain text (no colour
codes) at a fixed width, so it reads the same in a log or a README."""
from __future__ import annotations

import io
import json
import sys
from typing import Any, Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table


TEXT_COLUMNS = {"note", "bound by", "binding constraint", "title", "arrival", "objective", "gpu", "interconnect",
                "architecture", "source"}


class _Plain:
    """Piped output: rich renders into a buffer; lines are written without rich's trailing
    padding, so logs, diffs and README snippets stay clean."""

    def __init__(self) -> None:
        self.console = Console(file=io.StringIO(), width=140, no_color=True, highlight=False, markup=False,
                               soft_wrap=False, force_terminal=False)

    def print(self, *objects: Any) -> None:
        self.console.print(*objects)
        buf = self.console.file
        text = buf.getvalue()
        buf.seek(0)
        buf.truncate()
        sys.stdout.write("\n".join(line.rstrip() for line in text.split("\n")))


def console() -> Any:
    """A rich console on a terminal; a trailing-space-free plain writer when piped."""
    if sys.stdout.isatty():
        return Console(file=sys.stdout, highlight=False, markup=False)   # catalog text has [brackets]
    return _Plain()


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "—"
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={fmt(x)}" for k, x in v.items())
    return "—" if v is None else str(v)


def ms(v: Any) -> str:
    return "—" if v is None else f"{v * 1000:,.1f}"


def kv_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE, show_header=False, pad_edge=False,
              min_width=len(title) + 1)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, fmt(v))
    return t


def grid(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
         mark: Sequence[bool] | None = None, caption: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, caption=caption, caption_justify="left", padding=(0, 1),
              min_width=min(len(title) + 1, 120))
    for i, h in enumerate(headers):
        text = i == 0 or h in TEXT_COLUMNS
        t.add_column(h, justify="left" if text else "right", overflow="fold", no_wrap=i == 0 or not text,
                     min_width=12 if text and i else None)
    for i, r in enumerate(rows):
        marked = bool(mark and i < len(mark) and mark[i])
        t.add_row(*[c if isinstance(c, str) else fmt(c) for c in r], style="bold green" if marked else None)
    return t


def print_calc(doc: dict[str, Any]) -> None:
    c = console()
    s = doc["setup"]
    prof = doc.get("profile")
    if prof:
        c.print(kv_table(f"Profile: {prof['name']} — {prof['title']} (objective: {prof['objective']})", [
            ("prompt tokens mean / p99", f"{fmt(prof['prompt_tokens']['mean'])} / {fmt(prof['prompt_tokens']['p99'])}"),
            ("output tokens mean / p99", f"{fmt(prof['output_tokens']['mean'])} / {fmt(prof['output_tokens']['p99'])}"),
            ("arrival", prof["arrival"]), ("prefix hit ratio", prof["prefix_hit_ratio"]),
            ("SLO TTFT / TPOT p99 (ms)", f"{ms(prof['slo']['ttft_p99_s'])} / {ms(prof['slo']['tpot_p99_s'])}"),
            *((f"source: {k}", v) for k, v in prof["sources"].items()),
            ("overridden by flags", ", ".join(prof["overridden_by_flags"]) or "none")]))
    c.print(kv_table(f"Setup: {s['model']} on {s['tp'] * s['pp']} x {s['gpu']}", list(s.items())[2:]))
    kv = doc["kv_cache"]
    c.print(kv_table("KV cache (as vLLM logs it at startup)", [
        ("GPU KV cache size (tokens)", kv["tokens"]), ("GPU blocks", kv["gpu_blocks"]),
        (f"max concurrency at {s['max_model_len']:,} tokens", kv["max_concurrency"]),
        ("KV bytes per token per GPU", kv["bytes_per_token"]), ("KV cache groups", kv["num_groups"])]))
    c.print(kv_table("Memory per GPU (GiB)", [(k.removesuffix("_gib"), v) for k, v in doc["memory"].items()]))
    tr = doc.get("traffic")
    if tr:
        c.print(kv_table("Traffic used", [
            ("prompt tokens mean / p99", f"{fmt(tr['prompt_tokens']['mean'])} / {fmt(tr['prompt_tokens']['p99'])}"
                                         f" ({tr['prompt_tokens']['p99_source']})"),
            ("output tokens mean / p99", f"{fmt(tr['output_tokens']['mean'])} / {fmt(tr['output_tokens']['p99'])}"
                                         f" ({tr['output_tokens']['p99_source']})"),
            ("load", f"{fmt(tr['rate_rps'])} req/s" if tr["rate_rps"] else
                     (f"{tr['concurrency']} clients" if tr["concurrency"] else "none given: recommended operating point"))]))
    p = doc["predicted"]
    c.print(kv_table(f"Predicted at the {p['operating_point']}", [
        ("output tokens/s", p["output_tokens_per_s"]), ("requests/s", p["requests_per_s"]),
        ("TTFT mean / p99 (ms)", f"{ms(p['ttft_s'])} / {ms(p['ttft_p99_s'])}"),
        ("TPOT mean / p99 (ms)", f"{ms(p['tpot_s'])} / {ms(p.get('tpot_p99_s'))}"),
        ("running requests", p["running"]), ("batch bound by", p["binding"]),
        ("meets SLO", p["meets_slo"]), ("basis", basis_text(p))]))
    if doc.get("calibration") is not None:
        print_calibration(c, doc["calibration"])
    rec = doc["recommendation"]
    c.print(grid("Recommended flags", ["flag", "value", "binding constraint"],
                 [(k, fmt(v), rec["binding"].get(k, "")) for k, v in rec.items() if k != "binding"]))
    sd = doc.get("speculative_decoding")
    if sd:
        c.print(grid(f"Speculative decoding (k={sd['num_speculative_tokens']}, {sd['method']})",
                     ["acceptance", "speed-up", "tokens/step", "clear win (x1.05)"],
                     [(fmt(r["acceptance"]), f"x{r['speedup']:.2f}", r["tokens_per_step"], r["helps"])
                      for r in sd["by_acceptance"]]))
        c.print(f"  verdict: {sd['verdict']}\n  basis: {sd['assumption']}\n")
    if doc.get("sweep"):
        print_sweep(c, doc["sweep"])
    tiers = doc.get("tiers") or []
    if tiers:
        c.print(grid("GPU tiers (by $/million output tokens)", ["gpu", "tp", "replicas", "$/hour", "$/Mtok",
                                                                 "meets SLO", "batch", "bound by", "req/s"],
                     [(t["gpu"] + (" (current)" if t.get("current") else ""), t["tp"], t["replicas"],
                       t["dollars_per_hour"], t["dollars_per_million_tokens"], t["meets_slo"],
                       t["max_num_seqs"], _short_why(t), t["replica_rate_rps"]) for t in tiers],
                     mark=[bool(t.get("current")) for t in tiers]))
    for n in doc.get("notes") or []:
        c.print(f"note: {n}")
    if not doc.get("notes"):
        c.print("")


def basis_text(p: dict[str, Any]) -> str:
    """Which model "predicted" comes from: the a-priori one, or calibrated (with the prior beside)."""
    if p.get("basis") != "calibrated":
        return "a priori (GPU class factors)"
    return (f"calibrated (a priori: TPOT {ms(p.get('prior_tpot_s'))} ms, "
            f"TTFT {ms(p.get('prior_ttft_s'))} ms)")


def print_calibration(c: Console, cal: dict[str, Any]) -> None:
    """`calc --calibrate`: what the fit used, what it changed, and each row against both models."""
    from exporter.model.calibrate import describe
    rows = describe(cal)
    c.print(kv_table("Calibration (--calibrate)", rows))
    if cal.get("rows"):
        def trio(d: dict[str, Any]) -> str:
            return " / ".join(ms(d[k]) for k in ("measured", "prior", "calibrated"))
        c.print(grid("Calibration rows: measured / a priori / calibrated",
                     ["line", "clients", "prompt/output", "TPOT ms", "TTFT ms", "vLLM", "status"],
                     [(r["line"], fmt(r["concurrency"]), f"{fmt(r['input_len'])}/{fmt(r['output_len'])}",
                       trio(r["tpot_s"]), trio(r["ttft_s"]), r.get("engine_version") or "—", r["status"])
                      for r in cal["rows"]]))


def _short_why(t: dict[str, Any]) -> str:
    why = str(t.get("why") or "").split("; ")[0]
    return why.replace(f"batch {t.get('max_num_seqs')} bound by ", "")


def print_sweep(c: Console, sw: dict[str, Any]) -> None:
    headers = [sw["param"], "KV tokens", "max conc.", "tokens/s", "TTFT p50", "TTFT p99", "TPOT p50",
               "TPOT p99", "$/Mtok", "SLO", "binding constraint"]
    rows = [(fmt(r["value"]) + (" *" if r["recommended"] else ""), r["kv_tokens"], r["max_concurrency"],
             r["throughput_tokens_per_s"], ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["tpot_p50_s"]),
             ms(r["tpot_p99_s"]), r["dollars_per_million_tokens"], r["meets_slo"], r["binding"])
            for r in sw["rows"]]
    model = "calibrated model" if sw.get("basis") == "calibrated" else "a-priori model"
    c.print(grid(f"Trade-off: {sw['param']} (objective {sw['objective']}; {model}; * = recommended; latencies in ms)",
                 headers, rows, mark=[r["recommended"] for r in sw["rows"]]))


def print_profiles(*, json_out: bool = False) -> None:
    from exporter.model.profiles import profiles
    profs = [p.as_dict() for p in profiles().values()]
    if json_out:
        json.dump(profs, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    console().print(grid("Workload profiles (vllm-drift calc --profile NAME)",
                         ["name", "objective", "prompt mean/p99", "output mean/p99", "arrival",
                          "TTFT/TPOT p99 SLO (ms)", "title"],
                         [(p["name"], p["objective"], f"{fmt(p['prompt_tokens']['mean'])}/{fmt(p['prompt_tokens']['p99'])}",
                           f"{fmt(p['output_tokens']['mean'])}/{fmt(p['output_tokens']['p99'])}", p["arrival"],
                           f"{ms(p['slo']['ttft_p99_s'])}/{ms(p['slo']['tpot_p99_s'])}", p["title"]) for p in profs],
                         caption="sources: vllm-drift catalog profiles --json"))
