"""GPU telemetry beside the vLLM metrics: which GPU a target runs on and how busy it is, from
Kubernetes node labels and NVIDIA DCGM exporter series."""
