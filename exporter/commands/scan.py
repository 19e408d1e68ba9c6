"""`vllm-drift scan`: a one-shot diagnosis of vLLM servers or saved `/metrics` files."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from exporter.commands.simulate import DUMP_STAMP
from exporter.config import Config, TargetSpec, check_url, describe_error
from exporter.discovery import vllm_args
from exporter.errors import InputError, ParseError, ScrapeError
from exporter.events import needs_more_data
from exporter.parse import parse_vllm
from exporter.parse.metadata import Metadata
from exporter.parse.snapshot import Snapshot
from exporter.pipeline import Pipelines, TargetPipeline
from exporter.report import ModelReport
from exporter.reports.html import require_plotly
from exporter.reports.scan import render_scan_report
from exporter.scrape import Scraper
from exporter.window.window import is_reset


EXAMPLES = """\
examples:
  vllm-drift scan http://10.0.0.5:8000 --gpu L4
      one scrape: every verdict one snapshot can give (a full KV pool with a queue, risky
      memory settings, a hint that contradicts the pool); what needs rates is listed
  vllm-drift scan http://10.0.0.5:8000 --gpu L4 --interval 30
      two scrapes 30 s apart: rates too (preemptions, throughput, window latency)
  vllm-drift scan http://10.0.0.5:8000 --gpu L4 --max-num-seqs 64 --tpot-slo 50ms
      with what the metrics cannot tell: the server's flags and its objectives (as targets[] gives them)
  vllm-drift scan metrics.prom
      a saved /metrics file
  vllm-drift scan before.prom --after later.prom --interval 60
      a saved pair, 60 s apart (without --interval: the dumps' own time stamps, else file times)
  vllm-drift simulate --scenario kv-pressure --dump 60 | vllm-drift scan - --gpu L4
      a simulated server's /metrics on stdin
  (vllm-drift simulate --dump 60; vllm-drift simulate --dump 90) | vllm-drift scan -
      two time-stamped dumps on stdin are a pair: rates over the 30 s between them
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scan", help="diagnose vLLM servers or saved /metrics files once",
                       description="TARGET is a vLLM base URL (http://host:8000), a file holding /metrics "
                                   "text, or - for stdin. Prints the vLLM era, observed config and load, "
                                   "findings and recommendations, and what needs more data (a second "
                                   "snapshot for rates).",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="+", metavar="TARGET")
    p.add_argument("--after", metavar="FILE",
                   help="a later /metrics snapshot of the (single) file target, for rates")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help="seconds between the two snapshots (files: default from the dumps' time "
                        "stamps or file times; URLs: scrape twice this far apart)")
    hints = p.add_argument_group(
        "hints", "what the metrics cannot tell, as a targets[] entry of the config gives it (same names "
                 "and checks); each applies to every TARGET")
    hints.add_argument("--gpu", help="GPU catalog name of the target(s)")
    hints.add_argument("--tp", type=int, help="tensor-parallel size")
    hints.add_argument("--pp", type=int, help="pipeline-parallel size")
    hints.add_argument("--model", help="model id or config path, when the served name does not say")
    hints.add_argument("--quantization", metavar="SCHEME",
                       help="weight quantization, when the model's config does not say (fp8, awq, gptq, ...)")
    hints.add_argument("--max-num-seqs", type=int, metavar="N",
                       help="the server's --max-num-seqs (vLLM does not export it; otherwise read from a "
                            "plateau of the running count, else vLLM's default)")
    hints.add_argument("--max-num-batched-tokens", metavar="N",
                       help="the server's --max-num-batched-tokens, as vLLM reads it (16k, 16K)")
    hints.add_argument("--enforce-eager", action="store_true", default=None,
                       help="the server runs --enforce-eager (no CUDA graphs)")
    hints.add_argument("--data-parallel", dest="dp", type=int, metavar="N",
                       help="the server's --data-parallel-size (default: the engines its /metrics shows)")
    hints.add_argument("--enable-expert-parallel", dest="expert_parallel", action="store_true", default=None,
                       help="the server runs --enable-expert-parallel (whole MoE experts per GPU)")
    hints.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                       help="the server runs --[no-]async-scheduling (default: the release's, on from 0.14; "
                            "from 0.26 it sizes sliding-window requests for two batches in flight)")
    hints.add_argument("--limit-mm-per-prompt", metavar="JSON",
                       type=vllm_args.flag_type(vllm_args.mm_limits_label),
                       help="the server's --limit-mm-per-prompt (a multimodal model's startup profile "
                            "encodes what it allows)")
    hints.add_argument("--mm-processor-kwargs", dest="mm_max_pixels", metavar="JSON",
                       type=vllm_args.flag_type(vllm_args.mm_max_pixels),
                       help="the server's --mm-processor-kwargs (its max_pixels sizes the dummy image)")
    hints.add_argument("--skip-mm-profiling", action="store_true", default=None,
                       help="the server runs --skip-mm-profiling")
    hints.add_argument("--enable-lora", action="store_true", default=None,
                       help="the server runs --enable-lora (stacked adapter buffers beside every linear layer)")
    hints.add_argument("--max-loras", type=int, metavar="N", help="the server's --max-loras (default 1)")
    hints.add_argument("--max-lora-rank", type=int, metavar="R", help="the server's --max-lora-rank (default 16)")
    hints.add_argument("--cpu-offload-gb", metavar="GIB", type=vllm_args.flag_type(vllm_args.gib),
                       help="the server's --cpu-offload-gb (weights read over the host link every step)")
    hints.add_argument("--speculative-config", metavar="JSON",
                       type=vllm_args.flag_type(vllm_args.speculative_label),
                       help="the server's --speculative-config (an EAGLE head's, MTP layers' or draft "
                            "model's weights and KV pages come out of its pool)")
    hints.add_argument("--ttft-slo", metavar="SECONDS", help="TTFT p99 objective (0.5, 500ms)")
    hints.add_argument("--tpot-slo", metavar="SECONDS", help="TPOT p99 objective (0.05, 50ms)")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout per request (URLs)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--html", metavar="FILE", type=Path,
                   help="also write a self-contained HTML report: observed vs predicted per target "
                        "(needs the [report] extra: pip install 'vllm-drift[report]')")
    p.set_defaults(func=run)


