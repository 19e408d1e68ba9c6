"""`vllm-drift sweep URL`: measure a live OpenAI-compatible server's saturation knee.

Why a command: the daemon only watches a server; this measures one, in minutes and bounded, and
writes what it measured as calibration rows for the model (`calc --calibrate`). Levels of
concurrency (default 1, 2, 4, ... doubling until the knee or --max-concurrency) or of Poisson
--rate; per level TTFT/TPOT/ITL with `vllm bench serve`'s definitions, the server's /metrics
(KV usage, running/waiting, preemptions) read during the level, and the knee by a stated rule.
Safe by construction: every level is capped in requests, seconds and concurrency; a level with a
failed request stops the sweep; Ctrl-C stops at once and writes what was measured.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from exporter.errors import InputError
from exporter.loadgen import calibration
from exporter.loadgen.client import Api
from exporter.loadgen.prediction import calibrated, calibration_lines, predictions
from exporter.loadgen.report import render as render_report
from exporter.loadgen.runner import HARD_MAX_CONCURRENCY, SweepConfig, run_sweep
from exporter.loadgen.stats import KNEE_GAIN, find_knee

KNEE_RULE = (f"Knee rule: the first level whose next level adds less than {KNEE_GAIN * 100:.0f} % output "
             "throughput per doubling of load, or the last level before one whose TTFT/TPOT p99 "
             "breaks --ttft-slo/--tpot-slo.")


def _levels(text: str, flag: str, cast) -> list:
    try:
        vals = [cast(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(f"{flag}: cannot read {text!r} (expected a comma-separated list of numbers)") from None
    if not vals or any(not v > 0 for v in vals):
        raise InputError(f"{flag}: levels must be positive numbers (got {text!r})")
    if sorted(set(vals)) != vals:
        raise InputError(f"{flag}: levels must be increasing (got {text!r})")
    return vals


def _seconds(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a duration (e.g. 2s, 80ms, 0.08)")
    v = float(m.group(1))
    return v / 1e3 if m.group(2) == "ms" else v


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep", help="measure a live server's saturation knee (bounded load levels) and write calibration rows",
        description=__doc__.split("\n\n")[0])
    p.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    lv = p.add_argument_group("levels")
    lv.add_argument("--concurrency", metavar="LIST", help="closed-loop levels, e.g. 1,4,16 (default: 1,2,4,... "
                    "doubling until the knee or --max-concurrency)")
    lv.add_argument("--rate", metavar="LIST", help="open-loop Poisson levels in requests/s, e.g. 0.5,1,2,4")
    lv.add_argument("--max-concurrency", type=int, default=256, metavar="N",
                    help=f"cap on requests in flight (default 256, at most {HARD_MAX_CONCURRENCY})")
    lv.add_argument("--max-requests", type=int, default=100, metavar="N", help="measured requests per level (default 100)")
    lv.add_argument("--max-duration", type=float, default=15.0, metavar="S",
                    help="seconds per level, warm-up included; sending stops then and requests in flight "
                         "finish (default 15)")
    lv.add_argument("--warmup", type=int, default=None, metavar="N",
                    help="unmeasured requests at the start of each level (default: one per client, or one "
                         "second of arrivals)")
    lv.add_argument("--settle", type=float, default=1.0, metavar="S", help="pause between levels (default 1)")
    lv.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per-request timeout (default 300)")
    w = p.add_argument_group("requests")
    w.add_argument("--prompt-tokens", type=int, default=256, metavar="N", help="prompt length (default 256)")
    w.add_argument("--output-tokens", type=int, default=128, metavar="N", help="output length (default 128)")
    w.add_argument("--range-ratio", type=float, default=0.0, metavar="R",
                   help="spread: lengths uniform in [N(1-R), N(1+R)] (default 0, exact)")
    w.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (token-id prompts, default) or /v1/chat/completions")
    w.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (outputs may stop early; for servers that reject it)")
    w.add_argument("--seed", type=int, default=0, help="random seed for lengths, prompts and arrivals")
    h = p.add_argument_group("hints (what the server cannot tell)")
    h.add_argument("--model", metavar="ID", help="model id for the CSV and the prediction (default: from /v1/models)")
    h.add_argument("--gpu", metavar="NAME", help="GPU name (catalog name or alias)")
    h.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel size (default 1)")
    h.add_argument("--dtype", default="bf16", metavar="D", help="weights dtype for the CSV (default bf16)")
    h.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="the server's max_num_seqs, for the model's prediction (default: vLLM's default)")
    s = p.add_argument_group("SLO (optional; a level that breaks it ends the sweep's useful range)")
    s.add_argument("--ttft-slo", type=_seconds, metavar="S", help="TTFT p99 objective (e.g. 2s, 500ms)")
    s.add_argument("--tpot-slo", type=_seconds, metavar="S", help="TPOT p99 objective (e.g. 80ms)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON document (levels, knee, server)")
    o.add_argument("--out", metavar="FILE.csv", help="write calibration rows (throughput-observations columns)")
    o.add_argument("--html", metavar="FILE", help="write a self-contained HTML report with plots")
    o.add_argument("--save-metrics", metavar="DIR",
                   help="write the server's /metrics text at each level's measured start and end "
                        "(DIR/<level>-start.prom, DIR/<level>-end.prom), to check the sweep against")
    p.set_defaults(func=run)


def _base(url: str) -> str:
    u = url.strip().rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    if not re.match(r"^https?://[^/\s]+", u):
        raise InputError(f"URL {url!r}: expected http(s)://host:port")
    return u


def probe(base: str) -> dict[str, Any]:
    """What /v1/models (and /version, if any) say; InputError when /v1/models does not answer."""
    try:
        r = httpx.get(base + "/v1/models", timeout=5.0)
    except httpx.HTTPError as exc:
        raise InputError(f"{base}: does not answer /v1/models ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise InputError(f"{base}: /v1/models answered HTTP {r.status_code}, not an OpenAI-compatible server")
    try:
        data = r.json()["data"]
        first = data[0]
        served = str(first["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise InputError(f"{base}: /v1/models did not list a model") from None
    root = first.get("root") if isinstance(first, dict) else None
    version = ""
    try:
        v = httpx.get(base + "/version", timeout=5.0)
        if v.status_code == 200:
            version = str(v.json().get("version", ""))
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return {"served": served, "root": root, "max_model_len": first.get("max_model_len"), "version": version}


def _model_id(hint: str | None, info: dict[str, Any]) -> str:
    if hint:
        return hint
    root = info.get("root")
    if isinstance(root, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", root):
        return root                         # a Hugging Face id (not a local path)
    return info["served"]


def _gpu_name(gpu: str | None) -> str:
    if not gpu:
        return ""
    from exporter.model import resolve_gpu
    try:
        return resolve_gpu(gpu).name
    except InputError:
        return gpu


def config_from(args: argparse.Namespace, base: str, served: str) -> SweepConfig:
    if args.concurrency and args.rate:
        raise InputError("--concurrency and --rate exclude each other")
    if not 1 <= args.max_concurrency <= HARD_MAX_CONCURRENCY:
        raise InputError(f"--max-concurrency must be in 1..{HARD_MAX_CONCURRENCY} (got {args.max_concurrency})")
    conc = _levels(args.concurrency, "--concurrency", int) if args.concurrency else None
    rates = _levels(args.rate, "--rate", float) if args.rate else None
    if conc and conc[-1] > args.max_concurrency:
        raise InputError(f"--concurrency {conc[-1]} exceeds --max-concurrency {args.max_concurrency}")
    for name in ("max_requests", "prompt_tokens", "output_tokens"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if not args.max_duration > 0 or not args.timeout > 0 or args.settle < 0:
        raise InputError("--max-duration and --timeout must be positive, --settle not negative")
    if not 0 <= args.range_ratio < 1:
        raise InputError(f"--range-ratio must be in [0, 1) (got {args.range_ratio})")
    if args.warmup is not None and args.warmup < 0:
        raise InputError(f"--warmup must not be negative (got {args.warmup})")
    if args.tp < 1:
        raise InputError(f"--tp must be >= 1 (got {args.tp})")
    api = Api(base, served, chat=args.endpoint == "chat", ignore_eos=not args.no_ignore_eos)
    on_metrics = None
    if args.save_metrics:
        out_dir = Path(args.save_metrics)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--save-metrics {args.save_metrics}: {exc.strerror}") from None
        key = "rate" if rates else "concurrency"

        def on_metrics(level: float, first: str | None, last: str | None) -> None:
            for tag, text in (("start", first), ("end", last)):
                if text is not None:
                    (out_dir / f"{key}-{level:g}-{tag}.prom").write_text(text, encoding="utf-8")
    return SweepConfig(on_metrics=on_metrics, api=api, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                       range_ratio=args.range_ratio, concurrency=conc, rates=rates,
                       max_concurrency=args.max_concurrency, max_requests=args.max_requests,
                       max_duration=args.max_duration, warmup=args.warmup, settle_s=args.settle,
                       timeout_s=args.timeout, ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo, seed=args.seed)


class _Bar:
    """One rich progress bar per level, on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self.tasks: dict[str, Any] = {}

    def __call__(self, label: str, done: int, total: int, finished: bool) -> None:
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(label, total=total)
        self.progress.update(self.tasks[label], completed=done)
        if finished:
            self.progress.stop_task(self.tasks[label])


