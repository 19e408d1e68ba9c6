"""Scenario files: one simulated vLLM deployment (model, GPU, TP, vLLM flags), its traffic (with
optional phases that change it mid-run) and the ground truth — which misconfigurations it
contains — so detection can be scored against it.

A scenario is YAML (built-ins live in `exporter/sim/scenarios/`); `load_scenario` accepts a
built-in name or a path and checks every key, raising `InputError` naming the file and the key.
`build` turns it into an `Engine` and a `Renderer`, with KV capacity and step times from the
calculator (`exporter.model`) so the simulator and the daemon's predictions share one model.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from exporter import yamlfile
from exporter.errors import InputError
from exporter.sim import data_parallel
from exporter.sim.engine import Engine, EngineConfig, LengthDist, Phase, StepTimeFn, Traffic
from exporter.sim.eras import Era, era_for
from exporter.sim.exposition import Renderer, cache_config_values

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

# Finding names of the drift detector (issue 5); ground_truth entries must be among them.
FINDINGS = ("kv_pressure", "max_num_seqs", "gpu_memory_utilization", "max_model_len",
            "max_num_batched_tokens", "speculative_decoding", "enable_prefix_caching",
            "kv_cache_dtype", "idle_capacity", "tier_misplacement")

DEFAULT_VERSION = "0.11.0"


@dataclass(frozen=True)
class VllmFlags:
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    num_gpu_blocks: int | None = None          # --num-gpu-blocks-override (the pool's block count)
    kv_cache_memory_bytes: int | None = None   # --kv-cache-memory-bytes (the pool's size, 0.10.2+)
    spec_tokens: int = 0
    spec_acceptance: float = 0.0
    spec_draft_cost: float = 0.05
    data_parallel_size: int = 1                # --data-parallel-size: engine cores behind one server


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str                                # file it came from
    model: str
    gpu: str
    tp: int
    flags: VllmFlags
    phases: tuple[Phase, ...]
    served_model_name: str = ""
    description: str = ""
    ground_truth: tuple[str, ...] = ()
    acceptable: tuple[str, ...] = ()           # findings that are also right, not false alarms
    speed: float = 1.0
    vllm_version: str = DEFAULT_VERSION
    quantization: str | None = None
    warmup_s: float = 0.0                      # sim time run before serving (a warm server)
    restarts: tuple[tuple[float, VllmFlags], ...] = ()   # (sim time, new flags): a redeploy
    # the server's true step times are this x what the calculator predicts (a GPU, driver or
    # build the catalog does not describe); nothing in the exposition says so
    step_time_scale: float = 1.0
    # the promise the demo and the README make: the ground-truth finding shows at warning or
    # above within this much wall time after the daemon starts (demo settings, speed 1)
    detect_within_s: float | None = None

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def builtin_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


# ---- parsing ----------------------------------------------------------------------------------
_TOP = {"name", "description", "model", "served_model_name", "gpu", "tp", "quantization", "vllm",
        "traffic", "phases", "ground_truth", "acceptable", "speed", "vllm_version", "warmup",
        "step_time_scale", "detect_within"}
_VLLM = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
         "enable_prefix_caching", "kv_cache_dtype", "block_size", "num_gpu_blocks", "speculative",
         "kv_cache_memory_bytes", "data_parallel_size"}
# engine cores one simulated server may run (each is simulated step by step)
MAX_DP = 16
_SPEC = {"num_speculative_tokens", "acceptance", "draft_cost"}
_TRAFFIC = {"rate", "arrival", "burst_factor", "burst_fraction", "burst_period", "diurnal_period",
            "diurnal_amplitude", "prompt", "output", "max_tokens", "shared_prefix", "concurrency",
            "client_timeout"}
_DIST = {"mean", "kind", "cv", "min", "max"}
_PREFIX = {"tokens", "groups", "share"}
_PHASE = {"at", "traffic", "vllm"}


class _Reader:
    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, msg: str) -> InputError:
        return InputError(f"{self.where}: {key}: {msg}")

    def mapping(self, value: Any, key: str, allowed: set[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                raise self.fail(f"{key}.{k}" if key else str(k),
                                f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def num(self, m: Mapping, key: str, path: str, default=None, *, integer=False,
            lo: float | None = None, hi: float | None = None):
        if key not in m or m[key] is None:
            return default
        v = m[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(path, f"expected a number, got {v!r}")
        if integer and (not float(v).is_integer()):
            raise self.fail(path, f"expected an integer, got {v!r}")
        if lo is not None and v < lo or hi is not None and v > hi:
            raise self.fail(path, f"{v!r} out of range [{lo}, {hi}]")
        return int(v) if integer else float(v)

    def text(self, m: Mapping, key: str, path: str, default=None, choices=None):
        if key not in m or m[key] is None:
            return default
        v = m[key]
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise self.fail(path, f"expected a string, got {v!r}")
        v = str(v)
        if choices and v not in choices:
            raise self.fail(path, f"{v!r} is not one of {', '.join(choices)}")
        return v

    def boolean(self, m: Mapping, key: str, path: str, default: bool) -> bool:
        if key not in m or m[key] is None:
            return default
        if not isinstance(m[key], bool):
            raise self.fail(path, f"expected true or false, got {m[key]!r}")
        return m[key]


def _duration(r: _Reader, value: Any, path: str) -> float:
    """Seconds from 90, '90s', '5m', '1h'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise r.fail(path, "must not be negative")
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(value))
    if not m:
        raise r.fail(path, f"cannot read duration {value!r} (e.g. 90, 90s, 5m)")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def _dist(r: _Reader, value: Any, path: str, base: LengthDist) -> LengthDist:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return LengthDist(mean=float(value), kind="fixed", min=1)
    m = r.mapping(value, path, _DIST)
    d = LengthDist(
        mean=r.num(m, "mean", f"{path}.mean", base.mean, lo=1),
        kind=r.text(m, "kind", f"{path}.kind", base.kind,
                    ("fixed", "uniform", "lognormal", "exponential")),
        cv=r.num(m, "cv", f"{path}.cv", base.cv, lo=0),
        min=r.num(m, "min", f"{path}.min", base.min, integer=True, lo=1),
        max=r.num(m, "max", f"{path}.max", base.max, integer=True, lo=1),
    )
    if d.min > d.max:
        raise r.fail(f"{path}.min", f"min {d.min} exceeds max {d.max}")
    return d


