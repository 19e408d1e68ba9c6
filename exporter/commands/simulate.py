"""`vllm-drift simulate`: one simulated vLLM server (or a fleet of them) on loopback, serving
`/metrics`, `/v1/models`, `/version` and `/health` like a real server of the chosen version.

Default `--vllm-version` is 0.11.0: the newest era checked against a complete real capture
(`../shared/fixtures/prom/vllm-0.11.0-*.prom`); 0.7 (V0), 0.10.1 and 0.32/0.33 are available too,
other versions map to the nearest era. Default `--speed` is the scenario's (1.0 for the
built-ins: sim time = wall time, after a warm-up so problems show from the first scrape).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import resource
import signal
import sys
import time

from exporter.errors import InputError

log = logging.getLogger("vllm_drift.sim")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="run a simulated vLLM server (or fleet) with a known misconfiguration",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000,
                   help="port to listen on (fleet: first port, consecutive; 0 = any free ports)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--scenario", default="healthy",
                   help="built-in scenario name or path to a scenario YAML (default healthy)")
    p.add_argument("--vllm-version", default=None,
                   help="vLLM version whose /metrics to emit (default: the scenario's, 0.11.0)")
    p.add_argument("--model", default=None, help="model id (overrides the scenario's)")
    p.add_argument("--gpu", default=None, help="GPU name (overrides the scenario's)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same run)")
    p.add_argument("--speed", type=float, default=None,
                   help="sim seconds per wall second (default: the scenario's, 1.0)")
    p.add_argument("--fleet", type=int, default=None, metavar="N",
                   help="serve N simulated targets (cycling through the built-in scenarios)")
    p.add_argument("--fleet-config", default=None, metavar="FILE",
                   help="fleet YAML: targets, engines, scenarios, vllm_versions, seed")
    p.add_argument("--fleet-engines", type=int, default=None, metavar="K",
                   help="distinct simulated engines behind the fleet's targets (default 16)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: run until SIGINT/SIGTERM)")
    p.add_argument("--list-scenarios", action="store_true", help="list built-in scenarios and exit")
    p.add_argument("--step-time-scale", type=float, default=None, metavar="S",
                   help="true step times are S x the calculator's (default: the scenario's, 1.0); "
                        "the exposition does not say so: a server the model must learn")
    p.add_argument("--data-parallel", type=int, default=None, metavar="N",
                   help="run N engine cores behind the server, as vLLM's --data-parallel-size "
                        "(default: the scenario's vllm.data_parallel_size, 1); each gets 1/N of "
                        "the traffic and its own max_num_seqs and KV pool")
    p.add_argument("--dump", type=float, default=None, metavar="S",
                   help="print the /metrics text after S simulated seconds (after warm-up) and "
                        "exit, without serving (e.g. `... --dump 60 | vllm-drift scan -`)")
    p.set_defaults(func=run)


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, needed)) if hard != resource.RLIM_INFINITY else max(soft, needed)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


# `--dump` output: the simulated server started at this time (2026-01-01T00:00:00Z) minus its
# warm-up, and its first line is a comment with the simulated time of the snapshot.
DUMP_EPOCH = 1_767_225_600.0
DUMP_STAMP = "# vllm-drift simulate dump: time"


def _with_overrides(sc, scale: float | None, dp: int | None = None):
    """The scenario with the command line's --step-time-scale and --data-parallel applied."""
    from exporter.sim.scenario import MAX_DP, with_data_parallel
    if scale is not None:
        if not (0.01 <= scale <= 100):
            raise InputError(f"--step-time-scale must be in [0.01, 100] (got {scale})")
        sc = dataclasses.replace(sc, step_time_scale=scale)
    if dp is not None:
        if not 1 <= dp <= MAX_DP:
            raise InputError(f"--data-parallel must be in [1, {MAX_DP}] (got {dp})")
        sc = with_data_parallel(sc, dp)
    return sc