def run(args: argparse.Namespace) -> int:
    base = _base(args.url)
    info = probe(base)
    cfg = config_from(args, base, info["served"])
    model = _model_id(args.model, info)
    gpu = _gpu_name(args.gpu)
    if args.html:
        from exporter.reports.html import require_plotly
        require_plotly()                   # fail before measuring, not after
    bar = _Bar()
    stop = asyncio.Event()

    async def main():
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop.set)
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
        try:
            return await run_sweep(cfg, stop=stop, progress=bar)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass

    started = time.time()
    with bar.progress:
        result = asyncio.run(main())
    key = cfg.key
    doc = {
        "server": {"url": base, "model": model, "served_model_name": info["served"], "gpu": gpu or None,
                   "tp": args.tp, "dtype": args.dtype, "version": info["version"] or None},
        "workload": {"endpoint": args.endpoint, "prompt_tokens": args.prompt_tokens,
                     "output_tokens": args.output_tokens, "range_ratio": args.range_ratio,
                     "ignore_eos": not args.no_ignore_eos},
        "level_key": key,
        "levels": result.levels,
        "knee": result.knee.as_dict(key) if result.knee else None,
        "knee_rule": KNEE_RULE,
        "slo": {"ttft_p99_s": args.ttft_slo, "tpot_p99_s": args.tpot_slo},
        "stopped": result.stopped or None,
        "interrupted": result.interrupted,
        "started_at": started,
        "duration_s": round(time.time() - started, 3),
    }
    if args.out:
        rows = calibration.rows(result.levels, model=model, gpu=gpu, tp=args.tp, dtype=args.dtype,
                                source=f"vllm-drift sweep {base}", engine_version=info["version"], key=key)
        calibration.write(args.out, rows)
    doc["prediction"] = _prediction(doc, args.max_num_seqs)
    if args.html:
        Path(args.html).write_text(render_report(doc, doc["prediction"]["points"], doc["prediction"]["note"]),
                                   encoding="utf-8")
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_table(doc)
    if result.interrupted:
        return 130
    return 1 if result.levels and result.levels[-1].get("failed") else 0