def _traffic(r: _Reader, value: Any, path: str, base: Traffic | None) -> Traffic:
    m = r.mapping(value, path, _TRAFFIC)
    if base is None:
        if "rate" not in m and "concurrency" not in m:
            raise r.fail(f"{path}.rate", "missing (requests per second, or `concurrency` clients)")
        base = Traffic(rate=0.0)
    prefix = r.mapping(m.get("shared_prefix"), f"{path}.shared_prefix", _PREFIX)
    t = replace(
        base,
        rate=r.num(m, "rate", f"{path}.rate", base.rate, lo=0),
        arrival=r.text(m, "arrival", f"{path}.arrival", base.arrival,
                       ("poisson", "bursty", "diurnal", "constant")),
        burst_factor=r.num(m, "burst_factor", f"{path}.burst_factor", base.burst_factor, lo=1),
        burst_fraction=r.num(m, "burst_fraction", f"{path}.burst_fraction", base.burst_fraction,
                             lo=0, hi=1),
        prompt=_dist(r, m["prompt"], f"{path}.prompt", base.prompt) if "prompt" in m else base.prompt,
        output=_dist(r, m["output"], f"{path}.output", base.output) if "output" in m else base.output,
        max_tokens=r.num(m, "max_tokens", f"{path}.max_tokens", base.max_tokens, integer=True, lo=1),
        diurnal_amplitude=r.num(m, "diurnal_amplitude", f"{path}.diurnal_amplitude",
                                base.diurnal_amplitude, lo=0, hi=1),
        shared_prefix_tokens=r.num(prefix, "tokens", f"{path}.shared_prefix.tokens",
                                   base.shared_prefix_tokens, integer=True, lo=0),
        prefix_groups=r.num(prefix, "groups", f"{path}.shared_prefix.groups", base.prefix_groups,
                            integer=True, lo=1),
        prefix_share=r.num(prefix, "share", f"{path}.shared_prefix.share", base.prefix_share,
                           lo=0, hi=1),
        concurrency=r.num(m, "concurrency", f"{path}.concurrency", base.concurrency, integer=True,
                          lo=0, hi=100000),
    )
    if "client_timeout" in m:
        t = replace(t, client_timeout_s=_duration(r, m["client_timeout"], f"{path}.client_timeout"))
    if "burst_period" in m:
        t = replace(t, burst_period_s=_duration(r, m["burst_period"], f"{path}.burst_period") or 1.0)
    if "diurnal_period" in m:
        t = replace(t, diurnal_period_s=_duration(r, m["diurnal_period"], f"{path}.diurnal_period") or 1.0)
    return t


