"""`vllm-drift scan`: a one-shot diagnosis of vLLM servers or saved `/metrics` files."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from exporter.commands.simulate import DUMP_STAMP
from exporter.config import Config, TargetSpec, check_url
from exporter.errors import InputError, ParseError, ScrapeError
from exporter.parse import parse_vllm
from exporter.parse.metadata import Metadata
from exporter.pipeline import Pipelines, TargetPipeline
from exporter.report import ModelReport
from exporter.scrape import Scraper


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scan", help="diagnose vLLM servers or saved /metrics files once",
                       description="TARGET is a vLLM base URL (http://host:8000), a file holding /metrics "
                                   "text, or - for stdin. Prints the vLLM era, observed config and load, "
                                   "findings and recommendations.")
    p.add_argument("targets", nargs="+", metavar="TARGET")
    p.add_argument("--after", metavar="FILE",
                   help="a later /metrics snapshot of the (single) file target, for rates")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help="seconds between the two snapshots (files: default from file times; "
                        "URLs: scrape twice this far apart)")
    p.add_argument("--gpu", help="GPU catalog name of the target(s)")
    p.add_argument("--tp", type=int, help="tensor-parallel size")
    p.add_argument("--model", help="model id or config path, when the served name does not say")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout per request (URLs)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InputError(f"{source}: cannot read: {exc.strerror or exc}") from None


def _spec(url: str, args: argparse.Namespace, source: str) -> TargetSpec:
    return TargetSpec.model_construct(url=url, name=None, gpu=args.gpu, tp=args.tp, pp=None, model=args.model,
                                      quantization=None, max_num_seqs=None, max_num_batched_tokens=None,
                                      slo=None, labels={}, source=source)


def _evaluate(fleet: Pipelines, spec: TargetSpec, payloads: list[tuple[bytes, float]],
              metadata: Metadata | None) -> list[ModelReport]:
    pipes: dict[str, TargetPipeline] = {}
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
    now = payloads[-1][1]
    return [p.evaluate(metadata, now) for p in pipes.values()]


async def _scan_url(url: str, args: argparse.Namespace, fleet: Pipelines) -> list[ModelReport]:
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
    return _evaluate(fleet, _spec(url, args, "scan"), payloads, metadata)


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


def _scan_file(path: str, args: argparse.Namespace, fleet: Pipelines) -> list[ModelReport]:
    first = _read(path)
    t1 = _stamp(first) or (os.path.getmtime(path) if path != "-" else time.time())
    payloads = [(first, t1)]
    if args.after:
        second = _read(args.after)
        if args.interval:
            t2 = t1 + args.interval
        else:
            t2 = _stamp(second) or os.path.getmtime(args.after)
            if t2 <= t1:
                raise InputError(f"--after {args.after}: not later than {path} by file time; give --interval SECONDS")
        payloads.append((second, t2))
    return _evaluate(fleet, _spec(path, args, "file"), payloads, None)


def run(args: argparse.Namespace) -> int:
    if args.after and len(args.targets) != 1:
        raise InputError("--after pairs with exactly one file TARGET")
    if args.interval is not None and args.interval <= 0:
        raise InputError("--interval must be positive")
    fleet = Pipelines(Config(), one_shot=True)
    reports: list[ModelReport] = []
    for target in args.targets:
        if target.startswith(("http://", "https://")):
            try:
                url = check_url(target)
            except ValueError as exc:
                raise InputError(f"{target}: {exc}") from None
            if args.after:
                raise InputError("--after is for files; for a URL use --interval to scrape twice")
            reports.extend(asyncio.run(_scan_url(url, args, fleet)))
        else:
            reports.extend(_scan_file(target, args, fleet))
    doc = {"targets": [r.to_json() for r in reports]}
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_human(doc)
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


def print_human(doc: dict[str, Any]) -> None:
    out = sys.stdout
    for t in doc["targets"]:
        out.write(f"\n{t['target']}  model={t['model_name']}  vLLM {t.get('vllm_version') or 'unknown'} "
                  f"({t.get('engine_era') or '?'} engine)  status={t.get('status')}\n")
        obs = t.get("observed") or {}
        rows = [(k, _fmt(v)) for k, v in obs.items() if v is not None]
        if rows:
            width = max(len(k) for k, _ in rows)
            out.write("  observed\n")
            for k, v in rows:
                out.write(f"    {k:<{width}}  {v}\n")
        findings = t.get("findings") or []
        waiting = {}
        for name, st in (t.get("finding_status") or {}).items():
            if st.get("status") != "ok":
                waiting.setdefault(f"{st['status']}: {st.get('reason') or '-'}", []).append(name)
        for why, names in waiting.items():      # what is not judged, and why (drift engine statuses)
            out.write(f"  not judged ({', '.join(names)}): {why}\n")
        if not findings:
            out.write("  findings: none\n")
            continue
        out.write("  findings\n")
        head = ("severity", "score", "finding", "parameter", "configured", "recommended")
        cells = [head] + [(f["severity"], f"{f['score']:.2f}", f["finding"], f.get("parameter") or "-",
                           _fmt(f.get("configured")), _fmt(f.get("recommended"))) for f in findings]
        widths = [max(len(str(r[i])) for r in cells) for i in range(len(head))]
        for row in cells:
            out.write("    " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
        for f in findings:
            if f.get("explanation"):
                out.write(f"    - {f['finding']}: {f['explanation']}\n")