def run(args: argparse.Namespace) -> int:
    from exporter.sim import fleet as fleet_mod
    from exporter.sim.scenario import build, builtin_names, load_scenario
    from exporter.sim.server import Endpoint, serve

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.list_scenarios:
        for name in builtin_names():
            sc = load_scenario(name)
            print(f"{name:28s} {', '.join(sc.ground_truth) or '(none)'}")
        return 0
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port: {args.port} is not a port number")
    if args.speed is not None and not args.speed > 0:
        raise InputError(f"--speed must be positive (got {args.speed})")
    if args.duration is not None and args.duration < 0:
        raise InputError(f"--duration must not be negative (got {args.duration})")
    now = time.time()
    if args.dump is not None:
        if args.dump < 0:
            raise InputError(f"--dump must not be negative (got {args.dump})")
        sc = _with_overrides(load_scenario(args.scenario), args.step_time_scale, args.data_parallel)
        # a fixed clock, so that dumps of one seed at different lengths are snapshots of one run
        # (same start time, counters growing) that `scan A --after B` can pair without --interval
        start = DUMP_EPOCH - sc.warmup_s
        st = build(sc, seed=args.seed, version=args.vllm_version, model=args.model, gpu=args.gpu,
                   speed=1.0, start_time=start)
        st.advance(sc.warmup_s + args.dump)
        sys.stdout.write(f"{DUMP_STAMP} {start + sc.warmup_s + args.dump:.3f}\n")
        sys.stdout.write(st.exposition())
        return 0
    fleet_n = args.fleet
    if args.fleet_config or fleet_n:
        if args.data_parallel is not None:
            raise InputError("--data-parallel applies to one simulated server; a fleet's scenarios "
                             "set vllm.data_parallel_size themselves")
        if args.fleet_config:
            spec = fleet_mod.load_fleet_config(args.fleet_config)
        else:
            if fleet_n < 1:
                raise InputError(f"--fleet must be at least 1 (got {fleet_n})")
            spec = fleet_mod.FleetSpec(targets=fleet_n)
        spec = fleet_mod.FleetSpec(
            targets=spec.targets,
            engines=args.fleet_engines or spec.engines,
            scenarios=spec.scenarios or ((args.scenario,) if args.scenario != "healthy" else ()),
            vllm_versions=spec.vllm_versions or ((args.vllm_version,) if args.vllm_version else ()),
            seed=spec.seed if args.fleet_config else args.seed,
            speed=args.speed or spec.speed)
        states, endpoints = fleet_mod.build_fleet(spec, start_time=now)
        ports = [0 if args.port == 0 else args.port + i for i in range(len(endpoints))]
        if ports and ports[-1] > 65535:
            raise InputError(f"--port {args.port} + {len(endpoints)} targets exceeds port 65535")
        _raise_fd_limit(len(endpoints) * 3 + 256)
        bindings = [(args.host, p, ep) for p, ep in zip(ports, endpoints)]
        tick = 1.0
    else:
        sc = _with_overrides(load_scenario(args.scenario), args.step_time_scale, args.data_parallel)
        st = build(sc, seed=args.seed, version=args.vllm_version, model=args.model, gpu=args.gpu,
                   speed=args.speed, start_time=now - sc.warmup_s)
        states = [st]
        bindings = [(args.host, args.port, Endpoint(st))]
        tick = 0.25
        dp = sc.flags.data_parallel_size
        log.info("scenario %s: %s on %s, vLLM %s era %s, %d KV blocks%s (%s), speed %.3g",
                 sc.name, st.model_name, args.gpu or sc.gpu, st.version, st.era.key,
                 st.engine.cfg.num_gpu_blocks, f" per engine x {dp} data-parallel engines" if dp > 1 else "",
                 st.resolved.capacity_source, st.speed)

    def ready(urls: list[str]) -> None:
        for u in urls:
            print(u, flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(bindings, states, tick_s=tick, duration=args.duration, stop=stop, on_ready=ready)

    try:
        asyncio.run(main())
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    return 0
