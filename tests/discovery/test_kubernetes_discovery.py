"""Kubernetes discovery against a loopback server speaking the API's list/watch protocol, through
the official `kubernetes` client and a kubeconfig the test writes."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("kubernetes")

from exporter.config import KubernetesConfig  # noqa: E402
from exporter.discovery.kubernetes import KubernetesSource, pod_target  # noqa: E402
from exporter.discovery.vllm_args import parse_vllm_args  # noqa: E402
from exporter.telemetry.gpu_product import catalog_gpu  # noqa: E402
from kube_api_server import FakeKubeAPI, node, pod  # noqa: E402


def eventually(fn, timeout=30.0):
    """Poll until fn() returns a truthy value (watch events arrive asynchronously)."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s; last value {last!r}")


def urls(source):
    return sorted(t.url for t in source.targets())


@pytest.fixture
def api():
    with FakeKubeAPI() as server:
        yield server


@pytest.fixture
def make_source(api, tmp_path):
    made = []
    errors: list[tuple[str, str]] = []

    def make(**kw):
        cfg = KubernetesConfig(namespace=kw.pop("namespace", "llm"), label_selector=kw.pop("label_selector", "app=vllm"),
                               kubeconfig=api.kubeconfig(str(tmp_path / "kubeconfig")), **kw)
        src = KubernetesSource(cfg, on_error=lambda s, m: errors.append((s, m)), watch_timeout=5, backoff_max=0.5)
        made.append(src)
        return src

    make.errors = errors
    yield make
    for src in made:
        src.close()


def test_lists_ready_pods_with_hints_from_args_and_node_labels(api, make_source):
    api.add("nodes", node("gpu-a", "NVIDIA-H100-80GB-HBM3"))
    api.add("nodes", node("gpu-b", "NVIDIA-L40S"))
    api.add("pods", pod("qwen-0", ip="10.1.0.5", node_name="gpu-a",
                        command=["vllm", "serve"], args=["Qwen/Qwen3-4B", "--tensor-parallel-size", "2",
                                                         "--max-num-seqs=128", "--served-model-name", "qwen"]))
    api.add("pods", pod("llama-0", ip="10.1.0.6", node_name="gpu-b",
                        args=["--model", "meta-llama/Llama-3.1-8B-Instruct", "-tp", "1", "--max-num-batched-tokens", "8192"]))
    api.add("pods", pod("starting", ip="10.1.0.7", ready=False))               # not Ready
    api.add("pods", pod("pending", ip=None, phase="Pending", ready=False))     # no IP yet
    api.add("pods", pod("other-app", ip="10.1.0.8", labels={"app": "redis"}))  # selector excludes
    api.add("pods", pod("elsewhere", ip="10.2.0.9", namespace="batch"))        # other namespace
    src = make_source()
    assert src.wait_synced(30), (make_source.errors, api.requests)
    specs = {t.name: t for t in src.targets()}
    assert sorted(specs) == ["llm/llama-0", "llm/qwen-0"]
    q, ll = specs["llm/qwen-0"], specs["llm/llama-0"]
    assert q.url == "http://10.1.0.5:8000" and q.source == "kubernetes"
    assert (q.gpu, q.tp, q.model, q.max_num_seqs) == ("H100-SXM-80GB", 2, "Qwen/Qwen3-4B", 128)
    assert q.labels["served_model_name"] == "qwen" and q.labels["node"] == "gpu-a"
    assert q.labels["gpu_product"] == "NVIDIA-H100-80GB-HBM3"
    assert (ll.gpu, ll.tp, ll.model, ll.max_num_batched_tokens) == ("L40S", 1, "meta-llama/Llama-3.1-8B-Instruct", 8192)
    # it listed once, then watched (no polling lists)
    assert api.count("pods", watch=False) == 1
    eventually(lambda: api.count("pods", watch=True) >= 1)
    assert make_source.errors == []