# "10.0.0.5:8000" or "vllm-0:8000/": a server given without http://
HOST_PORT = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}/?$")


def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as fh:
            return fh.read()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and HOST_PORT.match(source):
            raise InputError(f"{source}: no such file, and a server URL needs its scheme: "
                             f"http://{source}") from None
        raise InputError(f"{source}: cannot read: {exc.strerror or exc}") from None


# hint flag -> the TargetSpec field it fills
HINT_FLAGS = {"gpu": "--gpu", "tp": "--tp", "pp": "--pp", "model": "--model", "quantization": "--quantization",
              "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
              "enforce_eager": "--enforce-eager", "dp": "--data-parallel",
              "expert_parallel": "--enable-expert-parallel", "async_scheduling": "--async-scheduling"}
SLO_FLAGS = {"ttft_p99": "--ttft-slo", "tpot_p99": "--tpot-slo"}
# hint flags that ride along as labels (as a pod's `vllm serve` arguments do: discovery/kubernetes.py)
LABEL_FLAGS = ("limit_mm_per_prompt", "mm_max_pixels", "skip_mm_profiling", "speculative_config", "cpu_offload_gb",
               "enable_lora", "max_loras", "max_lora_rank")


def hinted(args: argparse.Namespace) -> TargetSpec:
    """The hint flags as one target spec, checked as the config checks a targets[] entry (a TP
    below 1, an unknown quantization, `1.5K` tokens are refused naming the flag); its URL is a
    placeholder each target replaces."""
    # a flag not given is None (store_true hints too): False is a statement (--no-async-scheduling)
    data: dict[str, Any] = {k: getattr(args, k) for k in HINT_FLAGS if getattr(args, k) is not None}
    labels = {k: str(v).lower() if isinstance(v, bool) else str(v)
              for k in LABEL_FLAGS if (v := getattr(args, k, None)) is not None}
    if labels:
        data["labels"] = labels
    slo = {k: getattr(args, flag[2:].replace("-", "_")) for k, flag in SLO_FLAGS.items()}
    if any(v is not None for v in slo.values()):
        data["slo"] = {k: v for k, v in slo.items() if v is not None}
    try:
        return TargetSpec.model_validate({"url": "http://127.0.0.1", **data})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(part) for part in err["loc"]]
        flag = SLO_FLAGS.get(loc[-1]) if loc[0] == "slo" else HINT_FLAGS.get(loc[0], loc[0])
        raise InputError(f"{flag}: {describe_error(err).removeprefix(loc[-1] + ': ')}") from None