def _flags(r: _Reader, value: Any, path: str, base: VllmFlags) -> VllmFlags:
    v = r.mapping(value, path, _VLLM)
    spec = r.mapping(v.get("speculative"), f"{path}.speculative", _SPEC)
    p = path + "."
    return replace(
        base,
        max_model_len=r.num(v, "max_model_len", p + "max_model_len", base.max_model_len,
                            integer=True, lo=16),
        max_num_seqs=r.num(v, "max_num_seqs", p + "max_num_seqs", base.max_num_seqs, integer=True,
                           lo=1),
        max_num_batched_tokens=r.num(v, "max_num_batched_tokens", p + "max_num_batched_tokens",
                                     base.max_num_batched_tokens, integer=True, lo=1),
        gpu_memory_utilization=r.num(v, "gpu_memory_utilization", p + "gpu_memory_utilization",
                                     base.gpu_memory_utilization, lo=0.01, hi=1.0),
        enable_prefix_caching=r.boolean(v, "enable_prefix_caching", p + "enable_prefix_caching",
                                        base.enable_prefix_caching),
        kv_cache_dtype=r.text(v, "kv_cache_dtype", p + "kv_cache_dtype", base.kv_cache_dtype,
                              ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
        block_size=r.num(v, "block_size", p + "block_size", base.block_size, integer=True, lo=1),
        num_gpu_blocks=r.num(v, "num_gpu_blocks", p + "num_gpu_blocks", base.num_gpu_blocks,
                             integer=True, lo=2),
        kv_cache_memory_bytes=r.num(v, "kv_cache_memory_bytes", p + "kv_cache_memory_bytes",
                                    base.kv_cache_memory_bytes, integer=True, lo=1),
        spec_tokens=r.num(spec, "num_speculative_tokens", p + "speculative.num_speculative_tokens",
                          base.spec_tokens, integer=True, lo=0, hi=16),
        spec_acceptance=r.num(spec, "acceptance", p + "speculative.acceptance", base.spec_acceptance,
                              lo=0, hi=1),
        spec_draft_cost=r.num(spec, "draft_cost", p + "speculative.draft_cost", base.spec_draft_cost,
                              lo=0),
        data_parallel_size=r.num(v, "data_parallel_size", p + "data_parallel_size",
                                 base.data_parallel_size, integer=True, lo=1, hi=MAX_DP),
    )


def parse_scenario(data: Any, where: str) -> Scenario:
    """Validate a loaded YAML document; `where` names the file in error messages."""
    r = _Reader(where)
    top = r.mapping(data, "", _TOP)
    if not top:
        raise InputError(f"{where}: empty scenario (needs model, gpu, traffic)")
    for key in ("model", "gpu", "traffic"):
        if key not in top:
            raise r.fail(key, "missing")
    flags = _flags(r, top.get("vllm"), "vllm", VllmFlags())
    base = _traffic(r, top["traffic"], "traffic", None)
    phases = [Phase(0.0, base)]
    restarts: list[tuple[float, VllmFlags]] = []
    raw_phases = top.get("phases") or []
    if not isinstance(raw_phases, list):
        raise r.fail("phases", "expected a list of {at, traffic}")
    for i, ph in enumerate(raw_phases):
        pm = r.mapping(ph, f"phases[{i}]", _PHASE)
        if "at" not in pm:
            raise r.fail(f"phases[{i}].at", "missing (e.g. 5m)")
        at = _duration(r, pm["at"], f"phases[{i}].at")
        prev = phases[-1].traffic
        phases.append(Phase(at, _traffic(r, pm.get("traffic"), f"phases[{i}].traffic", prev)))
        if "vllm" in pm:
            last = restarts[-1][1] if restarts else flags
            restarts.append((at, _flags(r, pm["vllm"], f"phases[{i}].vllm", last)))
    gt = top.get("ground_truth") or []
    acc = top.get("acceptable") or []
    for key, lst in (("ground_truth", gt), ("acceptable", acc)):
        if not isinstance(lst, list):
            raise r.fail(key, "expected a list of finding names")
        for item in lst:
            if item not in FINDINGS:
                raise r.fail(key, f"unknown finding {item!r} (one of {', '.join(FINDINGS)})")
    name = r.text(top, "name", "name", Path(where).stem)
    tp = r.num(top, "tp", "tp", 1, integer=True, lo=1, hi=64)
    speed = r.num(top, "speed", "speed", 1.0, lo=0.001, hi=10000)
    step_scale = r.num(top, "step_time_scale", "step_time_scale", 1.0, lo=0.01, hi=100)
    version = r.text(top, "vllm_version", "vllm_version", DEFAULT_VERSION)
    try:
        era_for(version)
    except ValueError:
        raise r.fail("vllm_version", f"cannot read {version!r} (expected X.Y.Z)") from None
    return Scenario(
        name=name, source=where, model=r.text(top, "model", "model"), gpu=r.text(top, "gpu", "gpu"),
        tp=tp, flags=flags, phases=tuple(phases),
        served_model_name=r.text(top, "served_model_name", "served_model_name", ""),
        description=r.text(top, "description", "description", ""),
        ground_truth=tuple(gt), acceptable=tuple(acc), speed=speed, vllm_version=version,
        quantization=r.text(top, "quantization", "quantization", None),
        warmup_s=_duration(r, top["warmup"], "warmup") if top.get("warmup") is not None else 0.0,
        restarts=tuple(restarts), step_time_scale=step_scale,
        detect_within_s=(_duration(r, top["detect_within"], "detect_within")
                         if top.get("detect_within") is not None else None),
    )


def with_data_parallel(sc: Scenario, engines: int) -> Scenario:
    """`sc` run with `engines` data-parallel engines, in its first deployment and every redeploy."""
    return replace(sc, flags=replace(sc.flags, data_parallel_size=engines),
                   restarts=tuple((at, replace(f, data_parallel_size=engines)) for at, f in sc.restarts))


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a user's YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise InputError(f"--scenario: unknown scenario {name_or_path!r}; built-in: "
                             f"{', '.join(builtin_names())}, or give a path to a YAML file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{name_or_path}: cannot read scenario file ({exc.strerror})") from None
    try:
        data = yamlfile.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise InputError(f"{path}:{line} invalid YAML ({getattr(exc, 'problem', exc)})") from None
    return parse_scenario(data, str(path))


