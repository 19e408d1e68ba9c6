"""Reading vLLM `/metrics`: a fast exposition reader (`exposition`), the metric names of every
vLLM era (`eras`), and their canonicalisation into `Snapshot`s (`canonical`)."""

from exporter.parse.canonical import NoVllmMetricsError, NotAnEngineError, canonicalise, parse_vllm

__all__ = ["parse_vllm", "canonicalise", "NotAnEngineError", "NoVllmMetricsError"]
