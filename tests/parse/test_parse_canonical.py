"""Canonicalisation of real vLLM captures of three eras, of data-parallel engines, and refusal of
what is not a vLLM engine. Expected values are read independently with prometheus_client."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.errors import ParseError
from exporter.parse import NotAnEngineError, NoVllmMetricsError, parse_vllm
from exporter.parse.eras import VersionRange, guess_version
from conftest import SHARED, VLLM_CPU

PROM = SHARED / "fixtures" / "prom"


def capture(version: str) -> Path:
    paths = sorted(PROM.glob(f"vllm-{version}-*.prom"))
    if not paths:
        pytest.skip(f"shared capture for vLLM {version} not found under {PROM}")
    return paths[0]


def stock_samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def total(samples, name, **match) -> float | None:
    vals = [s.value for s in samples if s.name == name
            and all(s.labels.get(k) == v for k, v in match.items())]
    return sum(vals) if vals else None


def stock_histogram(samples, base: str):
    buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name == base + "_bucket")
    return (tuple(b for b, _ in buckets), tuple(c for _, c in buckets),
            total(samples, base + "_sum"), total(samples, base + "_count"))


@pytest.mark.parametrize("version,era,new_kv", [("0.10.1", "v1", True), ("0.11.0", "v1", True),
                                                ("0.7.0", "v0", False)])
def test_real_capture_canonical_values(version, era, new_kv):
    path = capture(version)
    raw = path.read_bytes()
    samples = stock_samples(raw.decode("utf-8"))
    snaps = parse_vllm(raw, target="http://t:8000", timestamp=1234.5)
    models = {s.labels["model_name"] for s in samples if "model_name" in s.labels}
    assert [s.model_name for s in snaps] == sorted(models)
    snap = snaps[0]
    assert (snap.target, snap.timestamp, snap.engine_era, snap.engines) == ("http://t:8000", 1234.5, era, 1)
    kv_name = "vllm:kv_cache_usage_perc" if new_kv else "vllm:gpu_cache_usage_perc"
    assert snap.gauges["kv_cache_usage"] == total(samples, kv_name)
    for key in ("num_requests_running", "num_requests_waiting"):
        assert snap.gauges[key] == total(samples, f"vllm:{key}")
    for key in ("num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
                "request_success_total"):
        assert snap.counters[key] == total(samples, f"vllm:{key}")
    reasons = {s.labels["finished_reason"] for s in samples if s.name == "vllm:request_success_total"}
    assert snap.finished_by_reason == {r: total(samples, "vllm:request_success_total", finished_reason=r)
                                       for r in reasons}
    info = next(s for s in samples if s.name == "vllm:cache_config_info")
    assert dict(snap.cache_config) == {k: v for k, v in info.labels.items() if k != "engine"}
    assert snap.kv_cache_tokens() == int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"])
    created = [s.value for s in samples if s.name.startswith("vllm:") and s.name.endswith("_created")]
    assert snap.start_time == (min(created) if created else None)
    # the version the provenance note establishes lies in the guessed range
    low, _, high = snap.version_guess.partition(",")
    assert VersionRange(low.removeprefix(">="), high.lstrip("<="), high.startswith("<") and
                        not high.startswith("<=")).contains(version)


def test_v1_histograms_use_scraped_buckets():
    raw = capture("0.10.1").read_bytes()
    samples = stock_samples(raw.decode())
    snap = parse_vllm(raw, target="t", timestamp=0.0)[0]
    for key, base in (("ttft_seconds", "vllm:time_to_first_token_seconds"),
                      ("itl_seconds", "vllm:time_per_output_token_seconds"),  # 0.10.1: old name only
                      ("e2e_seconds", "vllm:e2e_request_latency_seconds"),
                      ("prompt_tokens", "vllm:request_prompt_tokens"),
                      ("iteration_tokens", "vllm:iteration_tokens_total")):
        bounds, counts, hsum, hcount = stock_histogram(samples, base)
        h = snap.histograms[key]
        assert (h.bounds, h.counts, h.sum, h.count) == (bounds, counts, hsum, hcount), key
    assert "tpot_seconds" not in snap.histograms  # request TPOT exists from 0.11.0 only
    assert "tpot_seconds" in parse_vllm(capture("0.11.0").read_bytes(), target="t", timestamp=0)[0].histograms


def test_deprecated_and_new_names_are_not_double_counted():
    raw = capture("0.10.1").read_bytes()
    samples = stock_samples(raw.decode())
    snap = parse_vllm(raw, target="t", timestamp=0.0)[0]
    # 0.10.1 shows both gpu_prefix_cache_* (DEPRECATED) and prefix_cache_*
    assert total(samples, "vllm:gpu_prefix_cache_queries_total") is not None
    assert snap.counters["prefix_cache_queries_total"] == total(samples, "vllm:prefix_cache_queries_total")
    assert snap.counters["prefix_cache_hits_total"] == total(samples, "vllm:prefix_cache_hits_total")
    # with differing values the new name wins
    text = ('# TYPE vllm:gpu_cache_usage_perc gauge\n'
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n')
    assert parse_vllm(text, target="t", timestamp=0)[0].gauges["kv_cache_usage"] == 0.5


def test_partial_v0_capture_reports_what_it_has():
    raw = capture("0.7.0").read_bytes()
    snap = parse_vllm(raw, target="t", timestamp=0.0)[0]
    assert snap.gauges["num_requests_swapped"] == 0.0
    assert snap.gauges["prefix_cache_hit_rate"] == -1.0
    assert set(snap.histograms) == {"iteration_tokens"}
    h = snap.histograms["iteration_tokens"]
    assert h.bounds[:4] == (1.0, 2.0, 4.0, 8.0) and h.bounds[-1] == 96.0  # CUDA-graph sizes
    assert any("no +Inf bucket" in n for n in snap.notes)
    assert "vllm:lora_requests_info" in snap.families


def test_families_are_exposed_names_without_created():
    snap = parse_vllm(capture("0.11.0").read_bytes(), target="t", timestamp=0)[0]
    assert "vllm:request_time_per_output_token_seconds" in snap.families
    assert "vllm:num_preemptions_total" in snap.families
    assert not any(f.endswith("_created") for f in snap.families)


TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.4
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.9
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="llama"} 250.0
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="llama"} 1700000010.0
vllm:prompt_tokens_created{engine="1",model_name="llama"} 1700000005.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama"} 4.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama"} 1.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="llama"} 6.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="llama"} 2.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="llama",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="llama",position="1"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="llama"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="llama"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="llama"} 6.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="llama"} 6.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="llama"} 30.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="llama"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="2.0",model_name="llama"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="llama"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"""


