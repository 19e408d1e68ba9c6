"""The vLLM server simulator: makes vllm-drift tryable without GPUs and gives tests and benchmarks
fleets with known ground truth.

Modules: `engine` (discrete-event model of one vLLM V1 engine core), `eras` (what each vLLM
version's /metrics looks like), `exposition` (fast rendering), `scenario` (scenario files and
wiring to the calculator), `server` (asyncio HTTP), `fleet` (many targets in one process).

Scenario file (YAML; built-ins in `scenarios/`, `vllm-drift simulate --scenario PATH` for yours)::

    name: my-scenario                  # default: file name
    model: meta-llama/Llama-3.1-8B-Instruct   # calculator catalog id (or HF config path)
    gpu: L4                            # calculator GPU name or alias
    tp: 1
    vllm_version: 0.11.0               # exposition era (overridden by --vllm-version)
    vllm:                              # engine flags; unset ones get vLLM's defaults
      max_model_len: 4096
      max_num_seqs: 48
      max_num_batched_tokens: 2048
      gpu_memory_utilization: 0.9
      enable_prefix_caching: true
      kv_cache_dtype: auto             # auto | fp8
      block_size: 16
      num_gpu_blocks: 1200             # optional: override the calculator's KV capacity
      speculative: {num_speculative_tokens: 3, acceptance: 0.6, draft_cost: 0.05}
    traffic:
      rate: 1.0                        # requests/s (or `concurrency: N` closed-loop clients)
      arrival: poisson                 # poisson | bursty | diurnal | constant
      burst_factor: 4                  # bursty: x rate for burst_fraction of each burst_period
      burst_fraction: 0.2
      burst_period: 30s
      diurnal_period: 10m              # diurnal: rate x (1 + amplitude x sin)
      diurnal_amplitude: 0.5
      prompt: {mean: 700, cv: 0.5, min: 32, max: 3000, kind: lognormal}   # or fixed/uniform/exponential
      output: {mean: 220, cv: 0.5}     # natural (EOS) length; `length` finish at max_tokens/max_model_len
      max_tokens: 1024                 # request parameter (unset: fill the context, as vLLM does)
      shared_prefix: {tokens: 256, groups: 4, share: 0.6}
      client_timeout: 10m              # queued requests older than this are given up
    phases:                            # changes mid-run (keys merge over the previous phase)
      - at: 5m
        traffic: {rate: 3.0}
      - at: 8m                         # new vllm flags = a redeploy: the server restarts
        vllm: {gpu_memory_utilization: 0.8}   # (counters reset, new cache_config_info)
    warmup: 120s                       # simulated before serving, so the first scrape is steady
    speed: 1.0                         # sim seconds per wall second (overridden by --speed)
    ground_truth: [kv_pressure]        # the findings this scenario contains (issue 5 names)
    acceptable: [max_num_seqs]         # findings that are also right, not false alarms
"""
