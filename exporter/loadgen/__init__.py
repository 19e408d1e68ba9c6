"""A bounded load generator for OpenAI-compatible servers (vLLM's `/v1/completions` and
`/v1/chat/completions`): concurrency or Poisson-rate levels, per-level latency statistics with
`vllm bench serve`'s definitions, the server's own /metrics read during each level, knee
detection, and the calibration CSV / HTML report the `sweep` command writes."""