def test_watch_events_add_modify_delete_and_node_relabel(api, make_source):
    api.add("nodes", node("gpu-a", "NVIDIA-A100-SXM4-80GB"))
    starting = pod("qwen-1", ip="10.1.0.11", ready=False)
    api.add("pods", pod("qwen-0", ip="10.1.0.10"))
    api.add("pods", starting)
    src = make_source()
    assert src.wait_synced(30)
    assert urls(src) == ["http://10.1.0.10:8000"]
    lists_before = api.count("pods", watch=False)

    api.modify("pods", pod("qwen-1", ip="10.1.0.11"))          # became Ready
    eventually(lambda: urls(src) == ["http://10.1.0.10:8000", "http://10.1.0.11:8000"])
    api.add("pods", pod("qwen-2", ip="10.1.0.12", annotations={"vllm-drift.io/port": "9000",
                                                               "vllm-drift.io/gpu": "H100"}))
    eventually(lambda: "http://10.1.0.12:9000" in urls(src))
    assert {t.url: t.gpu for t in src.targets()}["http://10.1.0.12:9000"] == "H100-SXM-80GB"  # annotation wins
    api.delete("pods", pod("qwen-0", ip="10.1.0.10"))
    eventually(lambda: "http://10.1.0.10:8000" not in urls(src))
    # terminating pod (deletionTimestamp set) leaves before it is gone
    terminating = pod("qwen-1", ip="10.1.0.11")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.modify("pods", terminating)
    eventually(lambda: urls(src) == ["http://10.1.0.12:9000"])
    # node relabelled (e.g. GPU feature discovery ran late): the hint follows
    assert {t.name: t.gpu for t in src.targets()} == {"llm/qwen-2": "H100-SXM-80GB"}
    api.add("pods", pod("qwen-3", ip="10.1.0.13", node_name="gpu-a"))
    eventually(lambda: {t.name: t.gpu for t in src.targets()}.get("llm/qwen-3") == "A100-80GB")
    api.modify("nodes", node("gpu-a", "NVIDIA-L40S"))
    eventually(lambda: {t.name: t.gpu for t in src.targets()}.get("llm/qwen-3") == "L40S")
    # all of that came through the watch: no new list
    assert api.count("pods", watch=False) == lists_before


def test_410_gone_triggers_a_relist_that_catches_up(api, make_source):
    api.add("pods", pod("a", ip="10.1.0.20"))
    api.add("pods", pod("b", ip="10.1.0.21"))
    src = make_source()
    assert src.wait_synced(30)
    assert urls(src) == ["http://10.1.0.20:8000", "http://10.1.0.21:8000"]
    eventually(lambda: api.count("pods", watch=True) >= 1)
    lists = api.count("pods", watch=False)
    # Changes whose events are lost (compacted away) can only be learnt by listing again.
    api.delete("pods", pod("a", ip="10.1.0.20"), silent=True)
    api.add("pods", pod("c", ip="10.1.0.22"), silent=True)
    api.compact()
    eventually(lambda: urls(src) == ["http://10.1.0.21:8000", "http://10.1.0.22:8000"])
    assert api.count("pods", watch=False) == lists + 1
    assert make_source.errors == []          # a 410 is routine, not an error
    # the watch continues after the re-list
    api.add("pods", pod("d", ip="10.1.0.23"))
    eventually(lambda: "http://10.1.0.23:8000" in urls(src))


def test_api_errors_are_reported_last_state_kept_and_recovered(api, make_source):
    api.add("pods", pod("a", ip="10.1.0.30"))
    src = make_source()
    assert src.wait_synced(30)
    eventually(lambda: api.count("pods", watch=True) >= 1)
    api.fail_status = 500
    api.compact()            # end the watch: the next request meets the failing server
    eventually(lambda: any("HTTP 500" in m for _, m in make_source.errors))
    assert urls(src) == ["http://10.1.0.30:8000"]        # last good state kept
    assert all(s == "kubernetes" for s, _ in make_source.errors)
    api.fail_status = 0
    api.add("pods", pod("b", ip="10.1.0.31"))
    eventually(lambda: urls(src) == ["http://10.1.0.30:8000", "http://10.1.0.31:8000"])


def test_bad_credentials_and_bad_hints_are_reported(api, make_source, tmp_path):
    import json
    api.add("pods", pod("bad-tp", ip="10.1.0.40", annotations={"vllm-drift.io/tp": "two"}))
    src = make_source()
    assert src.wait_synced(30)
    (spec,) = src.targets()
    assert spec.tp is None                                  # bad hint dropped, target kept
    assert any("vllm-drift.io/tp='two' is not int" in m for _, m in make_source.errors)

    path = tmp_path / "kubeconfig"
    doc = json.loads(path.read_text())
    doc["users"][0]["user"]["token"] = "wrong"
    path.write_text(json.dumps(doc))
    other = KubernetesSource(KubernetesConfig(namespace="llm", kubeconfig=str(path)),
                             on_error=lambda s, m: make_source.errors.append((s, m)), backoff_max=0.5)
    try:
        eventually(lambda: any("HTTP 401" in m for _, m in make_source.errors))
        assert other.targets() == []
    finally:
        other.close()


