"""KV capacity when the architecture comes from the HF cache instead of the catalog (a benchmark).

For every row of ../shared/fixtures/kv-capacity-observations.csv whose model has a public config.json
in tests/fixtures/hf-configs/ (or the same architecture under another id, listed in SAME_CONFIG),
the config is put in a temporary HF cache, resolved offline through exporter/model/resolve.py, and
the predicted "GPU KV cache size" is compared with the logged one, beside the catalog's prediction.
The KV model's constants were fitted on kv-memory-breakdown.csv (benchmarks/accuracy_kv.py), which
includes some of these rows: this measures that the resolver feeds the same physics, not a held-out
accuracy. Rows of models without a fixture config are listed as not covered.

Usage: python benchmarks/accuracy_model_sources.py [--shared DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "helpers"))

from accuracy_kv import observation_setup, truth_tokens  # noqa: E402
from fake_hub import hf_cache_entry  # noqa: E402

from exporter.model.kv_cache import kv_capacity  # noqa: E402
from exporter.model.resolve import HubSettings, resolve_model  # noqa: E402

CONFIGS = REPO / "tests" / "fixtures" / "hf-configs"
# observation model id -> fixture folder holding the same config.json fields (chat/base twins)
SAME_CONFIG = {"deepseek-ai/DeepSeek-V2-Lite-Chat": "deepseek-ai--DeepSeek-V2-Lite"}


def main() -> int:
    import csv
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    a = ap.parse_args()
    path = a.shared / "fixtures" / "kv-capacity-observations.csv"
    if not path.exists():
        print(f"no observations at {path}")
        return 2
    rows = list(csv.DictReader(open(path)))
    cache = Path(tempfile.mkdtemp(prefix="hf-cache-"))
    settings = HubSettings(offline=True, cache_dir=str(cache))
    covered, missing = [], set()
    for r in rows:
        folder = SAME_CONFIG.get(r["model"]) or r["model"].replace("/", "--")
        cfg = CONFIGS / folder / "config.json"
        if not cfg.exists():
            missing.add(r["model"])
            continue
        hf_cache_entry(cache, r["model"], {"config.json": cfg.read_bytes()})
        res = resolve_model(r["model"], settings=settings)
        assert res.source == "hf-cache", res.describe()
        truth = truth_tokens(r)
        from_cache = kv_capacity(observation_setup({**r, "model": res.arch}), check_fits=False).tokens
        from_catalog = kv_capacity(observation_setup(r), check_fits=False).tokens
        covered.append((r["model"], r["tp"], truth, from_cache, from_catalog))
    print(f"{'model':50s} tp  {'truth':>9s} {'hf-cache':>9s} {'err%':>6s} {'catalog':>9s} {'err%':>6s}")
    for m, tp, t, c, k in covered:
        print(f"{m:50s} {tp:>2s}  {t:9d} {c:9d} {abs(c - t) / t * 100:6.2f} {k:9d} {abs(k - t) / t * 100:6.2f}")
    if covered:
        mae_c = sum(abs(c - t) / t for _, _, t, c, _ in covered) / len(covered) * 100
        mae_k = sum(abs(k - t) / t for _, _, t, _, k in covered) / len(covered) * 100
        print(f"{len(covered)} rows: mean abs error hf-cache {mae_c:.2f}%, catalog {mae_k:.2f}%")
    print(f"not covered (no fixture config.json): {len(missing)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
