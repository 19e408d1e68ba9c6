"""Hostile or odd input never escapes as an unexpected exception and never injects into our output."""
import json
import string
import subprocess
import sys

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

import loopback
from exporter.config import config_from_dict, load_config
from exporter.errors import ConfigError
from daemons import Daemon, get, wait_for

NASTY = 'evil"} vllm_drift_target_up{target="x"} 1\n# TYPE injected gauge\nü\\n\u2028'


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def test_label_values_from_a_target_cannot_inject_series(tmp_path, cli_env):
    name = _escape(NASTY)
    body = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine="0",model_name="{name}"}} 2.0\n'
            f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine="0",model_name="{name}"}} 0.0\n'
            f'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} 0.5\n').encode()
    version = json.dumps({"version": 'v"1\n2'}).encode()
    with loopback.Site(loopback.static({"/metrics": body, "/version": version, "/v1/models": b'{"data": []}'})) as site:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"scrape: {{interval: 1s, timeout: 1s}}\nevaluation: {{interval: 2s, window: 60s}}\ntargets:\n  - url: {site.url}\n")
        d = Daemon(cfg, cli_env)
        try:
            text = wait_for(lambda: (lambda t: t if "vllm_drift_target_info{" in t else None)(d.metrics()))
            fams = {f.name: f for f in text_string_to_metric_families(text)}   # the whole output still parses
            assert "injected" not in fams
            ups = [s for s in fams["vllm_drift_target_up"].samples]
            assert [s.labels["target"] for s in ups] == [site.url]
            info = fams["vllm_drift_target_info"].samples
            assert len(info) == 1 and info[0].labels["model_name"] == NASTY
            assert info[0].labels["vllm_version"] == 'v"1\n2'
            wait_for(lambda: get(d.url + "/-/ready")[0] == 200)
            doc = json.loads(get(d.url + "/api/v1/findings")[1])
            assert doc["targets"][0]["model_name"] == NASTY
        finally:
            d.stop()


KEYS = st.sampled_from(["listen", "scrape", "evaluation", "targets", "file_sd", "prices", "state_dir", "web",
                        "interval", "timeout", "url", "gpu", "tp", "slo", "window", "shard", "kubernetes", "bogus"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
                   st.text(string.printable, max_size=20), st.sampled_from(["15s", "2m", "16MiB", "http://h:1", "0.0.0.0:1"]))
DOCS = st.recursive(LEAVES, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(KEYS, kids, max_size=5)),
                    max_leaves=25)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCS)
def test_config_loader_fuzz_only_raises_config_error(doc):
    try:
        config_from_dict(doc, source="fuzz.yaml")
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("fuzz.yaml") and "\n" not in msg


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_config_file_fuzz_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fz") / "c.yaml"
    p.write_bytes(data)
    try:
        load_config(p)
    except ConfigError as exc:
        assert str(exc).startswith(str(p))


def test_scan_on_garbage_exits_2_with_one_line(tmp_path, cli_env):
    for i, blob in enumerate([b"\x00\xff" * 100, b"<html>oops</html>", b"vllm:x{a=\"1\" 1\n", yaml.dump({"a": 1}).encode()]):
        p = tmp_path / f"g{i}.prom"
        p.write_bytes(blob)
        out = subprocess.run([sys.executable, "-m", "exporter", "scan", str(p)], capture_output=True, text=True,
                             env=cli_env, timeout=60)
        assert out.returncode == 2, (blob, out.stderr)
        assert out.stderr.strip().count("\n") == 0 and str(p) in out.stderr