def _spec(url: str, hints: TargetSpec, source: str) -> TargetSpec:
    return hints.model_copy(update={"url": url, "source": source})


@dataclass
class Scanned:
    """One served model's report and what it was judged from."""

    report: ModelReport
    snapshots: int
    interval_s: float | None = None
    counter_reset: str | None = None          # what went backwards between the snapshots

    def to_json(self) -> dict[str, Any]:
        doc = self.report.to_json()
        need, reasons, unavailable = needs_more_data(doc)
        doc["needs_more_data"] = need
        doc["needs_more_data_reasons"] = reasons
        doc["unavailable"] = unavailable
        doc["input"] = {"snapshots": self.snapshots, "interval_seconds": self.interval_s,
                        "counter_reset": self.counter_reset}
        return doc


def reset_reason(prev: Snapshot, cur: Snapshot) -> str | None:
    """Which signal went backwards between two snapshots of one server (so rates cannot span
    them), in words; None when `cur` continues `prev`."""
    if not is_reset(prev, cur):
        return None
    if prev.engines != cur.engines:
        return f"the number of engines changed ({prev.engines} -> {cur.engines})"
    if prev.start_time is not None and cur.start_time is not None and cur.start_time != prev.start_time:
        return "the server restarted between the snapshots (its start time moved)"
    for key, value in sorted(cur.counters.items()):
        old = prev.counters.get(key)
        if old is not None and value < old:
            return f"counter {key} went back from {old:g} to {value:g}"
    for reason, value in sorted(cur.finished_by_reason.items()):
        old = prev.finished_by_reason.get(reason)
        if old is not None and value < old:
            return f"counter request_success_total{{finished_reason={reason}}} went back from {old:g} to {value:g}"
    for key, hist in sorted(cur.histograms.items()):
        old = prev.histograms.get(key)
        if old is not None and old.bounds != hist.bounds:
            return f"histogram {key} changed its buckets"
        if old is not None:
            return f"histogram {key} went back from {old.count:g} to {hist.count:g} observations"
    return "the snapshots are not of one continuous server"


def _evaluate(fleet: Pipelines, spec: TargetSpec, payloads: list[tuple[bytes, float]],
              metadata: Metadata | None) -> list[Scanned]:
    pipes: dict[str, TargetPipeline] = {}
    seen: dict[str, list[Snapshot]] = {}
    for body, ts in payloads:
        try:
            snaps = parse_vllm(body, target=spec.url, timestamp=ts)
        except ParseError as exc:
            raise InputError(f"{spec.url}: {exc}") from None
        for snap in snaps:
            if snap.model_name not in pipes:
                pipes[snap.model_name] = fleet.pipeline(spec, snap.model_name,
                                                        window_s=max(3600.0, ts - payloads[0][1] + 1))
            pipes[snap.model_name].observe(snap)
            seen.setdefault(snap.model_name, []).append(snap)
    now = payloads[-1][1]
    out = []
    for model, pipe in pipes.items():
        snaps = seen[model]
        reset = None
        for a, b in zip(snaps, snaps[1:]):
            why = reset_reason(a, b)
            if why:
                reset = (f"{why}: the earlier snapshot was set aside and the later one judged "
                         f"alone (no rates across a reset)")
        n = 1 if reset else len(snaps)
        interval = snaps[-1].timestamp - snaps[0].timestamp if n > 1 else None
        out.append(Scanned(pipe.evaluate(metadata, now), n, interval, reset))
    return out


async def _scan_url(url: str, args: argparse.Namespace, fleet: Pipelines, hints: TargetSpec) -> list[Scanned]:
    scraper = Scraper(timeout=args.timeout, concurrency=4)
    try:
        payloads = []
        rounds = 2 if args.interval else 1
        for i in range(rounds):
            if i:
                await asyncio.sleep(args.interval)
            try:
                fetched = await scraper.fetch(url + "/metrics")
            except ScrapeError as exc:
                raise InputError(f"{url}: {exc}") from None
            payloads.append((fetched.body, time.time()))
        metadata = await scraper.metadata(url)
    finally:
        await scraper.aclose()
    return _evaluate(fleet, _spec(url, hints, "scan"), payloads, metadata)


