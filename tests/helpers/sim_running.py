"""A simulated vLLM server (`exporter.sim.server.serve`) on 127.0.0.1 in a background thread, for
tests that load it over real HTTP; stopped and joined on exit. `quiet_scenario` writes a scenario
with no background traffic, so a test's own requests are the whole load."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from exporter.sim.scenario import build, load_scenario
from exporter.sim.server import Endpoint, serve


class Running:
    def __init__(self, bindings, states, duration=120.0, tick_s=0.1):
        self.urls: list[str] = []
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop = None

        def main():
            asyncio.set_event_loop(self._loop)
            self._stop = asyncio.Event()

            def ready(urls):
                self.urls = urls
                self._ready.set()
            self._loop.run_until_complete(serve(bindings, states, tick_s=tick_s, duration=duration,
                                                stop=self._stop, on_ready=ready))
        self._thread = threading.Thread(target=main, daemon=True)

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(20), "server did not start"
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def quiet_scenario(tmp: Path, *, max_num_seqs: int = 8, num_gpu_blocks: int | None = None,
                   speed: float = 1.0, name: str = "quiet", max_model_len: int = 4096,
                   step_time_scale: float = 1.0) -> Path:
    blocks = f"\n  num_gpu_blocks: {num_gpu_blocks}" if num_gpu_blocks else ""
    path = tmp / f"{name}.yaml"
    path.write_text(f"""name: {name}
model: meta-llama/Llama-3.1-8B-Instruct
gpu: L4
tp: 1
vllm:
  max_model_len: {max_model_len}
  max_num_seqs: {max_num_seqs}
  max_num_batched_tokens: 2048{blocks}
traffic:
  rate: 0
  prompt: {{mean: 100}}
  output: {{mean: 100}}
speed: {speed}
step_time_scale: {step_time_scale}
""")
    return path


def start(scenario: str | Path, *, seed: int = 0, speed: float | None = None) -> tuple[Running, object]:
    st = build(load_scenario(str(scenario)), seed=seed, version="0.11.0", speed=speed)
    return Running([("127.0.0.1", 0, Endpoint(st))], [st]), st
