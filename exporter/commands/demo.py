"""`vllm-drift demo`: the product in one command, without a GPU. Starts one simulated vLLM server
per scenario on loopback (each with a known misconfiguration, plus a healthy one), runs the
drift daemon against them with short windows, prints the URLs and a findings table that
refreshes, and stops on Ctrl-C or after `--duration`.

The daemon gets the hints a real deployment would give it in its config (GPU, TP, model), since
those cannot be read from `/metrics`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from exporter.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="simulated fleet + drift daemon on loopback, with a live findings table",
        description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=None,
                   help="comma-separated scenario names or files (default: all built-ins)")
    p.add_argument("--listen", default="127.0.0.1:9877",
                   help="daemon address (default 127.0.0.1:9877; port 0 = any free port)")
    p.add_argument("--port", type=int, default=0,
                   help="first port of the simulated servers (default 0 = free ports)")
    p.add_argument("--vllm-version", default=None, help="exposition era of the simulated servers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=None, help="sim seconds per wall second")
    p.add_argument("--window", type=float, default=60.0, help="evaluation window, s (default 60)")
    p.add_argument("--refresh", type=float, default=5.0, help="table refresh, s (default 5)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: run until Ctrl-C)")
    p.set_defaults(func=run)


def _config_text(urls: list[str], states, listen: str, window: float) -> str:
    lines = [f"listen: {listen}",
             "scrape: {interval: 2s, timeout: 2s}",
             f"evaluation: {{interval: 5s, window: {int(window)}s}}",
             "targets:"]
    for url, st in zip(urls, states):
        sc = st.scenario
        lines += [f"  - url: {url}", f"    name: {sc.name}", f"    gpu: {sc.gpu}", f"    tp: {sc.tp}",
                  f"    model: {sc.model}",
                  f"    max_num_seqs: {st.engine.cfg.max_num_seqs}",
                  f"    max_num_batched_tokens: {st.engine.cfg.max_num_batched_tokens}"]
    return "\n".join(lines) + "\n"


def _table(data: dict, names: dict[str, str], truth: dict[str, tuple], elapsed: float) -> str:
    rows = [f"vllm-drift demo — {elapsed:5.0f} s — findings at warning or above (ground truth in brackets)",
            f"{'scenario':28s} {'findings':60s} truth"]
    by_target = {t.get("target", "").rstrip("/"): t for t in data.get("targets", [])}
    for url, name in names.items():
        t = by_target.get(url, {})
        found = [f"{f.get('finding')}({f.get('severity')}, {float(f.get('score') or 0):.2f})"
                 for f in t.get("findings") or []
                 if str(f.get("severity", "")).lower() in ("warning", "critical")]
        shown = ", ".join(found) or ("—" if t else "(not evaluated yet)")
        rows.append(f"{name:28s} {shown[:60]:60s} [{', '.join(truth[url]) or 'none'}]")
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    from exporter import logs
    from exporter.config import build_config
    from exporter.daemon import Daemon
    from exporter.sim.scenario import build, builtin_names, load_scenario
    from exporter.sim.server import Endpoint, serve

    names = [s.strip() for s in args.scenarios.split(",")] if args.scenarios else \
        builtin_names()
    if not names or not all(names):
        raise InputError("--scenarios: give at least one scenario name")
    if args.window < 5:
        raise InputError(f"--window must be at least 5 s (got {args.window})")
    now = time.time()
    states = []
    for i, n in enumerate(names):
        sc = load_scenario(n)
        states.append(build(sc, seed=args.seed + i, version=args.vllm_version, speed=args.speed,
                            start_time=now - sc.warmup_s))
    ports = [0 if args.port == 0 else args.port + i for i in range(len(states))]
    bindings = [("127.0.0.1", p, Endpoint(st)) for p, st in zip(ports, states)]
    logs.configure("console", "warning")
    interactive = sys.stdout.isatty()

    async def main() -> None:
        import httpx

        sim_stop = asyncio.Event()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        sim = asyncio.create_task(serve(bindings, states, tick_s=0.25, stop=sim_stop,
                                        on_ready=lambda urls: ready.set_result(urls)))
        urls = await asyncio.wait_for(ready, 30)
        cfg_file = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="vllm-drift-demo-",
                                               delete=False)
        try:
            cfg_file.write(_config_text(urls, states, args.listen, args.window))
            cfg_file.close()
            cfg = build_config(cfg_file.name)
            daemon = Daemon(cfg, config_path=cfg_file.name)
            port: asyncio.Future = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(daemon.run(duration=args.duration,
                                                  on_listen=lambda p: port.set_result(p)))
            done, _ = await asyncio.wait({task, port}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                await task                      # surfaces a listen error
                return
            dport = port.result()
            host = args.listen.rsplit(":", 1)[0]
            base = f"http://{host}:{dport}"
            print("simulated vLLM servers:")
            for u, st in zip(urls, states):
                print(f"  {st.scenario.name:28s} {u}/metrics")
            print(f"daemon metrics:   {base}/metrics")
            print(f"daemon findings:  {base}/api/v1/findings", flush=True)
            names_by_url = {u: st.scenario.name for u, st in zip(urls, states)}
            truth = {u: st.scenario.ground_truth for u, st in zip(urls, states)}
            t0 = time.monotonic()
            async with httpx.AsyncClient(timeout=5.0) as client:
                while not task.done():
                    await asyncio.wait({task}, timeout=args.refresh)
                    try:
                        data = (await client.get(base + "/api/v1/findings")).json()
                    except (httpx.HTTPError, ValueError):
                        continue
                    text = _table(data, names_by_url, truth, time.monotonic() - t0)
                    if interactive:
                        print("\x1b[2J\x1b[H" + text, flush=True)
                    else:
                        print(text + "\n", flush=True)
            await task
        finally:
            sim_stop.set()
            await sim
            try:
                os.unlink(cfg_file.name)
            except OSError:
                pass

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"vllm-drift demo: error: {exc}", file=sys.stderr)
        return 1
    return 0
