"""Preemption stalls of a KV-bound vLLM V1 engine, measured on the scheduler's own rules.

For each request shape (prompt/output) the engine emulation (`exporter.sim.engine`: admission by
prompt blocks, the newest running request preempted when decodes outgrow the pool, re-admission
at the front of the queue) runs twice under the same closed-loop load: once with a pool that
holds ~R requests (KV-bound, preempting) and once with the pool unlimited and `max_num_seqs` at
the running count the first run reached (the same batch, no preemption). The difference in TPOT,
in clean decode steps, is the stall per output token, printed beside the bound the perf model
puts on it (`perf.steady_state` books the overload's decode share as stalls up to one step per
output token whatever the shape, the rest as waiting for the first token) and beside a candidate
law x / (x + 1.5), x = output / prompt, that the measurements suggest. The emulation agrees with
the real vLLM 0.32 KV-pressure capture (tests/fixtures/vllm-cpu, 48 clients, 512/1024, a pool of
~4 requests): 1.28 preemptions per request and 85 % of the end-to-end time before the first token,
against 1.27 and 89 % measured.

Why the candidate is not in the model yet: a priori it is neutral on the measured rows (shared
TPOT 18.0 -> 17.7 % all rows, 5.9 % at c <= 256 both; held-out aiconfigurator 11.9 -> 11.8 %), and
it predicts Llama-3.1-70B FP8 on 2 x H100, 8192/1024 flat from c=32 to c=64 as measured (52.37 /
52.41 ms) where the cap adds 7 %; but the calibrated figure on the shared groups goes 4.2 -> 4.7 %:
the cap marks gpt-oss-120b 2 x H100 8192/1024 c=512 (vLLM 0.11.2, fitted beside c=4 of 0.18.0)
as mostly stalls and sets it aside, the candidate does not, and two rows of two releases then pull
the fit. It waits for calibration that keeps one release per fit.

usage: .venv/bin/python benchmarks/preemption_stalls.py [--running 5 20 60] [--overload 1.2 2 6]
"""
from __future__ import annotations

import argparse

from exporter.model.perf import STALL_BOUND_STEPS
from exporter.sim.engine import HISTOGRAM_KEYS, Engine, EngineConfig, LengthDist, Phase, Traffic

SHAPES = ((64, 1024), (128, 1024), (256, 1024), (512, 1024), (1024, 1024), (1024, 512), (1024, 256),
          (1024, 128))


def candidate(x: float) -> float:
    return x / (x + 1.5) if x > 0 else 0.0


def step_time(decode_seqs: int, decode_ctx: int, prefill: int, prefill_ctx: int) -> float:
    # a fixed part, a part per decoding sequence, a smaller one per prefill token
    return 1.0e-3 + 0.25e-3 * decode_seqs + 0.02e-3 * prefill


def measure(prompt: int, output: int, *, blocks: int, clients: int, max_seqs: int, duration: float,
            block_size: int = 16, seed: int = 1) -> dict:
    """Steady-state means over the last two thirds of `duration` simulated seconds."""
    cfg = EngineConfig(num_gpu_blocks=blocks, block_size=block_size, max_num_seqs=max_seqs,
                       max_num_batched_tokens=8192, max_model_len=prompt + output + 64,
                       enable_prefix_caching=False)
    traffic = Traffic(rate=0.0, concurrency=clients, prompt=LengthDist(prompt, kind="fixed"),
                      output=LengthDist(1 << 20, kind="fixed"), max_tokens=output,
                      client_timeout_s=1e12)
    seqs: list[int] = []

    def timed(d, dc, p, pc, chunks):
        seqs.append(d)
        return step_time(d, dc, p, pc)

    eng = Engine(cfg, [Phase(0.0, traffic)], timed, seed=seed,
                 histogram_bounds={k: [1.0] for k in HISTOGRAM_KEYS})
    eng.advance_to(duration / 3)
    keys = ("tpot", "ttft", "e2e", "num_preemptions")
    base = {k: (eng.metrics.hist[k].sum, eng.metrics.hist[k].count) for k in keys}
    n0 = len(seqs)
    eng.advance_to(duration)
    out = {k: (eng.metrics.hist[k].sum - base[k][0]) / max(1, eng.metrics.hist[k].count - base[k][1])
           for k in keys}
    out["running"] = sum(seqs[n0:]) / max(1, len(seqs) - n0)
    return out


def stall_per_token(prompt: int, output: int, running: int, overload: float) -> dict:
    """Stall per output token in clean decode steps, and what the KV-bound run looked like."""
    blocks = int(running * (prompt + output / 2 + 8) / 16) + 1
    clients = max(int(round(overload * running)), running + 1)
    duration = 300.0 * (output + prompt / 8) / 1024 * (running / 20) ** 0.5
    kv = measure(prompt, output, blocks=blocks, clients=clients, max_seqs=4096, duration=duration)
    seqs = measure(prompt, output, blocks=1_000_000, clients=clients,
                   max_seqs=max(1, round(kv["running"])), duration=duration)
    clean = step_time(round(kv["running"]), 0, 0, 0)
    return {"stall": (kv["tpot"] - seqs["tpot"]) / clean, "running": kv["running"],
            "preemptions": kv["num_preemptions"], "ttft_share": kv["ttft"] / kv["e2e"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, nargs="+", default=[20])
    ap.add_argument("--overload", type=float, nargs="+", default=[2.0])
    a = ap.parse_args()
    errs, cap_errs = [], []
    print(f"{'R':>3} {'clients/R':>9} {'out/prompt':>10} {'stall/token':>11} {'cap':>6} {'cand.':>6} "
          f"{'preempt/req':>11} {'TTFT share':>10}")
    for r in a.running:
        for ov in a.overload:
            for p, o in SHAPES:
                m = stall_per_token(p, o, r, ov)
                law = candidate(o / p)
                errs.append(abs(m["stall"] - law))
                cap_errs.append(abs(m["stall"] - STALL_BOUND_STEPS))
                print(f"{r:>3} {ov:>9.1f} {o / p:>10.3g} {m['stall']:>11.2f} "
                      f"{STALL_BOUND_STEPS:>6.2f} {law:>6.2f} "
                      f"{m['preemptions']:>11.2f} {m['ttft_share']:>10.2f}", flush=True)
    print(f"preemption stalls: {len(errs)} shapes, mean |measured - cap| "
          f"{sum(cap_errs) / len(cap_errs):.2f} steps per token, |measured - candidate| "
          f"{sum(errs) / len(errs):.2f} (worst {max(errs):.2f})")


if __name__ == "__main__":
    main()
