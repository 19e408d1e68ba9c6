"""The closed-form closed loop (`perf.steady_state`) against a step-by-step emulation of vLLM's
scheduler (`exporter.sim.engine`) driven by the same step-time model.

The two share nothing but `perf.step_time_shape`: the closed form solves for a mean step time
with every request's prefill folded into the decode steps it rides in; the engine schedules real
steps by V1's rules (running requests first, chunked prompts within the token budget, blocks) for
a closed loop of clients whose lengths vary as a benchmark client's do (uniform 0.8-1.0 of
nominal). Where decode dominates, the mean TPOT and the request rate must agree: a change to the
closed form's queueing algebra that breaks them shows here before it shows in any measured table.
Prompt-heavy traffic, where a step carries several requests' prompt chunks, is held to a looser
bound (the engine hands the step time each request's chunk).

The client-visible TTFT parts (HTTP, tokenisation, the steps until the client sees the token) are
not in the engine, so they are zeroed in the closed form here and TTFT is not compared: the
closed form's prefill queue is a fitted share (`queue_factor`), the engine's is emulated.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.model import perf
from exporter.model.setup import Setup
from exporter.model.traffic import Traffic as ModelTraffic
from exporter.sim.engine import HISTOGRAM_KEYS, Engine, EngineConfig, LengthDist, Phase, Traffic

# (model, GPU, TP, prompt, output): dense and MoE, short and long, on one and two GPUs
SHAPES = (
    ("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM-80GB", 1, 512, 256),
    ("Qwen/Qwen3-32B", "H100-SXM-80GB", 2, 1024, 512),
    ("openai/gpt-oss-120b", "H100-SXM-80GB", 2, 1024, 512),
)


def _emulated(setup: Setup, cal: perf.Calibration, clients: int, prompt: int, output: int) -> tuple[float, float]:
    """Mean TPOT and requests/s of `clients` back-to-back clients over the emulated engine, after
    the first third of the run (the start, where every client arrives at once, is left out)."""
    shape = perf.shape_for(setup)
    cfg = EngineConfig(num_gpu_blocks=int(perf.kv_tokens_for(setup) / setup.block_size),
                       block_size=setup.block_size, max_num_seqs=setup.max_num_seqs,
                       max_num_batched_tokens=setup.max_num_batched_tokens,
                       max_model_len=prompt + output + 64, enable_prefix_caching=False)
    traffic = Traffic(rate=0.0, concurrency=clients, client_timeout_s=1e12, max_tokens=output,
                      prompt=LengthDist(0.9 * prompt, kind="uniform", min=int(0.8 * prompt), max=prompt),
                      output=LengthDist(0.9 * output, kind="uniform", min=int(0.8 * output), max=output))
    eng = Engine(cfg, [Phase(0.0, traffic)],
                 lambda d, dc, p, pc, ch: perf.step_time_shape(shape, cal, d, dc, p, pc, prefill_chunks=ch), seed=3,
                 histogram_bounds={k: [1.0] for k in HISTOGRAM_KEYS})
    # long enough for ~12 generations of every client (at the closed form's pace: prompt-heavy
    # steps are many times a bare decode step)
    op = _closed_form(setup, cal, clients, prompt, output)
    duration = 12 * (output * op.tpot_s + op.ttft_s)
    eng.advance_to(duration / 3)
    tpot = eng.metrics.hist["tpot"]
    s0, n0, t0 = tpot.sum, tpot.count, eng.now
    eng.advance_to(duration)
    return (tpot.sum - s0) / (tpot.count - n0), (tpot.count - n0) / (eng.now - t0)


def _closed_form(setup: Setup, cal: perf.Calibration, clients: int, prompt: int, output: int) -> perf.Prediction:
    """calc's closed form at the emulated clients' mean lengths (0.9 of nominal)."""
    traffic = ModelTraffic(prompt_tokens_mean=0.9 * prompt, output_tokens_mean=0.9 * output)
    return perf.predict(setup, traffic, concurrency=clients, calibration=cal)


def _without_client_side_ttft(gpu: str) -> perf.Calibration:
    """The class factors without the TTFT parts the engine does not have."""
    return replace(perf.calibration_for(gpu), ttft_fixed_s=0.0, ttft_steps=0.0, ttft_prefill_factor=1.0)


@pytest.mark.parametrize("model,gpu,tp,prompt,output", SHAPES)
@pytest.mark.parametrize("clients", [4, 16, 64])
def test_closed_form_matches_the_emulated_scheduler_where_decode_dominates(model, gpu, tp, prompt, output, clients):
    setup = Setup.build(model, gpu, tp=tp, max_model_len=4096)
    cal = _without_client_side_ttft(gpu)
    tpot, rate = _emulated(setup, cal, clients, prompt, output)
    op = _closed_form(setup, cal, clients, prompt, output)
    # measured on these shapes: TPOT within 1.9 %, the request rate within 1.3 % (the closed
    # form's TTFT carries the fitted prefill-queue share, the engine queues as it schedules)
    assert op.tpot_s == pytest.approx(tpot, rel=0.03)
    assert op.requests_per_s == pytest.approx(rate, rel=0.05)


@pytest.mark.parametrize("clients", [1, 2, 4])
def test_a_requests_own_prefill_is_not_in_its_tpot(clients):
    """Prompt-heavy traffic (Qwen3-32B on 2 x H100, 4096/128), where a prefill takes as long as a
    dozen decode steps: each request's decode steps carry the n - 1 other clients' prefills, not its
    own, which comes before its first token. Charging all n put one client 12 % above the emulated
    scheduler; now 0.03 % at one client, 1.9 % and 3.1 % under at two and four."""
    setup = Setup.build("Qwen/Qwen3-32B", "H100-SXM-80GB", tp=2, max_model_len=4608)
    cal = _without_client_side_ttft("H100-SXM-80GB")
    tpot, _ = _emulated(setup, cal, clients, 4096, 128)
    op = _closed_form(setup, cal, clients, 4096, 128)
    assert op.tpot_s == pytest.approx(tpot, rel=0.005 if clients == 1 else 0.04)
    if clients == 1:
        # one client alone decodes at the bare step of a one-request batch
        t_d = perf.step_time_shape(perf.shape_for(setup), cal, 1.0, 0.9 * 4096 + 0.45 * 128, 0.0)
        assert op.tpot_s == pytest.approx(t_d, rel=1e-6)


@pytest.mark.parametrize("clients", [16, 64])
def test_prompt_heavy_closed_loop_agrees_with_the_emulated_scheduler(clients):
    """The same prompt-heavy traffic with many clients, where a step often carries two requests'
    prompt chunks at once. Each chunk attends over its own request's tokens only (the engine
    hands the step its chunks); attention charged as if a step's prompt tokens were one sequence
    put the emulation 7.7 % above the closed form at 64 clients. Measured now: the closed form
    4.5 % and 4.6 % under at 16 and 64."""
    setup = Setup.build("Qwen/Qwen3-32B", "H100-SXM-80GB", tp=2, max_model_len=4608)
    cal = _without_client_side_ttft("H100-SXM-80GB")
    tpot, _ = _emulated(setup, cal, clients, 4096, 128)
    op = _closed_form(setup, cal, clients, 4096, 128)
    assert op.tpot_s == pytest.approx(tpot, rel=0.06)


def test_each_prompt_in_a_step_adds_the_same_time():
    """`step_time_shape` given the step's chunks: a third whole prompt adds what the second did
    (each attends over itself only); the same tokens as one sequence would attend over each other,
    each prompt costing more than the last."""
    setup = Setup.build("Qwen/Qwen3-32B", "H100-SXM-80GB", tp=2, max_model_len=8192)
    shape, cal = perf.shape_for(setup), perf.calibration_for("H100-SXM-80GB")
    b, ctx, p = 32.0, 32 * 2000.0, 4096.0

    def step(k: int, chunked: bool = True) -> float:
        return perf.step_time_shape(shape, cal, b, ctx, k * p, prefill_chunks=((p, 0.0),) * k if chunked else ())

    assert step(3) - step(2) == pytest.approx(step(2) - step(1), rel=1e-6)
    assert step(3, False) - step(2, False) > 1.03 * (step(2, False) - step(1, False))
    # one chunk given either way is the same step
    assert perf.step_time_shape(shape, cal, b, ctx, p, 1000.0, prefill_chunks=((p, 1000.0),)) \
        == perf.step_time_shape(shape, cal, b, ctx, p, 1000.0)
