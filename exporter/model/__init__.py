"""The configuration calculator's model: pure functions from (architecture, GPU, engine flags,
traffic) to predicted capacity and speed. No I/O beyond reading the packaged catalogs."""
from exporter.model.gpus import GPU, GPUS, gpu_names, resolve_gpu
from exporter.model.architectures import ModelArch, arch_from_config, catalog_ids, load_hf_config, resolve_model
from exporter.model.kv_cache import KVCapacity, MemoryBreakdown, bytes_per_token, kv_capacity
from exporter.model.setup import DEFAULT_VLLM_VERSION, Setup, make_setup, parse_version
from exporter.model.traffic import SLO, Traffic
from exporter.model.perf import Prediction, predict, step_time_s
from exporter.model.spec_decode import SpecConfig, expected_tokens
from exporter.model.optimizer import Recommendation, Tier, rank_tiers, recommend
from exporter.model.report import performance_report