def test_data_parallel_engines_are_aggregated():
    (snap,) = parse_vllm(TWO_ENGINES, target="t", timestamp=0)
    assert snap.engines == 2 and snap.engine_era == "v1"
    assert snap.gauges == {"num_requests_running": 8.0, "num_requests_waiting": 1.0, "kv_cache_usage": 0.9}
    assert snap.counters["prompt_tokens_total"] == 350.0
    assert snap.counters["request_success_total"] == 13.0
    assert snap.finished_by_reason == {"stop": 10.0, "length": 3.0}
    assert snap.spec_accepted_per_pos == (10.0, 5.0)
    assert snap.start_time == 1700000005.0
    h = snap.histograms["ttft_seconds"]
    assert (h.bounds, h.counts, h.sum, h.count) == ((0.1, 1.0, math.inf), (3.0, 5.0, 10.0), 32.0, 10.0)
    # layouts differ across engines: not summed, and said so
    assert "e2e_seconds" not in snap.histograms
    assert any("vllm:e2e_request_latency_seconds" in n and "differ" in n for n in snap.notes)
    assert dict(snap.cache_config) == {"block_size": "16", "num_gpu_blocks": "1000"}


def test_cache_config_attached_to_every_model():
    text = ('vllm:num_requests_running{model_name="a"} 1\n'
            'vllm:num_requests_running{model_name="b"} 2\n'
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="7"} 1\n')
    snaps = parse_vllm(text, target="t", timestamp=0)
    assert [(s.model_name, s.gauges["num_requests_running"], s.kv_cache_tokens()) for s in snaps] == \
        [("a", 1.0, 224), ("b", 2.0, 224)]


def test_era_from_help_text_without_engine_label():
    v1 = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
          "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0.0\n")
    v0 = v1.replace("in model execution batches.", "currently running on GPU.")
    assert parse_vllm(v1, target="t", timestamp=0)[0].engine_era == "v1"
    assert parse_vllm(v0, target="t", timestamp=0)[0].engine_era == "v0"


@pytest.mark.parametrize("name,expected", [
    ("vllm:kv_cache_usage_perc", ">=0.9.2"),
    ("vllm:request_time_per_output_token_seconds", ">=0.11.0"),
    ("vllm:time_per_output_token_seconds", ">=0.7.1,<=0.14.1"),
])
def test_version_guess_from_one_family(name, expected):
    assert str(guess_version(frozenset({name}), "v1", None, False)) == expected


