"""Speed of `perf.step_time_s`, the call the simulator makes every engine step.

Prints calls per second of the public call and of a baseline in the same process: the same
arithmetic reached through the lru-cached `shape_for(setup)` lookup (which hashes the nested
frozen setup each time). The ratio is the figure to watch; absolute numbers depend on the host.
"""
from __future__ import annotations

import time

from exporter.model import perf
from exporter.model.setup import Setup


def _rate(fn, n: int = 50_000) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t)


def main() -> None:
    setups = [Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", max_model_len=8192),
              Setup.build("openai/gpt-oss-120b", "H100", tp=2, max_model_len=8192)]
    for s in setups:
        cal = perf.calibration_for(s.gpu.name)

        def public(i: int, s=s) -> float:
            return perf.step_time_s(s, decode_seqs=64, decode_context_tokens=64 * 1500 + i,
                                    prefill_tokens=512)

        def baseline(i: int, s=s) -> float:
            return perf.step_time_shape(perf.shape_for(s), cal, 64, 64 * 1500 + i, 512)

        public(0)
        b, p = _rate(baseline), _rate(public)
        print(f"{s.model.name} tp{s.tp}: step_time_s {p:,.0f} calls/s, baseline {b:,.0f} calls/s, "
              f"ratio {p / b:.2f}x")


if __name__ == "__main__":
    main()