def _prediction(doc: dict[str, Any], max_num_seqs: int | None) -> dict[str, Any]:
    """The calculator's prediction at the measured levels and, for a smooth curve, between them."""
    key = doc["level_key"]
    done = [lv for lv in doc["levels"] if lv.get("completed")]
    if not done:
        return {"note": "no prediction: no level completed", "points": []}
    prompt = sum(lv.get("prompt_tokens_mean") or doc["workload"]["prompt_tokens"] for lv in done) / len(done)
    output = sum(lv.get("output_tokens_mean") or doc["workload"]["output_tokens"] for lv in done) / len(done)
    lo, hi = done[0][key], done[-1][key]
    xs = {lv[key] for lv in done}
    if key == "concurrency" and hi > lo:    # four points per doubling
        xs |= {int(round(lo * 2 ** (i / 4))) for i in range(int(4 * math.log2(hi / lo)) + 1)}
    s = doc["server"]
    points, note = predictions(s["model"], s["gpu"], s["tp"], prompt, output, sorted(xs), key=key,
                               max_num_seqs=max_num_seqs)
    measured = {lv[key] for lv in done}
    at_levels = [{key: p["x"], "output_tokens_per_s": p["output_tokens_per_s"]} for p in points if p["x"] in measured]
    knee = find_knee(at_levels, key) if at_levels else None
    cal = calibrated(s["model"], s["gpu"], s["tp"], done, sorted(xs), max_num_seqs=max_num_seqs,
                     version=s.get("version")) if key == "concurrency" and points else None
    return {"note": note, "points": points, "knee": knee.as_dict(key) if knee else None, "calibrated": cal}


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    key = doc["level_key"]
    s = doc["server"]
    t = Table(title=f"{s['model']} at {s['url']} ({s['tp']} x {s['gpu'] or 'GPU ?'})")
    t.add_column(key, justify="right", no_wrap=True)
    for col in ("ok/fail", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
                "ITL p99 ms", "KV mean/max", "run/wait max", "preempt"):
        t.add_column(col, justify="right")
    knee = doc.get("knee")
    for lv in doc["levels"]:
        def ms(f: str, nd: int = 1) -> str:
            v = lv.get(f)
            return "-" if v is None else f"{v * 1e3:.{nd}f}"

        def pct(f: str) -> str:
            v = lv.get(f)
            return "-" if v is None else f"{v * 100:.0f}%"

        def num(f: str) -> str:
            v = lv.get(f)
            return "-" if v is None else f"{v:.0f}"
        tput = lv.get("output_tokens_per_s")
        t.add_row(f"{lv[key]:g}", f"{lv['completed']}/{lv['failed']}", "-" if tput is None else f"{tput:.1f}",
                  ms("ttft_p50_s"), ms("ttft_p99_s"), ms("tpot_p50_s", 2), ms("tpot_p99_s", 2), ms("itl_p99_s", 2),
                  f"{pct('kv_usage_mean')}/{pct('kv_usage_max')}", f"{num('running_max')}/{num('waiting_max')}",
                  num("preemptions"), style="bold green" if knee and lv[key] == knee[key] else None)
    con = Console()
    if not con.is_terminal:
        con = Console(width=max(con.width, 132))
    con.print(t)
    if knee:
        con.print(f"knee at {key} {knee[key]:g}: {knee['detail']}", highlight=False)
    elif doc.get("stopped"):
        con.print("no knee found before the sweep stopped", highlight=False)
    else:
        con.print("no knee: throughput still grows by at least 10 % per doubling at the last level", highlight=False)
    con.print(KNEE_RULE, style="dim", highlight=False)
    for line in calibration_lines(doc.get("prediction") or {}):
        con.print(line, highlight=False)
    if doc.get("stopped"):
        con.print(f"stopped early: {doc['stopped']}", style="yellow", highlight=False)