def test_all_namespaces_ipv6_and_paging(api, make_source):
    for i in range(7):
        api.add("pods", pod(f"p{i}", ip=f"10.3.0.{i}", namespace=f"ns{i % 3}"))
    api.add("pods", pod("v6", ip="fd00::5", namespace="ns0"))
    src = make_source(namespace=None, label_selector="app=vllm")
    src.wait_synced(30)
    got = urls(src)
    assert len(got) == 8 and "http://[fd00::5]:8000" in got


def test_missing_kubeconfig_is_reported_not_fatal(tmp_path):
    errors = []
    src = KubernetesSource(KubernetesConfig(kubeconfig=str(tmp_path / "nope")), on_error=lambda s, m: errors.append(m),
                           backoff_max=0.5)
    try:
        eventually(lambda: errors)
        assert "nope" in errors[0] and src.targets() == []
    finally:
        src.close()


# --------------------------------------------------------------- pure helpers on real shapes
@pytest.mark.parametrize("argv, expected", [
    (["vllm", "serve", "Qwen/Qwen3-4B", "--tensor-parallel-size", "4", "--max-num-seqs", "256"],
     {"model": "Qwen/Qwen3-4B", "tp": 4, "max_num_seqs": 256}),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model=m/x", "-tp=2", "--pipeline-parallel-size", "2"],
     {"model": "m/x", "tp": 2, "pp": 2}),
    (["vllm", "serve", "--host", "0.0.0.0", "m/y", "--trust-remote-code", "--max_num_batched_tokens", "4096"],
     {"model": "m/y", "max_num_batched_tokens": 4096}),
    (["/bin/sh", "-c", "pip install foo && exec vllm serve m/z -tp 8 --no-enable-prefix-caching --port 8080"],
     {"model": "m/z", "tp": 8, "enable_prefix_caching": False, "port": 8080}),
    (["vllm", "serve", "m/w", "--served-model-name", "a", "b", "--quantization", "fp8", "--gpu-memory-utilization", "0.85"],
     {"model": "m/w", "served_model_name": "a", "quantization": "fp8", "gpu_memory_utilization": 0.85}),
    (["vllm", "serve", "m/v", "--tensor-parallel-size", "lots"], {"model": "m/v"}),
    (["vllm", "serve", "m/e", "--data-parallel-size", "4", "--enable-expert-parallel"],
     {"model": "m/e", "dp": 4, "expert_parallel": True}),
    (["vllm", "serve", "m/n", "--no-async-scheduling"], {"model": "m/n", "async_scheduling": False}),
    # a boolean flag's value decides (vLLM's older parsers took `--flag=False`); one that is not a
    # boolean, or given to a `--no-` flag, says nothing
    (["vllm", "serve", "m/b", "--enable-prefix-caching=False", "--enforce-eager=true"],
     {"model": "m/b", "enable_prefix_caching": False, "enforce_eager": True}),
    (["vllm", "serve", "m/c", "--enable-prefix-caching=sometimes", "--no-async-scheduling=1"], {"model": "m/c"}),
    # multimodal profile flags: JSON or the older form, max_pixels out of the processor kwargs
    (["vllm", "serve", "m/vl", "--limit-mm-per-prompt", '{"video": 0, "image": 2}', "--skip-mm-profiling",
      "--mm-processor-kwargs", '{"max_pixels": 1003520, "min_pixels": 3136}'],
     {"model": "m/vl", "limit_mm_per_prompt": "image=2,video=0", "skip_mm_profiling": True, "mm_max_pixels": 1003520}),
    (["vllm", "serve", "m/vm", "--limit-mm-per-prompt=image=1", "--mm-processor-kwargs", '{"fps": 1}'],
     {"model": "m/vm", "limit_mm_per_prompt": "image=1"}),
    # vLLM's human-readable counts: lower-case suffixes are powers of 1000, upper-case of 1024
    (["vllm", "serve", "m/u", "--max-num-batched-tokens", "16k", "--max-model-len", "32K"],
     {"model": "m/u", "max_num_batched_tokens": 16000, "max_model_len": "32K"}),
    (["vllm", "serve", "m/t", "--max-num-batched-tokens=8K"], {"model": "m/t", "max_num_batched_tokens": 8192}),
    (["vllm", "serve", "m/s", "--max-num-batched-tokens", "1.5K"], {"model": "m/s"}),   # vLLM refuses it too
])
def test_vllm_args(argv, expected):
    assert parse_vllm_args(argv) == expected


