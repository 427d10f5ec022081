#!/usr/bin/env bash
# The H200 runs behind docs/benchmarks.md, on the lent machine (no package registry there; its image
# has Python 3.12, torch 2.11.0+cu130, transformers 5.17.0). vLLM 0.26.0 comes as the kit that
# ../shared/gpu/build-kit.sh makes (see ../shared/gpu/README.md); llm-compressor 0.14.0.1 comes as
# wheels in .gpukit/inputs/quant, installed into a second site dir because it pins
# compressed-tensors 0.19.0 where vLLM 0.26.0 pins 0.17.0 (the same split as .venv-quant/.venv-serve).
#
#   bash bench/h200-run.sh quantize            # random-init R1-Distill-Qwen-1.5B -> bf16, gptq, awq, fp8 variants
#   bash bench/h200-run.sh bench VARIANT...    # bench/h200.yaml on those variants; results to $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SITE=/tmp/site                      # vLLM 0.26.0 and its dependencies (unpacked by .gpukit/unpack.sh)
QUANT_SITE=/tmp/site-quant          # llm-compressor 0.14.0.1 + compressed-tensors 0.19.0
MODEL=artifacts/sources/deepseek-r1-distill-qwen-1.5b-random
OUT=${OUT:-/tmp/out}

case "$1" in
quantize)
  [ -d $QUANT_SITE/llmcompressor ] || python3 -m pip install -q --no-index --no-deps --no-compile --target $QUANT_SITE .gpukit/inputs/quant/*.whl
  export PYTHONPATH=$QUANT_SITE:$SITE SERVE_PYTHON=$(command -v python3) SERVE_PYTHONPATH=$SITE
  [ -f $MODEL/manifest.json ] || python3 -m pipeline.source random .gpukit/inputs/deepseek-r1-distill-qwen-1.5b $MODEL
  for recipe in bf16 fp8-dynamic gptq-w4a16 awq-w4a16; do
    /usr/bin/time -f "$recipe: %e s wall, %M KiB peak RSS" \
      python3 -m pipeline.quantize --model $MODEL --recipe recipes/$recipe.yaml --calib calib/synthetic-math-chat.yaml
  done
  ;;
bench)
  shift
  export PYTHONPATH=$SITE
  variants=(); for v in "$@"; do variants+=(artifacts/deepseek-r1-distill-qwen-1.5b-random/$v); done
  python3 -m pipeline.bench --profile ${PROFILE:-bench/h200.yaml} "${variants[@]}" || echo "bench exit $?"
  mkdir -p $OUT
  for v in "$@"; do cp artifacts/deepseek-r1-distill-qwen-1.5b-random/$v/bench.json $OUT/bench-$v.json 2>/dev/null || true; done
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.csv || true
  ;;
*) echo "usage: $0 quantize | bench VARIANT..." >&2; exit 2 ;;
esac