def router_exposition(active: bool) -> bytes:
    """What the production-stack router serves: its metric declarations (names, types, label
    names as in vllm_router/services/metrics_service) rendered by prometheus_client, fresh (no
    backend seen yet: HELP/TYPE only) or active."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    gauges = {n: Gauge(n, n, ["server"], registry=reg) for n in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_prefix_cache_hit_rate",
        "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", "vllm:current_qps",
        "vllm:avg_decoding_length", "vllm:num_prefill_requests", "vllm:num_decoding_requests",
        "vllm:healthy_pods_total", "vllm:avg_latency", "vllm:avg_itl", "vllm:num_requests_swapped")}
    incoming = Counter("vllm:num_incoming_requests", "incoming", ["model"], registry=reg)
    Counter("vllm:input_tokens_total", "input", ["server", "model"], registry=reg)
    Histogram("vllm:request_latency_seconds", "latency", ["server", "model", "status"], registry=reg)
    if active:
        for g in gauges.values():
            g.labels(server="http://10.0.0.5:8000").set(2)
        incoming.labels(model="llama").inc(3)
    return generate_latest(reg)


@pytest.mark.parametrize("active", [False, True])
def test_production_stack_router_is_refused(active):
    with pytest.raises(NotAnEngineError, match="not a vLLM engine: looks like the production-stack router"):
        parse_vllm(router_exposition(active), target="t", timestamp=0)
    # a single re-exported engine name with the router's `server` label is enough
    text = 'vllm:num_requests_running{server="http://10.0.0.5:8000"} 2.0\n'
    with pytest.raises(NotAnEngineError, match="production-stack router"):
        parse_vllm(text, target="t", timestamp=0)


def test_endpoint_without_vllm_metrics_is_refused():
    # a real vLLM server's non-vllm families (what --disable-log-stats leaves)
    raw = capture("0.10.1").read_text()
    others = "\n".join(line for line in raw.splitlines() if "vllm:" not in line)
    assert "process_cpu_seconds_total" in others
    with pytest.raises(NoVllmMetricsError, match=r"no vllm: metrics \(is --disable-log-stats set"):
        parse_vllm(others.encode(), target="t", timestamp=0)
    with pytest.raises(NoVllmMetricsError):
        parse_vllm(b"", target="t", timestamp=0)


def test_html_and_json_bodies_are_refused():
    with pytest.raises(ParseError, match="HTML"):
        parse_vllm(b"\n<html><body><h1>502 Bad Gateway</h1></body></html>", target="t", timestamp=0)
    with pytest.raises(ParseError, match="JSON"):
        parse_vllm(b'{"detail":"Not Found"}', target="t", timestamp=0)


def test_malformed_vllm_line_fails_with_line_number():
    raw = capture("0.11.0").read_text().splitlines()
    idx = next(i for i, line in enumerate(raw) if line.startswith("vllm:num_requests_waiting{"))
    raw[idx] = raw[idx].replace("} 0.0", "} zero")
    with pytest.raises(ParseError, match=rf"line {idx + 1}: .*vllm:num_requests_waiting"):
        parse_vllm("\n".join(raw), target="t", timestamp=0)


@pytest.mark.parametrize("old,new,kind,key", [
    ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "gauge", "kv_cache_usage"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total", "counter",
     "prefix_cache_queries_total"),
    ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds", "histogram", "itl_seconds"),
    ("vllm:time_in_queue_requests", "vllm:request_queue_time_seconds", "histogram", "queue_time_seconds"),
])
def test_newer_name_wins_whichever_comes_first(old, new, kind, key):
    def fam(name, value):
        if kind != "histogram":
            return f"# TYPE {name} {kind}\n{name}{{model_name=\"m\"}} {value}\n"
        return (f"# TYPE {name} histogram\n{name}_bucket{{le=\"1.0\",model_name=\"m\"}} {value}\n"
                f"{name}_bucket{{le=\"+Inf\",model_name=\"m\"}} {value}\n"
                f"{name}_count{{model_name=\"m\"}} {value}\n{name}_sum{{model_name=\"m\"}} 0.5\n")
    for text in (fam(old, 3) + fam(new, 7), fam(new, 7) + fam(old, 3)):
        snap = parse_vllm(text, target="t", timestamp=0)[0]
        got = {"gauge": snap.gauges, "counter": snap.counters}.get(kind, snap.histograms)[key]
        assert (got.count if kind == "histogram" else got) == 7


def _openmetrics(text: str) -> str:
    """The same families rendered by prometheus_client's OpenMetrics writer (what a server
    answers to `Accept: application/openmetrics-text`): counters declared without _total,
    `# EOF` at the end. UTF-8 escaping keeps the `vllm:` names as they are."""
    from prometheus_client.openmetrics.exposition import ALLOWUTF8, generate_latest
    from prometheus_client.registry import CollectorRegistry

    fams = list(text_string_to_metric_families(text))

    class Replay:
        def collect(self):
            return fams

    reg = CollectorRegistry()
    reg.register(Replay())
    return generate_latest(reg, escaping=ALLOWUTF8).decode()


@pytest.mark.parametrize("version", ["0.10.1", "0.11.0", "0.7.0"])
def test_openmetrics_rendering_gives_the_same_snapshot(version):
    text = capture(version).read_text()
    om = _openmetrics(text)
    assert om.rstrip().endswith("# EOF") and "# TYPE vllm:prompt_tokens counter" in om
    assert parse_vllm(om, target="t", timestamp=5.0) == parse_vllm(text, target="t", timestamp=5.0)


def test_ray_exported_copies_are_named_in_the_refusal():
    text = ('# TYPE ray_vllm:num_requests_running gauge\n'
            'ray_vllm:num_requests_running{Component="core",model_name="m"} 1.0\n')
    with pytest.raises(NoVllmMetricsError, match="Ray"):
        parse_vllm(text, target="t", timestamp=0)


def test_mixed_era_fleet_through_one_reader():
    """Captures of different eras read by one (shared, cached) reader, in both orders, give the
    same snapshots as read alone, with the same canonical keys for the same signals."""
    from exporter.parse.canonical import READER
    from exporter.parse.exposition import Reader

    paths = sorted(PROM.glob("*.prom")) + sorted(VLLM_CPU.glob("*load-b*.prom"))
    if len(paths) < 3:
        pytest.skip(f"shared captures not found under {PROM}")
    alone = {p: parse_vllm(p.read_bytes(), target=str(p), timestamp=1.0,
                           reader=Reader(("vllm:", "ray_vllm"), names_only=READER.names_only))
             for p in paths}
    shared = Reader(("vllm:", "ray_vllm"), names_only=READER.names_only)
    for order in (paths, paths[::-1], paths + paths):
        for p in order:
            assert parse_vllm(p.read_bytes(), target=str(p), timestamp=1.0, reader=shared) == alone[p]
    eras = {p.name.split("-")[1]: alone[p][0].engine_era for p in paths}
    assert eras["0.7.0"] == "v0" and eras["0.10.1"] == eras["0.11.0"] == "v1"
    for p in paths:
        snap = alone[p][0]
        assert {"kv_cache_usage", "num_requests_running", "num_requests_waiting"} <= set(snap.gauges)
        assert {"prompt_tokens_total", "generation_tokens_total", "num_preemptions_total"} <= set(snap.counters)


def test_refusals_carry_their_scrape_error_reason():
    cases = [(router_exposition(True), "router"), (b"python_info 1.0\n", "not_vllm"),
             (b"<html>oops</html>", "parse"), (b'vllm:num_requests_running{model_name="m} 1\n', "parse")]
    for body, reason in cases:
        with pytest.raises(ParseError) as info:
            parse_vllm(body, target="t", timestamp=0)
        assert info.value.reason == reason, body


def _moved(text: str, rng) -> str:
    """The same exposition with every numeric sample value changed (a later scrape)."""
    out = []
    for line in text.split("\n"):
        head, sep, token = line.rpartition(" ")
        if sep and not line.startswith("#"):
            try:
                value = float(token)
            except ValueError:
                out.append(line)
                continue
            if math.isfinite(value):
                token = repr(round(value * rng.choice((0, 1, 1.5, 3)) + rng.randint(0, 40), 3))
            out.append(head + " " + token)
        else:
            out.append(line)
    return "\n".join(out)


def test_a_seen_shape_replays_to_the_same_snapshots_as_a_fresh_reading():
    """parse_vllm keeps the canonical mapping of an exposition's shape and only routes the next
    scrape's values through it: the snapshots equal those of a reading without the shape cache,
    for every capture and era, data-parallel engines included."""
    import random

    from exporter.parse.canonical import Reader, READER, canonicalise

    rng = random.Random(7)
    paths = sorted(PROM.glob("*.prom")) + sorted(VLLM_CPU.glob("*.prom"))
    if not paths:
        pytest.skip(f"no captures under {PROM} or {VLLM_CPU}")
    texts = [p.read_text(encoding="utf-8") for p in paths] + [TWO_ENGINES]
    plain = Reader(READER.prefixes, names_only=READER.names_only, max_shapes=0)
    reader = Reader(READER.prefixes, names_only=READER.names_only)
    replayed = 0
    for text in texts:
        try:
            parse_vllm(text, target="t", timestamp=1.0, reader=reader)
        except ParseError:
            continue
        for k in range(3):
            moved = _moved(text, rng)
            fresh = canonicalise(plain.parse(moved), target="t", timestamp=2.0 + k)
            assert parse_vllm(moved, target="t", timestamp=2.0 + k, reader=reader) == fresh
            replayed += 1
    assert replayed >= 3 * len(paths) and reader.cache_sizes()["shapes"] >= len(paths) // 2