def _stamp(body: bytes) -> float | None:
    """The snapshot time a `simulate --dump` (or any exposition starting with the same comment)
    records on its first line."""
    head = body[:80].decode("ascii", "replace")
    if head.startswith(DUMP_STAMP):
        try:
            return float(head[len(DUMP_STAMP):].split("\n", 1)[0])
        except ValueError:
            return None
    return None


def _split_dumps(body: bytes) -> list[bytes]:
    """Time-stamped dumps concatenated in one input (`(simulate --dump 60; simulate --dump 90)
    | scan -`) are successive snapshots; anything else is one."""
    marker = DUMP_STAMP.encode()
    if not body.startswith(marker) or body.count(b"\n" + marker) == 0:
        return [body]
    parts, start = [], 0
    while True:
        nxt = body.find(b"\n" + marker, start + 1)
        if nxt < 0:
            parts.append(body[start:])
            return parts
        parts.append(body[start:nxt + 1])
        start = nxt + 1


def _scan_file(path: str, args: argparse.Namespace, fleet: Pipelines, hints: TargetSpec) -> list[Scanned]:
    bodies = _split_dumps(_read(path))
    if len(bodies) > 1:
        if args.after:
            raise InputError(f"{path}: holds {len(bodies)} time-stamped dumps already; drop --after")
        payloads = [(b, _stamp(b)) for b in bodies]
        for i, (_, ts) in enumerate(payloads[1:], 1):
            if ts is None or payloads[i - 1][1] is None or ts <= payloads[i - 1][1]:
                raise InputError(f"{path}: dump {i + 1} is not later than dump {i} by its time stamp")
        return _evaluate(fleet, _spec(path, hints, "file"), payloads, None)
    first = bodies[0]
    t1 = _stamp(first) or (os.path.getmtime(path) if path != "-" else time.time())
    payloads = [(first, t1)]
    if args.after:
        second = _read(args.after)
        if args.interval:
            t2 = t1 + args.interval
        else:
            t2 = _stamp(second) or os.path.getmtime(args.after)
            if t2 <= t1:
                raise InputError(f"--after {args.after}: not later than {path} by its time stamp or file "
                                 f"time; give --interval SECONDS")
        payloads.append((second, t2))
    return _evaluate(fleet, _spec(path, hints, "file"), payloads, None)


