"""GPU telemetry: dcgm-exporter text (written here in its real format: field names, HELP/TYPE,
the labels dcgm-exporter 3.x attaches with Kubernetes pod mapping on) served over loopback,
parsed, joined to targets by pod, node and host, and exported by a real `vllm-drift serve`."""
from __future__ import annotations

import json

import pytest

import loopback
from exporter.config import DCGMConfig, TargetSpec
from exporter.telemetry.dcgm import GpuIndex, parse_dcgm
from daemons import Daemon, get, samples, wait_for


def dcgm_text(gpus: list[dict]) -> bytes:
    """An exposition as dcgm-exporter writes it (default counters CSV, pod mapping on)."""
    fields = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util"),
        ("DCGM_FI_DEV_FB_FREE", "Frame buffer memory free (in MB).", "free"),
        ("DCGM_FI_DEV_FB_USED", "Frame buffer memory used (in MB).", "used"),
        ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "clock"),
        ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "sm"),
    ]
    out = []
    for name, help_, key in fields:
        out.append(f"# HELP {name} {help_}\n# TYPE {name} gauge\n")
        for g in gpus:
            if g.get(key) is None:
                continue
            labels = (f'gpu="{g["index"]}",UUID="{g["uuid"]}",pci_bus_id="00000000:{g["index"]:02d}:00.0",'
                      f'device="nvidia{g["index"]}",modelName="{g["model"]}",Hostname="{g["host"]}",'
                      'DCGM_FI_DRIVER_VERSION="550.54.15"')
            if g.get("pod"):
                labels += f',container="vllm",namespace="{g["ns"]}",pod="{g["pod"]}"'
            out.append(f"{name}{{{labels}}} {g[key]}\n")
    return "".join(out).encode()


NODE_A = [  # an 8-GPU H100 node: two TP=2 pods, the rest idle
    {"index": i, "uuid": f"GPU-a{i}", "model": "NVIDIA H100 80GB HBM3", "host": "gpu-node-a",
     "util": u, "used": used, "free": 81559 - used, "clock": 1980, "sm": sm, "ns": "llm", "pod": pod}
    for i, (u, used, sm, pod) in enumerate([(97, 73000, 0.91, "qwen-0"), (95, 73000, 0.89, "qwen-0"),
                                            (40, 70000, 0.35, "llama-0"), (44, 70000, 0.37, "llama-0"),
                                            (0, 1, 0.0, None), (0, 1, 0.0, None), (0, 1, 0.0, None), (0, 1, 0.0, None)])
]
NODE_B = [  # an L40S box without profiling metrics and without pod mapping
    {"index": 0, "uuid": "GPU-b0", "model": "NVIDIA L40S", "host": "gpu-node-b", "util": 63, "used": 40000,
     "free": 5457, "clock": 2520}
]


def test_parse_and_join_rules():
    a = parse_dcgm(dcgm_text(NODE_A), "10.0.0.1")
    b = parse_dcgm(dcgm_text(NODE_B), "10.0.0.2")
    assert len(a) == 8 and len(b) == 1
    g0 = next(r for r in a if r.uuid == "GPU-a0")
    assert (g0.fb_used_mib, g0.fb_free_mib, g0.sm_active, g0.gpu_util) == (73000, 8559, 0.91, 0.97)
    assert (g0.namespace, g0.pod, g0.hostname, g0.model_name) == ("llm", "qwen-0", "gpu-node-a", "NVIDIA H100 80GB HBM3")
    index = GpuIndex(a + b)

    by_pod = index.join(TargetSpec(url="http://10.9.9.9:8000", labels={"namespace": "llm", "pod": "qwen-0", "node": "gpu-node-a"}))
    assert by_pod.joined_by == "pod" and by_pod.count == 2 and by_pod.catalog_gpu == "H100-SXM-80GB"
    assert by_pod.utilization == pytest.approx((0.91 + 0.89) / 2)           # SM active preferred
    assert by_pod.memory_used_bytes == 2 * 73000 * 2**20 and by_pod.memory_total_bytes == 2 * 81559 * 2**20

    by_node = index.join(TargetSpec(url="http://10.9.9.8:8000", labels={"node": "gpu-node-b"}))
    assert by_node.joined_by == "node" and by_node.catalog_gpu == "L40S"
    assert by_node.utilization == pytest.approx(0.63)                       # GPU_UTIL when no profiling

    by_host = index.join(TargetSpec(url="http://10.0.0.2:8000"))            # same host as its exporter
    assert by_host.joined_by == "host" and by_host.count == 1
    assert index.join(TargetSpec(url="http://10.0.0.77:8000")) is None


