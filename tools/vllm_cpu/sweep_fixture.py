"""Bundle a real `vllm-drift sweep --json --save-metrics DIR` run into one small fixture.

Why: the sweep's client-side TTFT/TPOT are checked (tests/loadgen/test_sweep_real_capture.py)
against vLLM's own histograms over exactly the same requests. The fixture keeps the sweep's JSON
and, per level, the server's /metrics text at the measured start and end, cut down to the
families the check and the sweep's gauges need (HELP/TYPE kept, `_created` samples dropped), so
it stays small and readable.

Usage: python sweep_fixture.py SWEEP.json METRICS_DIR OUT.json --command "vllm-drift sweep ..."
       [--server "vllm serve ..."] [--note TEXT]
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

KEEP = (
    "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions", "vllm:request_success", "vllm:prompt_tokens", "vllm:generation_tokens",
)
_NAME = re.compile(r"^(?:# (?:HELP|TYPE) )?([A-Za-z_:][A-Za-z0-9_:]*)")


def _family(line: str) -> str | None:
    m = _NAME.match(line)
    if not m:
        return None
    name = m.group(1)
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name


def cut(text: str) -> str:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name = _NAME.match(line)
        if name and name.group(1).endswith("_created"):
            continue
        if _family(line) in KEEP:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_json", type=Path)
    p.add_argument("metrics_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--command", required=True, help="the sweep command line, as run")
    p.add_argument("--server", default="", help="the vLLM server command line")
    p.add_argument("--note", default="")
    a = p.parse_args()
    doc = json.loads(a.sweep_json.read_text())
    key = doc["level_key"]
    doc["server"]["url"] = re.sub(r":\d+$", ":PORT", doc["server"]["url"])
    metrics = {}
    for lv in doc["levels"]:
        tag = f"{key}-{lv[key]:g}"
        metrics[f"{lv[key]:g}"] = {
            part: cut((a.metrics_dir / f"{tag}-{part}.prom").read_text()) for part in ("start", "end")}
    bundle = {"command": a.command, "server_command": a.server, "note": a.note, "sweep": doc,
              "metrics": metrics}
    a.out.write_text(json.dumps(bundle, indent=1) + "\n")
    print(f"{a.out}: {len(doc['levels'])} levels, {a.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
