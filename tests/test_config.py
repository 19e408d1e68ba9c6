"""Config loading and validation: defaults, units, and errors that name the file and key."""
import pytest

from exporter.config import Config, build_config, load_config, parse_duration, parse_size, SIDECAR_TARGET
from exporter.errors import ConfigError


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_no_file_no_targets_is_a_sidecar():
    cfg = build_config(None)
    assert [t.url for t in cfg.targets] == [SIDECAR_TARGET]
    assert cfg.listen == "0.0.0.0:9877"
    assert cfg.scrape.interval == 15 and cfg.scrape.timeout == 5 and cfg.scrape.max_body_bytes == 16 * 2**20
    assert cfg.evaluation.interval == 30 and cfg.evaluation.window == 600


@pytest.mark.parametrize("text,seconds", [("15s", 15), ("2m", 120), ("1h30m", 5400), ("250ms", 0.25), (7, 7), ("1.5", 1.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "15x", "-1s", "s", "0s", True, None])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text,size", [("16MiB", 16 * 2**20), ("10MB", 10**7), (4096, 4096), ("1 GiB", 2**30), ("512", 512)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_full_example_from_the_contract(tmp_path):
    p = write(tmp_path, """
listen: 127.0.0.1:9999
scrape: {interval: 15s, timeout: 5s, max_body_bytes: 16MiB, concurrency: 64}
evaluation: {interval: 30s, window: 10m}
targets:
  - url: http://10.0.0.5:8000
    gpu: H100-SXM-80GB
    tp: 2
    slo: {ttft_p99: 2s, tpot_p99: 80ms}
file_sd: [/etc/vllm-drift/targets/*.json]
kubernetes: {namespace: llm, label_selector: app=vllm, port: 8000}
prices: {H100-SXM-80GB: 3.00}
state_dir: /var/lib/vllm-drift
""")
    cfg = load_config(p)
    t = cfg.targets[0]
    assert (t.url, t.gpu, t.tp) == ("http://10.0.0.5:8000", "H100-SXM-80GB", 2)
    assert t.slo.ttft_p99 == 2 and t.slo.tpot_p99 == pytest.approx(0.08)
    assert cfg.evaluation.window == 600 and cfg.kubernetes.namespace == "llm"
    assert cfg.prices["H100-SXM-80GB"] == 3.0


@pytest.mark.parametrize("text,expected", [
    ("targets:\n  - url: http://a:8000\n  - url: http://b:8000\n  - url: http://c:8000\n  - url: not-a-url\n",
     "targets[3].url: not a URL"),
    ("scrape: {intervall: 15s}\n", "scrape.intervall: unknown key"),
    ("bogus: 1\n", "bogus: unknown key"),
    ("scrape: {interval: 5s, timeout: 10s}\n", "scrape: timeout (10s) must not exceed interval (5s)"),
    ("scrape: {interval: fast}\n", "scrape.interval: expected a duration"),
    ("scrape: {max_body_bytes: lots}\n", "scrape.max_body_bytes: expected a size"),
    ("targets:\n  - gpu: H100\n", "targets[0].url: required key is missing"),
    ("targets:\n  - url: http://a:8000\n    tp: 0\n", "targets[0].tp:"),
    ("targets:\n  - url: http://a:8000\n    quantization: fp9\n", "targets[0].quantization: unknown quantization 'fp9'"),
    ("listen: 9877\n", "listen: expected HOST:PORT"),
    ("- just\n- a list\n", "the top level must be a mapping"),
    ("targets: [\n", "not valid YAML"),
    ("shard: {index: 3, count: 3}\n", "shard: index (3) must be below count (3)"),
    ("web: {tls_cert_file: a.pem}\n", "web: tls_cert_file and tls_key_file go together"),
    ("targets:\n  - url: http://a:8000\n  - url: http://a:8000/\n", "is listed twice"),
])
def test_errors_name_file_and_key(tmp_path, text, expected):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert msg.startswith(str(p)), msg
    assert expected in msg, msg
    assert "\n" not in msg


def test_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        load_config("/nonexistent/vllm-drift.yaml")


def test_cli_targets_extend_file_and_are_validated(tmp_path):
    p = write(tmp_path, "targets:\n  - url: http://a:8000\n")
    cfg = build_config(str(p), targets=["http://b:8000/metrics", "http://a:8000"], listen="127.0.0.1:1")
    assert [t.url for t in cfg.targets] == ["http://a:8000", "http://b:8000"]
    with pytest.raises(ConfigError, match="--target #1: not a URL"):
        build_config(None, targets=["ftp://x"])
    with pytest.raises(ConfigError, match="--listen"):
        build_config(None, listen="nope")


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(Exception):
        cfg.listen = "x"