def run(args: argparse.Namespace) -> int:
    if args.after and len(args.targets) != 1:
        raise InputError("--after pairs with exactly one file TARGET")
    if args.interval is not None and args.interval <= 0:
        raise InputError("--interval must be positive")
    if args.html is not None:
        require_plotly()   # fail before the work, with the one-line hint
        if not args.html.parent.is_dir():
            raise InputError(f"--html {args.html}: directory {args.html.parent} does not exist")
    hints = hinted(args)
    fleet = Pipelines(Config(), one_shot=True)
    scanned: list[Scanned] = []
    for target in args.targets:
        if target.startswith(("http://", "https://")):
            try:
                url = check_url(target)
            except ValueError as exc:
                raise InputError(f"{target}: {exc}") from None
            if args.after:
                raise InputError("--after is for files; for a URL use --interval to scrape twice")
            scanned.extend(asyncio.run(_scan_url(url, args, fleet, hints)))
        else:
            scanned.extend(_scan_file(target, args, fleet, hints))
    doc = {"targets": [s.to_json() for s in scanned]}
    if args.html is not None:
        try:
            args.html.write_text(render_scan_report(doc), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--html {args.html}: cannot write ({exc.strerror})") from None
        print(f"vllm-drift scan: wrote {args.html}", file=sys.stderr)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_human(doc)
    sys.stdout.flush()
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


# the observed signals the table shows (all of them are in --json), in reading order
SHOWN = (
    ("load", ("num_requests_running", "num_requests_waiting", "kv_cache_usage", "kv_usage_max",
              "num_preemptions_total", "preemptions_per_s", "requests_per_s", "prompt_tokens_per_s",
              "generation_tokens_per_s", "prefix_cache_hit_ratio", "spec_decode_acceptance_rate")),
    ("latency", ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s",
                 "queue_time_p99_s", "latency_source")),
    ("config", ("max_model_len", "num_gpu_blocks", "block_size", "kv_cache_tokens",
                "gpu_memory_utilization", "enable_prefix_caching", "cache_dtype")),
    ("window", ("window_seconds", "window_samples")),
)
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def print_human(doc: dict[str, Any], console: Console | None = None) -> None:
    con = console or Console(soft_wrap=False)
    for t in doc["targets"]:
        inp = t.get("input") or {}
        n = inp.get("snapshots") or 1
        what = ("1 snapshot: instant verdicts only" if n == 1 else
                f"{n} snapshots {inp.get('interval_seconds') or 0:.0f} s apart: rates included")
        con.print()
        con.print(f"[bold]{escape(str(t['target']))}[/bold]  model [bold]{escape(str(t['model_name']))}[/bold]  "
                  f"vLLM {escape(str(t.get('vllm_version') or 'unknown'))} ({t.get('engine_era') or '?'} engine)  "
                  f"status {t.get('status')}  [dim]({what})[/dim]", highlight=False)
        if inp.get("counter_reset"):
            con.print(f"[yellow]counter reset:[/yellow] {escape(inp['counter_reset'])}", highlight=False)
        obs = t.get("observed") or {}
        table = Table(title="observed", title_justify="left", box=box.SIMPLE, show_header=False,
                      pad_edge=False)
        table.add_column("group", style="dim")
        table.add_column("signal")
        table.add_column("value", justify="right")
        shown = 0
        for group, keys in SHOWN:
            first = True
            for k in keys:
                if obs.get(k) is None:
                    continue
                table.add_row(group if first else "", k, _fmt(obs[k]))
                first = False
                shown += 1
        if shown:
            con.print(table)
            rest = sum(1 for v in obs.values() if v is not None) - shown
            if rest > 0:
                con.print(f"  [dim]{rest} more observed signals in --json[/dim]")
        findings = [f for f in t.get("findings") or []
                    if f["finding"] not in ("insufficient_data", "unavailable")]
        if findings:
            confident = any(f.get("confidence") is not None for f in findings)
            ft = Table(title="findings", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
            ft.add_column("severity", no_wrap=True)
            ft.add_column("finding", no_wrap=True)
            ft.add_column("score", justify="right", no_wrap=True)
            if confident:
                ft.add_column("confidence", justify="right", no_wrap=True)
            ft.add_column("change")
            for f in findings:
                change = "-"
                if f.get("parameter"):
                    change = f"{f['parameter']}: {_fmt(f.get('configured'))} -> {_fmt(f.get('recommended'))}"
                row = [f"[{SEVERITY_STYLE.get(f['severity'], '')}]{f['severity']}[/]", f["finding"],
                       f"{f['score']:.2f}"]
                if confident:
                    conf = f.get("confidence")
                    row.append("-" if conf is None else f"{conf:.2f}")
                ft.add_row(*row, escape(change))
            con.print(ft)
            for f in findings:
                if f.get("explanation"):
                    con.print(f"  [bold]{f['finding']}[/bold]: {escape(f['explanation'])}", highlight=False)
        else:
            con.print("  findings: none")
        need, reasons = t.get("needs_more_data") or [], t.get("needs_more_data_reasons") or {}
        if need:
            by_reason: dict[str, list[str]] = {}
            for name in need:
                why = reasons.get(name) or ("a second snapshot (rates)" if n == 1 else "more data")
                by_reason.setdefault(why, []).append(name)
            nt = Table(title="needs more data", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
            nt.add_column("findings")
            nt.add_column("why")
            for why, names in by_reason.items():
                nt.add_row(", ".join(names), escape(why))
            con.print(nt)
            if n == 1:
                con.print("  [dim]for rates: --interval SECONDS (URLs), --after FILE (files), or two "
                          "time-stamped dumps on stdin[/dim]")
        for name, why in (t.get("unavailable") or {}).items():
            con.print(f"  [dim]unavailable: {name}: {escape(why)}[/dim]", highlight=False)
