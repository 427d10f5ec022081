"""Run in the serve environment by tests/test_vllm_plugins.py: an INT4 checkpoint loaded in vLLM on this CPU
as the quantize stage's smoke test loads it (its engine in this process, the pipeline's plugin found on
sys.path), one greedy generation, then every INT4 Linear's output for a fixed input through vLLM's own
quantized apply.

    python -m tests.int4_layers CHECKPOINT OUT.safetensors     # prints one JSON line

OUT holds `<layer>.x` and `<layer>.y` for each INT4 Linear (vLLM's names: qkv_proj, gate_up_proj fused);
the JSON line the generated text and, per layer, whether it runs the plugin's dequantized weight.
"""

import json
import os
import sys


def layer_outputs(model) -> tuple[dict, dict]:
    """Every Linear that vLLM's CPUWNA16LinearKernel serves, applied to the same seeded input."""
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel

    from pipeline.vllm_plugins import DENSE_WEIGHT

    tensors, dense = {}, {}
    generator = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        # compressed-tensors keeps its scheme on the layer; the classic gptq / awq methods hold the kernel
        holder = getattr(module, "scheme", None) or getattr(module, "quant_method", None)
        kernel = getattr(holder, "kernel", None)
        if not isinstance(kernel, CPUWNA16LinearKernel):
            continue
        x = torch.randn(3, module.input_size_per_partition, generator=generator).to(kernel.config.act_type)
        with torch.no_grad():
            tensors[f"{name}.x"], tensors[f"{name}.y"] = x, module.quant_method.apply(module, x).contiguous()
        dense[name] = getattr(module, DENSE_WEIGHT, None) is not None
    return tensors, dense


def main(checkpoint: str, out: str) -> None:
    from safetensors.torch import save_file

    from pipeline.serving import engine_in_this_process

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine_in_this_process()
    from vllm import LLM, SamplingParams

    # float32: what vLLM runs in on a CPU without bf16 instructions, and no rounding of the weights
    llm = LLM(
        model=checkpoint,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        max_num_seqs=1,
        max_model_len=128,
        kv_cache_memory_bytes=256 * 2**20,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    text = llm.generate(["The capital of France is"], params)[0].outputs[0].text
    tensors, dense = llm.apply_model(layer_outputs)[0]
    save_file(tensors, out)
    print(json.dumps({"text": text, "dense": dense}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
