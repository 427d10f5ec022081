#!/usr/bin/env bash
# Build .gpukit/ (ignored) in a checkout, for the lent GPU machines, which have no package registry:
# ../shared/gpu/build-kit.sh's vLLM 0.26.0 parts with the serve lock's wheels the image lacks (extra/),
# and inputs/: early/ (pydantic, for pipeline.source before the kit is whole), quant/ (llm-compressor and
# what bench/h200-env.sh installs from it), the R1-Distill config and tokenizer. Versions are the CUDA
# locks' (requirements/*-cuda.lock). bench/h200-env.sh is the other half, on the device.
#
#   bash bench/gpu-kit.sh            # about 3 min on 2 cores (downloads, xz); then see docs/environments.md
set -euo pipefail
kit=${1:-.gpukit}
shared=$(cd "$(dirname "$0")/../../shared" && pwd)
pins() { # the lock's pinned spec of each name given, e.g. pins serve-cuda pydantic -> pydantic==2.14.4
  local lock=requirements/$1-cuda.lock name
  shift
  for name in "$@"; do
    grep -i -m1 "^${name}==" "$lock" | sed 's/[ ;\\].*//' || { echo "gpu-kit: $name is not in $lock" >&2; exit 1; }
  done
}
"$shared/gpu/build-kit.sh" "$kit" $(pins serve math-verify latex2sympy2-extended antlr4-python3-runtime)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
early=(pydantic pydantic-core annotated-types typing-inspection)
quant=("${early[@]}" llmcompressor compressed-tensors loguru datasets dill multiprocess auto-round)
mkdir -p "$kit/inputs/early" "$kit/inputs/quant"
pip download -q --no-deps "${plat[@]}" -d "$kit/inputs/early" $(pins quant "${early[@]}")
pip download -q --no-deps "${plat[@]}" -d "$kit/inputs/quant" $(pins quant "${quant[@]}")
rm -rf "$kit/inputs/deepseek-r1-distill-qwen-1.5b"
cp -r "$shared/models/deepseek-r1-distill-qwen-1.5b" "$kit/inputs/"
du -sh "$kit"/vllm-site.part.* "$kit"/extra "$kit"/inputs/*