# ---- wiring to the calculator ------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """Everything needed to run a scenario: resolved engine knobs and a step-time function."""

    config: EngineConfig
    step_time: StepTimeFn
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    capacity_source: str        # "calculator", "scenario override", "kv_cache_memory_bytes"
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None


def resolve(sc: Scenario, *, model: str | None = None, gpu: str | None = None,
            version: str | None = None, flags: VllmFlags | None = None) -> Resolved:
    """Resolve model/GPU/flags through the calculator's Setup, KV capacity and step-time model."""
    from exporter.model.setup import Setup

    f = flags or sc.flags
    setup = Setup.build(model or sc.model, gpu or sc.gpu, tp=sc.tp,
                        quantization=sc.quantization, kv_cache_dtype=f.kv_cache_dtype,
                        gpu_memory_utilization=f.gpu_memory_utilization,
                        max_model_len=f.max_model_len, max_num_seqs=f.max_num_seqs,
                        max_num_batched_tokens=f.max_num_batched_tokens, block_size=f.block_size,
                        vllm_version=version or sc.vllm_version,
                        # the simulated engine chunks prompts by max_num_batched_tokens in every era
                        # (a V0 server with these flags runs --enable-chunked-prefill)
                        enable_chunked_prefill=True,
                        # the pool as vLLM sizes it from these flags (the calculator's accounting)
                        kv_cache_memory_bytes=f.kv_cache_memory_bytes, num_gpu_blocks_override=f.num_gpu_blocks,
                        # one engine of a data-parallel server (MoE experts spread over TP x DP)
                        dp=f.data_parallel_size)
    try:
        blocks, source = _capacity(setup)
    except InputError as exc:
        raise InputError(f"{sc.source}: vllm: {exc}") from None
    if (blocks - 1) * setup.block_size < setup.max_model_len:
        raise InputError(f"{sc.source}: vllm.max_model_len: {setup.max_model_len} tokens do not fit "
                         f"the KV cache ({(blocks - 1) * setup.block_size} tokens); vLLM would "
                         f"refuse to start")
    era = era_for(version or sc.vllm_version)
    if f.data_parallel_size > 1 and not era.v1:
        raise InputError(f"{sc.source}: vllm.data_parallel_size: {f.data_parallel_size} engines need "
                         f"the V1 engine (vLLM 0.8 or later); {version or sc.vllm_version} runs V0")
    cfg = EngineConfig(
        num_gpu_blocks=blocks, block_size=setup.block_size, max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=setup.max_model_len, enable_prefix_caching=f.enable_prefix_caching,
        spec_tokens=f.spec_tokens, spec_acceptance=f.spec_acceptance,
        spec_draft_cost=f.spec_draft_cost,
        iteration_tokens_computed_only=era.iteration_tokens_computed_only)
    return Resolved(cfg, _step_time(setup, sc.step_time_scale), setup.max_model_len, setup.gpu_memory_utilization,
                    setup.kv_cache_dtype, source, num_gpu_blocks_override=f.num_gpu_blocks,
                    kv_cache_memory_bytes=f.kv_cache_memory_bytes)


