"""Static and file_sd discovery: targets come and go, hints are kept, bad files keep the last good list."""
import json
import os
import time

from exporter.config import TargetSpec, config_from_dict
from exporter.discovery import Discovery, StaticSource, build_discovery, shard_of
from exporter.discovery.file_sd import FileSDSource


def test_file_sd_json_and_yaml_with_hints(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([
        {"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"gpu": "L40S", "tp": "2", "team": "search"}}]))
    (tmp_path / "b.yaml").write_text("- targets: ['https://vllm.example:443']\n  labels: {model: Qwen/Qwen3-8B}\n")
    src = FileSDSource([str(tmp_path / "*.json"), str(tmp_path / "*.yaml")])
    specs = {s.url: s for s in src.targets()}
    assert set(specs) == {"http://10.0.0.1:8000", "http://10.0.0.2:8000", "https://vllm.example:443"}
    a = specs["http://10.0.0.1:8000"]
    assert (a.gpu, a.tp, a.labels) == ("L40S", 2, {"team": "search"})
    assert a.source.startswith("file_sd:")
    assert specs["https://vllm.example:443"].model == "Qwen/Qwen3-8B"


def test_token_counts_are_read_as_vllm_reads_them(tmp_path):
    """`16k` in a file_sd label, a static target or a vLLM flag is 16,000 and `16K` 16,384, as
    vLLM's own parser has it; what vLLM refuses is an error naming the entry."""
    (tmp_path / "t.yaml").write_text("- targets: ['h1:8000']\n  labels: {max_num_batched_tokens: 16k}\n"
                                     "- targets: ['h2:8000']\n  labels: {max_num_batched_tokens: 16K}\n")
    specs = {s.url: s for s in FileSDSource([str(tmp_path / "t.yaml")]).targets()}
    assert specs["http://h1:8000"].max_num_batched_tokens == 16000
    assert specs["http://h2:8000"].max_num_batched_tokens == 16384
    cfg = config_from_dict({"targets": [{"url": "http://h3:8000", "max_num_batched_tokens": "2.5k"}]})
    assert cfg.targets[0].max_num_batched_tokens == 2500
    errors = []
    (tmp_path / "t.yaml").write_text("- targets: ['h1:8000']\n  labels: {max_num_batched_tokens: 1.5K}\n")
    os.utime(tmp_path / "t.yaml", (time.time() + 5, time.time() + 5))
    src = FileSDSource([str(tmp_path / "t.yaml")], on_error=lambda s, m: errors.append(m))
    assert src.targets() == []
    assert "[0].labels.max_num_batched_tokens: expected a token count" in errors[0] and "'1.5K'" in errors[0]


def test_file_sd_changes_are_picked_up_and_bad_files_keep_last_good(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([{"targets": ["h1:8000"]}]))
    errors = []
    src = FileSDSource([str(tmp_path / "*.json")], on_error=lambda s, m: errors.append(m))
    assert [s.url for s in src.targets()] == ["http://h1:8000"]
    f.write_text(json.dumps([{"targets": ["h1:8000", "h2:8000"]}]))
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert [s.url for s in src.targets()] == ["http://h1:8000", "http://h2:8000"]
    f.write_text('[{"targets": ["h3:8000"]')   # broken JSON
    os.utime(f, (time.time() + 10, time.time() + 10))
    assert [s.url for s in src.targets()] == ["http://h1:8000", "http://h2:8000"]
    assert errors and str(f) in errors[0] and "not valid JSON" in errors[0]
    src.targets()
    assert len(errors) == 1, "the same error is reported once, not every cycle"
    f.unlink()
    assert src.targets() == []


def test_file_sd_errors_name_the_entry(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([{"targets": ["ok:8000"]}, {"targets": ["bad host:x"]}]))
    errors = []
    src = FileSDSource([str(f)], on_error=lambda s, m: errors.append(m))
    assert src.targets() == []
    assert errors[0].startswith(f"{f}: [1].targets[0]: not a URL")
    f.write_text(json.dumps([{"targets": ["ok:8000"], "labels": {"quantization": "fp9"}}]))
    os.utime(f, (time.time() + 3, time.time() + 3))
    src.targets()
    assert errors[-1].startswith(f"{f}: [0].labels.quantization: unknown quantization 'fp9'"), errors[-1]
    f.write_text(json.dumps([{"targetz": []}]))
    os.utime(f, (time.time() + 5, time.time() + 5))
    src.targets()
    assert "needs a 'targets' list" in errors[-1]


def test_merge_defaults_and_sharding():
    cfg = config_from_dict({"targets": [{"url": f"http://h{i}:8000"} for i in range(30)] + [{"url": "http://x:1", "gpu": "L4"}],
                            "defaults": {"url": "http://placeholder:1", "gpu": "H100", "tp": 2}})
    d = build_discovery(cfg)
    got = d.targets()
    assert len(got) == 31 and got["http://h0:8000"].gpu == "H100" and got["http://x:1"].gpu == "L4"
    owners = {}
    for i in range(3):
        shard = Discovery([StaticSource(cfg.targets)], shard_index=i, shard_count=3)
        for url in shard.targets():
            owners.setdefault(url, []).append(i)
    assert len(owners) == 31 and all(len(v) == 1 for v in owners.values())
    assert all(len([u for u, v in owners.items() if v == [i]]) > 0 for i in range(3))
    assert shard_of("http://h0:8000", 3) == shard_of("http://h0:8000", 3)


def test_first_source_wins():
    a = StaticSource([TargetSpec(url="http://h:1", gpu="A")])
    b = StaticSource([TargetSpec(url="http://h:1", gpu="B"), TargetSpec(url="http://k:1")])
    got = Discovery([a, b]).targets()
    assert got["http://h:1"].gpu == "A" and set(got) == {"http://h:1", "http://k:1"}
