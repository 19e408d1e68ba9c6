"""Fleet mode: one process serving many simulated vLLM targets on many loopback ports, cheaply
enough that 1,000 of them run on a 2-core machine next to the daemon (for benchmarks and demos).

The cost of a target is its engine's steps plus one render per tick, so targets share a bounded
pool of engines (`engines`, default 16): target i serves engine i mod K, whose exposition is
rendered (and gzip-compressed) once per tick and handed to every target that shares it. Engines
cycle through the scenarios, so the fleet holds every kind of problem in known proportions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from exporter import yamlfile
from exporter.errors import InputError
from exporter.sim.eras import era_for
from exporter.sim.scenario import SimServerState, build, builtin_names, load_scenario, with_data_parallel
from exporter.sim.server import Endpoint

DEFAULT_ENGINES = 16


@dataclass(frozen=True)
class FleetSpec:
    targets: int
    engines: int = DEFAULT_ENGINES
    scenarios: tuple[str, ...] = ()
    vllm_versions: tuple[str, ...] = ()
    seed: int = 0
    speed: float | None = None


def load_fleet_config(path: str) -> FleetSpec:
    """`targets: N`, optional `engines`, `scenarios` (names or paths), `vllm_versions`, `seed`."""
    try:
        data: Any = yamlfile.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read fleet config ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: invalid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping with at least `targets`")
    allowed = {"targets", "engines", "scenarios", "vllm_versions", "seed", "speed"}
    for k in data:
        if k not in allowed:
            raise InputError(f"{path}: {k}: unknown key (allowed: {', '.join(sorted(allowed))})")
    n = data.get("targets")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 20000:
        raise InputError(f"{path}: targets: expected an integer 1..20000, got {n!r}")
    engines = data.get("engines", DEFAULT_ENGINES)
    if not isinstance(engines, int) or isinstance(engines, bool) or engines < 1:
        raise InputError(f"{path}: engines: expected a positive integer, got {engines!r}")
    scen = data.get("scenarios") or []
    vers = data.get("vllm_versions") or []
    for key, lst in (("scenarios", scen), ("vllm_versions", vers)):
        if not isinstance(lst, list) or not all(isinstance(x, (str, int, float)) for x in lst):
            raise InputError(f"{path}: {key}: expected a list of strings")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"{path}: seed: expected an integer, got {seed!r}")
    speed = data.get("speed")
    if speed is not None and (not isinstance(speed, (int, float)) or speed <= 0):
        raise InputError(f"{path}: speed: expected a positive number, got {speed!r}")
    return FleetSpec(n, engines, tuple(str(s) for s in scen), tuple(str(v) for v in vers), seed,
                     speed)


def _v1(version: str) -> bool:
    try:
        return era_for(version).v1
    except ValueError:
        return True         # `build` refuses the version itself, naming it


def build_fleet(spec: FleetSpec, *, start_time: float) -> tuple[list[SimServerState], list[Endpoint]]:
    """K engine states and N endpoints (target i -> engine i mod K)."""
    names = list(spec.scenarios) or builtin_names()
    scenarios = [load_scenario(n) for n in names]
    k = max(1, min(spec.engines, spec.targets))
    states: list[SimServerState] = []
    for i in range(k):
        sc = scenarios[i % len(scenarios)]
        ver = spec.vllm_versions[i % len(spec.vllm_versions)] if spec.vllm_versions else None
        if ver and sc.flags.data_parallel_size > 1 and not _v1(ver):
            # a V0 server has no data parallelism: that engine of the fleet runs one core
            sc = with_data_parallel(sc, 1)
        states.append(build(sc, seed=spec.seed + i, version=ver, speed=spec.speed,
                            start_time=start_time - sc.warmup_s))
    shared = [Endpoint(st) for st in states]
    endpoints = [shared[i % k] for i in range(spec.targets)]
    return states, endpoints
