#!/usr/bin/env bash
# The H200 runs behind docs/benchmarks.md, on the lent machine (no package registry there; its image
# has Python 3.12, torch 2.11.0+cu130, transformers 5.17.0). vLLM 0.26.0 comes as the kit that
# ../shared/gpu/build-kit.sh makes (see ../shared/gpu/README.md); llm-compressor 0.14.0.1 comes as
# wheels in .gpukit/inputs/quant, installed into a second site dir because it pins
# compressed-tensors 0.19.0 where vLLM 0.26.0 pins 0.17.0 (the same split as .venv-quant/.venv-serve).
#
#   bash bench/h200-run.sh prepare               # quantizer site dir + random-init R1-Distill-Qwen-1.5B (once the kit is unpacked: pydantic)
#   bash bench/h200-run.sh quantize [RECIPE...]  # -> those variants (default: bf16 fp8-dynamic gptq-w4a16 awq-w4a16)
#   bash bench/h200-run.sh bench VARIANT...      # $PROFILE (default bench/h200.yaml) on those variants
#
# bench writes to $OUT, per variant: <variant>[.<tag>].json (bench.json), .server.log (vLLM's log)
# and .manifest.json (how the variant was made); <tag> is the profile's name less "h200-" (none for
# bench/h200.yaml), so a second profile on the same variant does not overwrite the first.
# BENCH_TIMEOUT (s, default 540) bounds the benchmark so that the copy to $OUT always runs; a variant
# cut off by it has no bench.json, but its server log still comes back.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SITE=/tmp/site                      # vLLM 0.26.0 and its dependencies (unpacked by .gpukit/unpack.sh)
QUANT_SITE=/tmp/site-quant          # llm-compressor 0.14.0.1 + compressed-tensors 0.19.0
MODEL=artifacts/sources/deepseek-r1-distill-qwen-1.5b-random
VARIANTS=artifacts/deepseek-r1-distill-qwen-1.5b-random
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

prepare() {
  [ -d $QUANT_SITE/llmcompressor ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $QUANT_SITE .gpukit/inputs/quant/*.whl
  [ -f $MODEL/manifest.json ] || [ ! -d $SITE/pydantic ] || PYTHONPATH=$QUANT_SITE:$SITE python3 -m pipeline.source random .gpukit/inputs/deepseek-r1-distill-qwen-1.5b $MODEL
}

case "${1:-}" in
prepare)
  prepare
  ;;
quantize)
  shift
  prepare
  export PYTHONPATH=$QUANT_SITE:$SITE SERVE_PYTHON=$(command -v python3) SERVE_PYTHONPATH=$SITE
  recipes=("$@"); [ ${#recipes[@]} -gt 0 ] || recipes=(bf16 fp8-dynamic gptq-w4a16 awq-w4a16)
  for recipe in "${recipes[@]}"; do
    /usr/bin/time -f "$recipe: %e s wall, %M KiB peak RSS" \
      python3 -m pipeline.quantize --model $MODEL --recipe recipes/$recipe.yaml --calib calib/synthetic-math-chat.yaml \
      2>&1 | tee -a "$OUT/quantize.log"
  done
  ;;
bench)
  shift
  export PYTHONPATH=$SITE
  profile=${PROFILE:-bench/h200.yaml}
  tag=$(basename "$profile" .yaml); tag=${tag#h200}; tag=${tag#-}; suffix=${tag:+.$tag}
  variants=(); for v in "$@"; do variants+=($VARIANTS/$v); done
  # one copy of a variant's bench.json may be left from an earlier profile on this machine: move it
  # aside, so that what comes back is this run's or nothing
  for v in "$@"; do [ ! -f $VARIANTS/$v/bench.json ] || mv $VARIANTS/$v/bench.json $VARIANTS/$v/bench.earlier.json; done
  echo "bench $profile: $* (timeout ${BENCH_TIMEOUT:-540} s) from $(date -u +%T)"
  timeout -k 30 ${BENCH_TIMEOUT:-540} python3 -m pipeline.bench --profile "$profile" "${variants[@]}" \
    2>&1 | tee -a "$OUT/bench$suffix.$(echo "$@" | tr ' ' '+').out" || echo "bench exit $?"
  echo "bench done at $(date -u +%T)"
  for v in "$@"; do
    cp $VARIANTS/$v/bench.json "$OUT/$v$suffix.json" 2>/dev/null || echo "$v: no bench.json"
    cp $VARIANTS/.bench-$v.log "$OUT/$v$suffix.server.log" 2>/dev/null || echo "$v: no server log"
    cp $VARIANTS/$v/manifest.json "$OUT/$v$suffix.manifest.json" 2>/dev/null || echo "$v: no manifest"
  done
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv" || true
  ;;
*) echo "usage: $0 prepare | quantize [RECIPE...] | bench VARIANT..." >&2; exit 2 ;;
esac