def test_malformed_dcgm_line_is_a_parse_error():
    from exporter.errors import ParseError
    with pytest.raises(ParseError):
        parse_dcgm(b'DCGM_FI_DEV_FB_USED{gpu="0",UUID="x" 12\n', None)


def test_config_section():
    cfg = DCGMConfig(urls=["http://127.0.0.1:9400/metrics"])
    assert cfg.urls == ["http://127.0.0.1:9400"] and cfg.interval == 60.0


def test_serve_joins_dcgm_telemetry_to_targets(captures, tmp_path, cli_env):
    """A vLLM target and a DCGM exporter on the same host (127.0.0.1): the daemon learns the
    target's GPU model (it had no `gpu` hint) and exports its utilisation and memory."""
    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    node = [dict(NODE_B[0], host="127.0.0.1")]
    vllm = loopback.Site(loopback.static({"/metrics": body, "/version": b'{"version":"0.10.1"}', "/v1/models": b'{"data":[]}'}))
    dcgm = loopback.Site(loopback.static({"/metrics": dcgm_text(node)}))
    broken = loopback.Site(loopback.status("500 Internal Server Error"))
    with vllm, dcgm, broken:
        cfg = tmp_path / "c.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\n"
                       f"targets:\n  - url: {vllm.url}\n"
                       f"dcgm: {{urls: ['{dcgm.url}', '{broken.url}'], interval: 1s}}\n")
        d = Daemon(cfg, cli_env)
        try:
            key = f'{{target="{vllm.url}"}}'
            body = wait_for(lambda: (t := d.metrics()) and key in samples(t, "vllm_drift_gpu_utilization_ratio") and t)
            assert samples(body, "vllm_drift_gpu_utilization_ratio")[key] == pytest.approx(0.63)
            assert samples(body, "vllm_drift_gpu_memory_used_bytes")[key] == 40000 * 2**20
            assert samples(body, "vllm_drift_gpu_memory_total_bytes")[key] == 45457 * 2**20
            assert samples(body, "vllm_drift_gpu_count")[key] == 1
            info = samples(body, "vllm_drift_gpu_info")
            assert f'{{catalog_gpu="L40S",gpu_model="NVIDIA L40S",joined_by="host",target="{vllm.url}"}}' in info
            # the failing exporter is counted, the good one still used
            assert samples(body, "vllm_drift_discovery_errors_total").get('{source="dcgm"}', 0) >= 1
            targets = json.loads(get(d.url + "/api/v1/targets")[1])["targets"]
            (t,) = targets
            assert t["hints"]["gpu"] == "L40S" and t["gpus"]["catalog_gpu"] == "L40S"
        finally:
            d.stop()


@pytest.mark.skipif(__import__("shutil").which("prometheus") is None, reason="needs the prometheus binary")
def test_query_mode_reads_dcgm_from_prometheus(captures, tmp_path, cli_env):
    """Query mode with `dcgm.from_prometheus`: a real Prometheus scrapes a vLLM target and a
    DCGM exporter; the daemon reads both through it and joins them by host."""
    from daemons import Prometheus

    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    node = [dict(NODE_A[0], host="gpu-node-a", pod=None), dict(NODE_A[1], host="gpu-node-a", pod=None)]
    vllm = loopback.Site(loopback.static({"/metrics": body}))
    dcgm = loopback.Site(loopback.static({"/metrics": dcgm_text(node)}))
    with vllm, dcgm:
        # the DCGM exporter is its own job, as a cluster's Prometheus would have it
        prom = Prometheus(tmp_path, [vllm.url], extra_jobs="  - job_name: dcgm-exporter\n    static_configs:\n"
                          f"      - targets: ['{dcgm.url.split('://')[1]}']\n")
        try:
            wait_for(lambda: len(prom.up()) == 2 and all(v == 1 for v in prom.up().values()), timeout=60)
            cfg = tmp_path / "q.yaml"
            cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 30s}\n"
                           f"prometheus: {{url: '{prom.url}', selector: '{{job=\"vllm\"}}'}}\n"
                           "dcgm: {from_prometheus: true, selector: '{job=\"dcgm-exporter\"}', interval: 1s}\n")
            d = Daemon(cfg, cli_env)
            try:
                key = f'{{target="{vllm.url}"}}'
                body = wait_for(lambda: (t := d.metrics()) and key in samples(t, "vllm_drift_gpu_count") and t, timeout=60)
                assert samples(body, "vllm_drift_gpu_count")[key] == 2
                assert samples(body, "vllm_drift_gpu_utilization_ratio")[key] == pytest.approx((0.91 + 0.89) / 2)
                info = samples(body, "vllm_drift_gpu_info")
                assert any('catalog_gpu="H100-SXM-80GB"' in k and 'joined_by="host"' in k for k in info)
            finally:
                d.stop()
        finally:
            prom.stop()
