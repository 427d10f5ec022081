"""make quantize: turn one source model into one variant, as its recipe says.

    python -m pipeline.quantize --model MODEL --recipe recipes/gptq-w4a16.yaml \\
        --calib calib/synthetic-math-chat.yaml [--data-dir ../shared/data] [--out artifacts] [--force] [--dp N]

MODEL is a local Hugging Face folder or a hub id. The steps, in order, and the module of each:
  1. check everything that could fail later (recipe, calibration data, weights, group size, disk)  checks
  2. calibration token ids, hashed (GPTQ and AWQ only; the source model's own answers for
     `responses: model`: traces, serve env, through serve_env)                       calibration_samples
  3. quantize with the recipe's backend into a temporary folder   llmcompressor (its shims in
     llmcompressor_shims; mixed precision's layer search in mixed_precision) or gptqmodel
  4. load that folder in vLLM and generate a few tokens (smoke, serve env)                   serve_env
  5. write manifest.json, then rename the folder to artifacts/<model>/<variant>/             build
A variant whose recipe, calibration and source weights are unchanged is not rebuilt. --dp N runs step 3
for GPTQ and AWQ as llm-compressor's distributed oneshot over N GPUs (torchrun, one rank a GPU).
The command line is __main__.py. Importing the package loads no quantizer: each backend imports its own.
"""