def _capacity(setup) -> tuple[int, str]:
    """The pool's blocks as the calculator predicts vLLM sizes them, and what sized it."""
    from exporter.model.kv_cache import kv_capacity
    source = ("scenario override" if setup.num_gpu_blocks_override else
              "kv_cache_memory_bytes" if setup.kv_cache_memory_bytes else "calculator")
    return int(kv_capacity(setup, check_fits=False).gpu_blocks), source


def _step_time(setup, scale: float = 1.0) -> StepTimeFn:
    """The calculator's step time of `setup`, times the scenario's `step_time_scale`."""
    from exporter.model.perf import step_time_s

    def fn(ds: int, dc: int, pt: int, pc: int, chunks: Sequence[tuple[int, int]] = ()) -> float:
        return scale * step_time_s(setup, decode_seqs=ds, decode_context_tokens=dc,
                                   prefill_tokens=pt, prefill_context_tokens=pc, prefill_chunks=chunks)
    return fn


# ---- one simulated server ------------------------------------------------------------------------
@dataclass
class SimServerState:
    """One simulated server: its engine, its renderer and what the HTTP endpoints report. A
    scenario phase with new `vllm` flags is a redeploy: at that sim time the server restarts
    with a fresh engine (counters reset, new `cache_config_info`, new start time)."""

    scenario: Scenario
    current: Engine | data_parallel.EngineGroup   # the engine(s) of the current deployment
    renderer: Renderer | data_parallel.GroupRenderer
    era: Era
    version: str
    model_name: str
    max_model_len: int
    start_time: float
    speed: float
    resolved: Resolved
    seed: int = 0
    model: str | None = None
    gpu: str | None = None
    offset: float = 0.0                       # sim time at which the current engine started
    restarts_done: int = 0
    _text: str = field(default="", repr=False)
    _rendered_at: float = field(default=-1.0, repr=False)

    @property
    def sim_time(self) -> float:
        return self.offset + self.current.now

    @property
    def engine(self) -> "_ScenarioEngine":
        """The engine on the scenario's clock: `advance_to(t)` and `now` are scenario sim time
        (redeploys applied); everything else is the current deployment's engine."""
        return _ScenarioEngine(self)

    def tick(self, wall_elapsed: float) -> None:
        """Advance sim time to warm-up + `wall_elapsed * speed`."""
        self.advance(self.scenario.warmup_s + wall_elapsed * self.speed)

    def advance(self, sim_t: float) -> None:
        restarts = self.scenario.restarts
        while self.restarts_done < len(restarts) and restarts[self.restarts_done][0] <= sim_t:
            at, flags = restarts[self.restarts_done]
            self.current.advance_to(at - self.offset)
            self.restarts_done += 1
            self._start_engine(at, flags)
        self.current.advance_to(sim_t - self.offset)

    def _start_engine(self, at: float, flags: VllmFlags) -> None:
        engine, renderer, res = _make(self.scenario, flags, era=self.era, version=self.version,
                                      model=self.model, gpu=self.gpu, model_name=self.model_name,
                                      seed=self.seed + 1000 * self.restarts_done,
                                      start_time=self.start_time + at, offset=at)
        self.current, self.renderer, self.resolved = engine, renderer, res
        self.max_model_len = res.max_model_len
        self.offset = at
        self._text = ""

    def exposition(self) -> str:
        if self._rendered_at != self.sim_time or not self._text:
            self._text = self.renderer.render(self.current.metrics, self.start_time + self.sim_time)
            self._rendered_at = self.sim_time
        return self._text


