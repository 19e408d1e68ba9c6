"""vllm-drift: a Prometheus exporter and drift-detection daemon for fleets of vLLM servers."""

__version__ = "0.1.0"
