"""Hints against what the server shows: a GPU hint its KV pool contradicts (hint_mismatch, naming the
GPU the pool fits, and nothing scored from the wrong hardware), a device with no catalog row
(described from the pool: KV findings at once, step-time findings only `info`, basis
"unprofiled"), a non-GPU device (observation findings only), max_num_seqs inferred and labelled,
and length stops read as vLLM counts them. Simulated servers in sim time; histograms as vLLM
builds them (1-2-5 buckets)."""
from __future__ import annotations

from exporter.drift.observe import context_share
from exporter.parse.snapshot import Histogram
from sim_feed import SimServer, Scraper, loud

GPU_MODEL_FINDINGS = {"tier_misplacement", "gpu_memory_utilization", "kv_cache_dtype", "speculative_decoding"}


def run(server, scraper, until, every=15.0, evaluate_every=30.0):
    t, r = 0.0, None
    while t <= until + 1e-9:
        scraper.observe(server.scrape(t, scraper.spec.url))
        if t and t % evaluate_every < 1e-9:
            r = scraper.evaluate(t)
        t += every
    return r


def test_an_h100_hint_on_an_l4_server_is_a_mismatch_naming_the_l4():
    server = SimServer("healthy", seed=1)
    r = run(server, Scraper(server, gpu="H100", window_s=120), 180)
    [mm] = [f for f in r.findings if f.finding == "hint_mismatch"]
    assert mm.severity == "warning" and mm.configured.startswith("H100")
    # the L4 is named (with the cards of its memory class, whose pools are alike)
    assert "L4" in mm.explanation.split("it matches ")[1] and mm.recommended in ("L4", "A30", "A10G")
    assert 0.05 < float(mm.explanation.split(" is ")[1].split("x")[0]) < 0.12      # about a twelfth of an H100's
    # nothing from the wrong hardware: no tier, cost or capacity prediction
    assert r.tier is None and r.waste_dollars_per_hour is None and r.predicted_kv_cache_tokens is None
    assert not {f.finding for f in r.findings} & {"tier_misplacement"}
    assert any("GPU hint looks wrong" in n for n in r.notes)


def test_the_right_hint_is_no_mismatch():
    server = SimServer("healthy", seed=1)
    r = run(server, Scraper(server, window_s=120), 180)
    assert r.finding_status["hint_mismatch"]["status"] == "ok"
    assert "hint_mismatch" not in {f.finding for f in r.findings}
    assert r.prediction_basis in ("prior", "calibrated") and r.predicted_kv_cache_tokens


def test_a_gpu_without_a_row_gets_kv_findings_at_once_and_step_time_ones_at_info():
    server = SimServer("kv-pressure", seed=1)
    scraper = Scraper(server, gpu="Tesla-Q99-24GB", window_s=120)
    first = run(server, scraper, 30)
    assert "kv_pressure" in loud(first)                  # from vLLM's own pool, first evaluation
    r = run(SimServer("kv-pressure", seed=1), Scraper(server, gpu="Tesla-Q99-24GB", window_s=120), 240)
    assert r.prediction_basis == "unprofiled" and r.predicted_tpot_seconds is not None
    assert "kv_pressure" in loud(r)
    assert r.finding_status["tier_misplacement"]["status"] == "unavailable"
    for f in r.findings:
        if f.binding in ("tpot_slo", "ttft_slo", "verify_cost", "low_acceptance", "missed_gain", "slo", "cost"):
            assert f.severity == "info"
    assert any("unprofiled prior" in n for n in r.notes)


def test_a_non_gpu_device_hint_gets_observation_findings_only():
    server = SimServer("kv-pressure", seed=1)
    r = run(server, Scraper(server, gpu="TPU v5e", window_s=120), 180)
    assert r.derived["backend"] == "tpu" and r.derived["observation_only"]
    assert "kv_pressure" in loud(r)
    assert not {f.finding for f in r.findings} & GPU_MODEL_FINDINGS
    assert r.tier is None and r.predicted_tpot_seconds is None


def test_max_num_seqs_inferred_from_the_plateau_is_labelled_inferred():
    server = SimServer("max-num-seqs-too-low", seed=1)
    r = run(server, Scraper(server, window_s=120), 240)
    assert r.derived["max_num_seqs_source"].startswith("inferred")
    assert r.configured["max_num_seqs"] == server.sc.flags.max_num_seqs == 6
    [f] = [f for f in r.findings if f.finding == "max_num_seqs"]
    assert "inferred" in f.explanation


BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, float("inf"))


def hist(values):
    counts = tuple(float(sum(1 for v in values if v <= b)) for b in BUCKETS)
    return Histogram(BUCKETS, counts, float(sum(values)), float(len(values)))


def test_length_stops_at_max_tokens_are_not_the_context():
    """Issue 22's server: every request asked for 1,024 tokens and got them (finished_reason
    "length"); a p99 interpolated in (1000, 2000] said 1,707. Not max_model_len's doing."""
    gen = maxtok = hist([1024] * 200)
    assert gen.quantile(0.99) > 1500                      # what interpolation alone would claim
    assert context_share(1.0, 4096, 600.0, 1800.0, gen, maxtok) == 0.0
    # prompts too short for any request to reach the context, whatever max_tokens
    assert context_share(1.0, 8192, 300.0, 450.0, hist([100] * 50), hist([200] * 50)) == 0.0
    # requests sent without max_tokens get max_model_len - prompt: they do reach the context
    prompts = [3000] * 100
    asked = [4096 - p for p in prompts]
    assert context_share(0.9, 4096, 3000.0, 3000.0, hist(asked), hist(asked)) == 0.9
    # without request_params_max_tokens the length share stands as it is
    assert context_share(0.3, 4096, 600.0, 1800.0, gen, None) == 0.3


def test_an_eager_server_is_predicted_as_one():
    """A server run with --enforce-eager (a `targets[]` hint, or a pod's `vllm serve` argument as
    the label Kubernetes discovery sets) is predicted without CUDA graphs: at a light load its
    step is the host launching every layer's kernels, so its a-priori TPOT is slower than the
    same server's with graphs, from the same observations."""
    from exporter.model.perf import EAGER_LAYER_LAUNCH_S
    reports = {}
    for name, hints in (("graphs", {}), ("eager", {"enforce_eager": True}),
                        ("label", {"labels": {"enforce_eager": "true"}})):
        server = SimServer("idle-overprovisioned", seed=3)
        reports[name] = run(server, Scraper(server, window_s=120, **hints), 180)
    graphs, eager, label = (reports[k].prior_tpot_seconds for k in ("graphs", "eager", "label"))
    assert graphs and eager and label == eager
    layers = 32      # the scenario's Llama-3.1-8B, on an H100 at a light load
    assert eager >= layers * EAGER_LAYER_LAUNCH_S > graphs


def test_a_pool_given_in_bytes_is_not_a_gpu_memory_utilization_question():
    """A server whose pool was given by --kv-cache-memory-bytes (cache_config_info says so) under
    KV pressure: kv_pressure names the flag, no gpu_memory_utilization finding (vLLM ignores it
    for such a pool), and the small pool is no sign of a wrong GPU hint."""
    server = SimServer("small-pool-pressure", seed=1)
    r = run(server, Scraper(server, window_s=120), 180)
    [kv] = [f for f in r.findings if f.finding == "kv_pressure"]
    assert kv.severity in ("warning", "critical") and "sized by --kv-cache-memory-bytes" in kv.explanation
    assert not {f.finding for f in r.findings} & {"gpu_memory_utilization", "hint_mismatch"}