class _ScenarioEngine:
    """See `SimServerState.engine`."""

    __slots__ = ("_state",)

    def __init__(self, state: SimServerState):
        self._state = state

    def advance_to(self, t: float, max_steps: int = 1_000_000) -> None:
        self._state.advance(t)

    @property
    def now(self) -> float:
        return self._state.sim_time

    def __getattr__(self, name: str):
        return getattr(self._state.current, name)


def _make(sc: Scenario, flags: VllmFlags, *, era: Era, version: str, model: str | None,
          gpu: str | None, model_name: str, seed: int, start_time: float,
          offset: float = 0.0) -> tuple[Engine | data_parallel.EngineGroup,
                                        Renderer | data_parallel.GroupRenderer, Resolved]:
    res = resolve(sc, model=model, gpu=gpu, version=version, flags=flags)
    cfg = res.config
    dp = flags.data_parallel_size
    cache = cache_config_values(era, block_size=cfg.block_size, num_gpu_blocks=cfg.num_gpu_blocks,
                                gpu_memory_utilization=res.gpu_memory_utilization,
                                enable_prefix_caching=cfg.enable_prefix_caching,
                                cache_dtype=res.kv_cache_dtype, max_model_len=res.max_model_len,
                                kv_cache_memory_bytes=res.kv_cache_memory_bytes,
                                num_gpu_blocks_override=res.num_gpu_blocks_override, engines=dp)
    renderers = [Renderer(era, model_name=model_name, max_model_len=res.max_model_len,
                          max_num_seqs=cfg.max_num_seqs, cache_config=cache, start_time=start_time,
                          spec_tokens=cfg.spec_tokens, engine_index=str(i), multiprocess_api=dp > 1)
                 for i in range(dp)]
    # traffic phases in the new engine's clock (it starts at `offset` of scenario time)
    phases = [Phase(max(0.0, p.at_s - offset), p.traffic) for p in sc.phases]
    if dp == 1:
        engine = Engine(cfg, phases, res.step_time, seed=seed, histogram_bounds=renderers[0].bounds)
        return engine, renderers[0], res
    engines = [Engine(cfg, data_parallel.split_phases(phases, dp, i), res.step_time,
                      seed=seed + 7919 * i, histogram_bounds=renderers[i].bounds) for i in range(dp)]
    return data_parallel.EngineGroup(engines), data_parallel.GroupRenderer(renderers), res


def build(sc: Scenario, *, seed: int = 0, version: str | None = None, model: str | None = None,
          gpu: str | None = None, speed: float | None = None, start_time: float = 1.7e9) -> SimServerState:
    """Engine + renderer for a scenario; deterministic for (scenario, seed, version)."""
    ver = version or sc.vllm_version
    try:
        era = era_for(ver)
    except ValueError:
        raise InputError(f"--vllm-version: cannot read {ver!r} (expected X.Y.Z)") from None
    spd = float(speed) if speed else sc.speed
    if not (spd > 0 and math.isfinite(spd)):
        raise InputError(f"--speed must be a positive number (got {speed})")
    model_name = sc.served_model_name or model or sc.model
    for i, (_, flags) in enumerate(sc.restarts):   # fail at start, not mid-run, on a bad redeploy
        try:
            resolve(sc, model=model, gpu=gpu, version=ver, flags=flags)
        except InputError as exc:
            raise InputError(f"{exc} (redeploy in phase at {sc.restarts[i][0]:g} s)") from None
    engine, renderer, res = _make(sc, sc.flags, era=era, version=ver, model=model, gpu=gpu,
                                  model_name=model_name, seed=seed, start_time=start_time)
    st = SimServerState(sc, engine, renderer, era, ver, model_name, res.max_model_len, start_time,
                        spd, res, seed=seed, model=model, gpu=gpu)
    st.advance(sc.warmup_s)
    return st
