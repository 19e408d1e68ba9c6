"""hint_mismatch on real KV pools (../shared/fixtures/kv-capacity-observations.csv: vLLM startup
logs of many models, GPUs, TP/PP and dtypes): the right GPU hint is never a mismatch, and a GPU hint
of half the memory is one, naming a card of the right memory class."""
from __future__ import annotations

import csv

from exporter.drift.predict import ServerFlags, predict, resolve_hints
from exporter.model.gpus import find_gpu


def rows(shared):
    with open(shared("fixtures", "kv-capacity-observations.csv"), newline="") as f:
        # a float32 server is a dtype override the daemon is not told about (the model's dtype is
        # assumed); every other row is a plain deployment
        return [r for r in csv.DictReader(f) if r["dtype"] != "float32"]


def judged(r, gpu):
    res = resolve_hints([r["model"]], gpu)
    assert res.model is not None and res.gpu is not None, (r["model"], gpu, res.notes)
    pp = 1
    for part in r["source"].split("--"):
        if part.startswith("tp") and "pp" in part:
            pp = int(part.split("pp")[1].split("dp")[0])
    flags = ServerFlags(tp=int(r["tp"]), pp=pp, kv_cache_dtype=r["kv_cache_dtype"],
                        gpu_memory_utilization=float(r["gpu_memory_utilization"]),
                        max_model_len=int(r["max_model_len"]), block_size=int(r["block_size"] or 16),
                        vllm_version=r["vllm_version"])
    return predict(res, flags, traffic={}, slo={}, prices={}, observed_kv_tokens=float(r["reported_kv_tokens"]))


def test_the_right_hint_is_never_a_mismatch(shared):
    rs = rows(shared)
    assert len(rs) >= 40
    wrong = [(r["model"], r["gpu"], r["tp"], judged(r, r["gpu"]).hint_mismatch) for r in rs]
    assert not [w for w in wrong if w[3] is not None], wrong


def test_a_hint_of_another_memory_class_is_a_mismatch(shared):
    """H100-80GB servers hinted as A100-40GB (half the memory): every server whose model fits the
    smaller card, with the pool pointing back at an 80 GB-class card."""
    checked = 0
    for r in rows(shared):
        if r["gpu"] != "H100-80GB":
            continue
        p = judged(r, "A100-40GB")
        if p.hint_mismatch is None and not p.kv_cache_tokens:
            continue                      # the model does not fit the hinted card at all
        checked += 1
        assert p.hint_mismatch is not None, (r["model"], r["tp"], r["max_model_len"])
        likely, ratio = p.hint_mismatch
        assert ratio > 1.5
        assert likely and all(70 <= find_gpu(g).memory_gib <= 100 for g in likely), likely
    assert checked >= 10
