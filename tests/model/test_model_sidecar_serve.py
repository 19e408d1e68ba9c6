"""`vllm-drift serve` beside a server whose `/v1/models` root is a local model directory.

The loopback server replays a real vLLM /metrics capture with its served name replaced by one no
catalog knows (`acme-finetune`); its /v1/models `root` points at a directory holding a public
config.json (Qwen2-7B-Instruct's), as a sidecar sees a model volume it shares with vLLM. The daemon
must resolve the model from that directory and export predictions for it; with no root it cannot.
"""
import json
import shutil
from pathlib import Path

import pytest

import loopback
from conftest import shared_path
from test_serve import Daemon, samples, wait_for



def _capture() -> bytes:
    path = shared_path("fixtures", "prom", "vllm-0.10.1-v1-ngc2509-qwen3-4b.prom")
    return path.read_bytes().replace(b'model_name="Qwen/Qwen3-4B-Instruct-2507-FP8"',
                                     b'model_name="acme-finetune"')


def _serve(tmp_path, cli_env, models: dict) -> str:
    # gpu L4: an H100 hint would hold ~50 GiB more KV than this capture's pool, and the daemon
    # (rightly) reports hint_mismatch and predicts nothing from the hinted hardware
    site = loopback.Site(loopback.static({"/metrics": _capture(), "/version": b'{"version":"0.10.1"}',
                                          "/v1/models": json.dumps(models).encode()}))
    with site:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\n"
                       f"targets:\n  - url: {site.url}\n    gpu: L4\n")
        with Daemon(cfg, cli_env) as d:
            stamps = set()

            def evaluated():
                # three evaluations: the first may run before /v1/models (and its root) was read
                m = d.metrics()
                if any("acme-finetune" in k for k in samples(m, "vllm_drift_evaluation_status")):
                    stamps.update(samples(m, "vllm_drift_last_evaluation_timestamp_seconds").values())
                return m if len(stamps) >= 3 else None
            return wait_for(evaluated, timeout=60)


def test_a_v1_models_root_that_is_a_local_model_dir_gets_predictions(tmp_path, cli_env):
    src = shared_path("fixtures", "prom")
    if not src.is_dir():
        pytest.skip(f"{src} absent")
    model_dir = tmp_path / "models" / "acme-finetune"
    model_dir.mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs" / "Qwen--Qwen2-7B-Instruct" / "config.json", model_dir)
    with_root = {"object": "list", "data": [{"id": "acme-finetune", "object": "model",
                                             "root": str(model_dir), "max_model_len": 32768}]}
    metrics = _serve(tmp_path, cli_env, with_root)
    kv = samples(metrics, "vllm_drift_predicted_kv_cache_tokens")
    assert any('model_name="acme-finetune"' in k for k in kv), sorted(kv)
    assert all(v > 0 for v in kv.values())
    # control: the same server without a root; the served name alone resolves nowhere
    without = {"object": "list", "data": [{"id": "acme-finetune", "object": "model", "max_model_len": 32768}]}
    metrics = _serve(tmp_path, cli_env, without)
    assert not samples(metrics, "vllm_drift_predicted_kv_cache_tokens")
