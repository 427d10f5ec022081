# Stage the "existing environment" on the lent H200, so that the make targets run there as on any
# machine with its own Python (no package registry there, so no `make setup`):
#
#   bash .gpukit/unpack.sh            # the vLLM kit -> /tmp/site (../shared/gpu/README.md)
#   source bench/h200-env.sh          # quantizer wheels -> /tmp/site-quant, two interpreters, $H200_MAKE
#   make random-model quantize eval bench report $H200_MAKE RECIPES="bf16 fp8-dynamic" SUITES=gsm8k
#   make test-gpu $H200_MAKE
#
# The two interpreters are the image's python3 with the kit's site dirs: serve = vLLM's (with the
# compressed-tensors vLLM pins), quant = llm-compressor's site dir first (with the one it pins), as the
# two venvs of `make setup` split them. Inputs the machine cannot fetch travel in .gpukit/inputs/:
# quant/*.whl (llm-compressor and what the image lacks), the R1-Distill config and tokenizer,
# data/ (DATA_DIR). Sourced, so it sets no shell options of its own.
#
# bench/gpu-kit.sh builds .gpukit/ here: the kit (../shared/gpu/build-kit.sh) holds vLLM, its extra wheels
# what the serve lock adds that the image lacks (the MATH suites' scorer), inputs/ the quantizer's wheels.
if [ ! -f /tmp/site/vllm/__init__.py ]; then
  echo "h200-env: vLLM is not unpacked in /tmp/site; run bash .gpukit/unpack.sh with every kit part first" >&2
  return 1 2>/dev/null || exit 1
fi
[ -d /tmp/site-quant/llmcompressor ] ||
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-quant .gpukit/inputs/quant/*.whl
# GPTQModel (the classic gptq/awq backend), where .gpukit/gptqmodel/ came along: its wheels (built here
# from PyPI's sdists: they are pure Python) plus pypcre, whose C extension is compiled there for the
# image's Python against the system's libpcre2-8 (its sdist carries the header).
if [ -d .gpukit/gptqmodel ] && [ ! -d /tmp/site-quant/gptqmodel ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-quant .gpukit/gptqmodel/*.whl
  python3 -m pip wheel -q --no-index --no-build-isolation --no-deps -w /tmp/pypcre-wheel .gpukit/gptqmodel/pypcre-*.tar.gz &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-quant /tmp/pypcre-wheel/pypcre-*.whl ||
    echo "h200-env: pypcre did not build: the gptqmodel recipes (*-classic) will fail" >&2
fi
PYTHONPATH=/tmp/site-extra:/tmp/site python3 -c "import math_verify" 2>/dev/null ||
  echo "h200-env: math-verify is not in the kit's extra wheels: eval will refuse MATH suites; the wheels to add are in bench/h200-env.sh's header" >&2
mkdir -p /tmp/bin
printf '#!/bin/sh\nPYTHONPATH=/tmp/site-extra:/tmp/site exec python3 "$@"\n' > /tmp/bin/serve-python
printf '#!/bin/sh\nPYTHONPATH=/tmp/site-quant:/tmp/site-extra:/tmp/site exec python3 "$@"\n' > /tmp/bin/quant-python
chmod +x /tmp/bin/serve-python /tmp/bin/quant-python
# the kit's documented settings (../shared/gpu/README.md); HF_HUB_OFFLINE: no hub is reachable there
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export H200_MAKE="QUANT_PY=/tmp/bin/quant-python SERVE_PY=/tmp/bin/serve-python R1_CONFIG=.gpukit/inputs/deepseek-r1-distill-qwen-1.5b DATA_DIR=.gpukit/inputs/data"
echo "h200-env: make ... \$H200_MAKE  (= $H200_MAKE)"