@pytest.mark.parametrize("product, name", [
    ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB"),         # GPU feature discovery label
    ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),         # DCGM modelName
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("Tesla-T4", "T4"),
    ("nvidia-l4", "L4"),                                # GKE accelerator label
    ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-80GB"),      # time-sliced
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None),         # a MIG slice is not the whole card
    ("Some Future Card", None),
])
def test_gpu_products_map_to_catalog(product, name):
    assert catalog_gpu(product) == name


def test_a_scheme_the_calculator_does_not_know_keeps_the_pod():
    # the server's own flag: vLLM runs it, so the pod stays a target and the scheme rides as a label
    # (the prediction's note then says the calculator cannot size it)
    t = pod_target(pod("g", args=["--model", "m/q", "--quantization", "gguf"]), 8000)
    assert "quantization" not in t.hints and t.labels["quantization"] == "gguf" and not t.problems
    # an annotation is the operator's hint: a typo is a reported problem, the server's flag stands
    t = pod_target(pod("h", args=["--model", "m/q", "--quantization", "fp8"],
                       annotations={"vllm-drift.io/quantization": "fp9"}), 8000)
    assert t.hints["quantization"] == "fp8"
    [problem] = t.problems
    assert problem.startswith("vllm-drift.io/quantization='fp9' is not a quantization scheme the calculator knows (")
    assert all(s in problem for s in ("fp8", "awq", "gptq", "nvfp4", "mxfp4"))


def test_pod_without_vllm_port_uses_vllm_container():
    p = pod("x", port=9999, args=["--model", "m/q", "-tp", "2"])
    t = pod_target(p, 8000)
    assert t.hints["tp"] == 2 and t.labels["container"] == "vllm"


def test_serve_scrapes_the_pods_it_watches(api, captures, tmp_path, cli_env):
    """`vllm-drift serve` with a `kubernetes:` section: pods (IP 127.0.0.1, port by annotation)
    become targets and are scraped; a deleted pod stops being a target; GPU hints come along."""
    import json as _json

    import loopback
    from daemons import Daemon, get, samples, wait_for

    body = captures["vllm-0.10.1-v1-ngc2509-qwen3-4b.prom"]
    sites = [loopback.Site(loopback.static({"/metrics": body, "/version": b'{"version":"0.10.1"}',
                                            "/v1/models": b'{"data":[]}'})) for _ in range(2)]
    for s in sites:
        s.__enter__()
    try:
        api.add("nodes", node("gpu-a", "NVIDIA-H100-80GB-HBM3"))
        for i, s in enumerate(sites):
            api.add("pods", pod(f"qwen-{i}", ip="127.0.0.1", annotations={"vllm-drift.io/port": str(s.port)},
                                args=["--model", "Qwen/Qwen3-4B", "--tensor-parallel-size", "2"]))
        cfg = tmp_path / "serve.yaml"
        cfg.write_text("scrape: {interval: 1s, timeout: 1s}\nevaluation: {interval: 2s, window: 60s}\n"
                       f"kubernetes: {{namespace: llm, label_selector: 'app=vllm', kubeconfig: '{api.kubeconfig(str(tmp_path / 'kc'))}'}}\n")
        d = Daemon(cfg, cli_env)
        try:
            urls = {s.url for s in sites}
            wait_for(lambda: {k.split('"')[1] for k, v in samples(d.metrics(), "vllm_drift_target_up").items() if v == 1.0} == urls)
            # the node list may arrive a moment after the pods: the GPU hint follows within a cycle
            def hinted():
                ts = {t["target"]: t for t in _json.loads(get(d.url + "/api/v1/targets")[1])["targets"]}
                return ts if all(t["hints"].get("gpu") for t in ts.values()) else None

            targets = wait_for(hinted)
            assert set(targets) == urls
            t = targets[sites[0].url]
            assert t["source"] == "kubernetes"
            assert (t["hints"]["gpu"], t["hints"]["tp"], t["hints"]["model"]) == ("H100-SXM-80GB", 2, "Qwen/Qwen3-4B")
            api.delete("pods", pod("qwen-1", ip="127.0.0.1"))
            wait_for(lambda: set(samples(d.metrics(), "vllm_drift_target_up")) == {f'{{target="{sites[0].url}"}}'})
        finally:
            d.stop()
    finally:
        for s in sites:
            s.__exit__(None, None, None)
