"""The GPTQModel backend: classic `gptq` / `awq` checkpoints (GPTQModel is auto-gptq's maintained
successor), through its public load / quantize / save."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.schema import Recipe


def quantize_gptqmodel(model_dir: Path, recipe: Recipe, samples: list[list[int]], out: Path) -> None:
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(os.cpu_count() or 1))
    import torch
    from gptqmodel import BACKEND, AWQConfig, GPTQConfig, GPTQModel

    if recipe.method == "gptq":
        # act_group_aware off: keep the plain GPTQ order so the checkpoint is what the recipe says
        config = GPTQConfig(
            bits=recipe.bits,
            group_size=recipe.group_size,
            sym=recipe.symmetric,
            desc_act=recipe.act_order,
            damp_percent=recipe.damping,
            act_group_aware=False,
        )
    else:
        config = AWQConfig(bits=recipe.bits, group_size=recipe.group_size, sym=recipe.symmetric)
    model = GPTQModel.load(str(model_dir), config)
    calibration = [{"input_ids": s, "attention_mask": [1] * len(s)} for s in samples]
    # GPTQModel packs AWQ with its CUDA GEMM kernel by default ("AWQ: CUDA is not available" on CPU);
    # its torch kernel writes the same GEMM-format checkpoint.
    backend = BACKEND.AWQ_TORCH if recipe.method == "awq" and not torch.cuda.is_available() else BACKEND.AUTO
    model.quantize(calibration, batch_size=1, calibration_sort=None, backend=backend)
    model.save(str(out))
