"""What a recipe (recipes/*.yaml) may say: a method, its backend and the keys that method uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.schema.common import EACH_ONCE, Strict, _validate

# Which keys each method uses. A key set in a recipe that its method ignores is an error, so that
# nobody believes `group_size: 32` changed an FP8 checkpoint.
# kv_cache_dtype is a serving setting every method has: it travels in the manifest to eval, bench and
# the published serve.yaml.
METHOD_KEYS = {
    "bf16": {"kv_cache_dtype"},
    "fp8-dynamic": {"ignore", "kv_cache_dtype"},
    "gptq": {
        "bits",
        "group_size",
        "symmetric",
        "act_order",
        "damping",
        "observer",
        "ignore",
        "calib_batch_size",
        "propagate_error",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
        "rotation",
        "rotation_type",
        "rotation_block_size",
        "rotation_precision",
    },
    "awq": {
        "bits",
        "group_size",
        "symmetric",
        "ignore",
        "n_grid",
        "duo_scaling",
        "grid_subsample",
        "calib_batch_size",
        "propagate_error",
        "rounding",
        "act_order",
        "damping",
        "observer",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
        "rotation",
        "rotation_type",
        "rotation_block_size",
        "rotation_precision",
    },
    "autoround": {
        "bits",
        "group_size",
        "symmetric",
        "ignore",
        "iters",
        "size_budget",
        "sensitive_bits",
        "kv_cache_dtype",
    },
}
# The rotation keys: in a recipe's used() (its build key, its manifest) only where rotation is on, so that
# the recipes written before them keep their build keys.
ROTATION_KEYS = ("rotation", "rotation_type", "rotation_block_size", "rotation_precision")
BACKENDS = {
    "bf16": {"transformers"},
    "fp8-dynamic": {"llmcompressor"},
    "gptq": {"llmcompressor", "gptqmodel"},
    "awq": {"llmcompressor", "gptqmodel"},
    "autoround": {"llmcompressor"},
}


class Recipe(Strict):
    """One variant: how to turn the source model into a checkpoint vLLM can serve."""

    description: str
    method: Literal["bf16", "gptq", "awq", "autoround", "fp8-dynamic"]
    # llmcompressor writes compressed-tensors checkpoints; gptqmodel writes the classic `gptq` / `awq`
    # formats that HF transformers, TGI and auto-gptq/AutoAWQ-era tooling load.
    backend: Literal["transformers", "llmcompressor", "gptqmodel"]
    bits: Literal[4, 8] = 4
    group_size: int = 128
    symmetric: bool = True
    act_order: bool = False
    damping: float = Field(0.01, gt=0, lt=1)
    ignore: Annotated[list[str], EACH_ONCE] = ["lm_head"]
    # llm-compressor only. n_grid / duo_scaling (AWQ): AWQModifier's scale grid search (its defaults:
    # 20 points, duo). grid_subsample (AWQ): the grid search scores each point on every Nth calibration
    # batch (the activation statistics still see all). calib_batch_size (AWQ, GPTQ): calibration samples
    # per forward pass, sorted by length and right-padded, the padding masked out of AWQ's statistics and
    # loss and of GPTQ's Hessians. propagate_error (AWQ, GPTQ): llm-compressor's own setting: each layer is
    # calibrated on the outputs of the layers before it as quantized (true) or as they were (false: one
    # forward pass a layer less). rounding (AWQ): after the AWQ scales, round to the 4-bit grid by
    # round-to-nearest (rtn, plain AWQ) or by GPTQ (then act_order and damping apply, as for method gptq).
    n_grid: int = Field(20, ge=2, le=100)
    duo_scaling: bool | Literal["both"] = True
    grid_subsample: int = Field(1, ge=1)
    calib_batch_size: int = Field(1, ge=1, le=128)
    propagate_error: bool = True
    rounding: Literal["rtn", "gptq"] = "rtn"
    # observer (GPTQ, AWQ; llm-compressor): how each group's scale and zero point are chosen: minmax (the
    # group's range), mse (the clipped range with the least squared rounding error: llm-compressor's
    # memoryless_mse), imatrix_mse (that error weighted by each input channel's mean squared activation,
    # llama.cpp's importance matrix: llm-compressor's imatrix_mse).
    observer: Literal["minmax", "mse", "imatrix_mse"] = "minmax"
    # iters (AutoRound): sign-gradient steps a decoder layer, each over the layer's calibration inputs,
    # that tune every weight's rounding and each group's clipping (llm-compressor's AutoRoundModifier;
    # 200 is its default and Intel's).
    iters: int = Field(200, ge=1, le=10000)
    # kv_cache_dtype (every method): the KV cache vLLM serves the variant with; fp8 holds twice the tokens
    # (scale 1.0: no calibrated KV scales).
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # size_budget / sensitive_bits (GPTQ, AWQ; llm-compressor): sensitivity-guided mixed precision.
    # Before quantizing, each decoder layer's effect on the KLD to the source model when it alone is rounded
    # to the recipe's grid (round to nearest, on the first calibration samples) is measured; the most
    # sensitive layers stay at sensitive_bits (16: not quantized; 8: INT8 weights; a CPU serves them dequantized) while
    # the estimated checkpoint size stays within size_budget x the all-`bits` one. 1.0: off.
    size_budget: float = Field(1.0, ge=1.0, le=4.0)
    sensitive_bits: Literal[8, 16] = 16
    # rotation (GPTQ; llm-compressor): quip: llm-compressor's QuIPModifier runs before GPTQ and rotates the
    # input side of every quantized Linear (its "v" rotation): the inverse rotation is fused into the weights
    # before they are rounded, and vLLM rotates each Linear's input at serve time (compressed-tensors
    # transforms). rotation_type: random-hadamard (any size a known Hadamard matrix times a power of two
    # has; a dense GEMM in vLLM: on a CPU only with pipeline/vllm_plugins.py loaded) or hadamard (powers of
    # two; vLLM's hadacore kernel: CUDA only). rotation_block_size: a block-diagonal rotation of blocks this
    # size (it must divide every rotated Linear's input features); unset: one rotation the Linear's width.
    # rotation_precision: the dtype the rotation is built and fused in, and in which the checkpoint stores the
    # matrices vLLM applies online (one per input width: SmolLM2-135M's two are 21.5 MB in float64, 18% of
    # its INT4 checkpoint; float32 halves that, bfloat16 quarters it). vLLM casts each Linear's input to
    # that dtype for the rotation: bfloat16 is a bf16 model's own (no cast, a bf16 GEMM on a GPU), and
    # rounds a float32 CPU model's inputs to bf16 there. The build applies the rotation in that dtype in
    # every calibration pass: bfloat16 on a CPU without bf16 instructions is emulated (SmolLM2-135M: 10 of
    # 30 layers in 50 min on an AVX2 CPU, against 9 min for the whole float32 build). With size_budget, layers
    # kept in bf16 (sensitive_bits 16) are left out of the rotation too, INT8 ones (8) are rotated like the
    # rest; their sensitivity is measured before any rotation, so the plan keeps the layers rounding hurts
    # most unrotated, not necessarily those the rotation leaves worst.
    # spinquant (GPTQ, AWQ): llm-compressor's SpinQuantModifier, its rotations R1 (the residual stream: the
    # embeddings and every Linear that writes or reads it, RMSNorm weights fused into the Linears after them)
    # and R2 (each attention head's values), both fused into the weights before they are rounded: vLLM
    # serves an ordinary checkpoint, with no rotation at serve time, so decoding costs what plain INT4's does
    # and any rotation_type serves on a CPU. R1 unties tied embeddings (lm_head becomes a weight of its own,
    # kept at 16 bits: SmolLM2-135M's adds 54 MiB). rotation_block_size: R1's blocks (unset: hidden_size);
    # R2's are the head dimension. The whole model is rotated, a mixed recipe's kept layers too (exact at 16
    # bits). AWQ's smoothing then runs on the rotated model, where no rotation sits between a smoothing
    # layer and the Linears it balances (as quip's online one would).
    rotation: Literal["none", "quip", "spinquant"] = "none"
    rotation_type: Literal["random-hadamard", "hadamard"] = "random-hadamard"
    rotation_block_size: int | None = Field(None, ge=2)
    rotation_precision: Literal["float64", "float32", "bfloat16"] = "float64"

    def used(self) -> dict:
        """The recipe as its method reads it: a bf16 recipe has no bits or group size to report."""
        keys = METHOD_KEYS.get(self.method, set()) | {"description", "method", "backend"}
        if self.rotation == "none":
            keys = keys - set(ROTATION_KEYS)
        return {k: v for k, v in self.model_dump().items() if k in keys}

    @property
    def needs_calibration(self) -> bool:
        return self.method in ("gptq", "awq", "autoround")

    @property
    def weight_bits(self) -> int:
        return {"bf16": 16, "fp8-dynamic": 8}.get(self.method, self.bits)

    @model_validator(mode="before")
    @classmethod
    def _keys_fit_method(cls, data):
        if isinstance(data, dict) and data.get("method") in METHOD_KEYS:
            unused = set(data) - METHOD_KEYS[data["method"]] - {"description", "method", "backend"}
            for key in sorted(unused & set(cls.model_fields)):
                raise ValueError(f"{key}: not used by method {data['method']}; remove it")
        return data

    @model_validator(mode="after")
    def _loadable_by_vllm(self):
        if self.backend not in BACKENDS[self.method]:
            raise ValueError(
                f"backend: {self.method} is made by {' or '.join(sorted(BACKENDS[self.method]))}, not {self.backend}"
            )
        if self.group_size != -1 and (self.group_size < 16 or self.group_size & (self.group_size - 1)):
            raise ValueError(
                f"group_size: must be -1 (one group per row) or a power of two >= 16, got {self.group_size}"
            )
        if self.method == "awq" and self.bits != 4:
            raise ValueError("bits: AWQ checkpoints are 4-bit in vLLM; use bits: 4")
        if self.method == "autoround" and not self.symmetric:
            # measured: llm-compressor 0.14's wrapper drops the tuned zero points (KLD 2.77 to bf16)
            raise ValueError("symmetric: AutoRound through llm-compressor 0.14 loses asymmetric zero points; use true")
        if self.method == "awq" and self.rounding == "rtn":
            for key in sorted({"act_order", "damping"} & self.model_fields_set):
                raise ValueError(f"{key}: used by AWQ only with rounding: gptq; remove it or set rounding: gptq")
        self._rotation_fits()
        if self.backend == "gptqmodel":
            llmcompressor_only = {
                "n_grid",
                "duo_scaling",
                "grid_subsample",
                "calib_batch_size",
                "propagate_error",
                "observer",
                "size_budget",
                "sensitive_bits",
            }
            for key in sorted((llmcompressor_only | {"rounding"}) & self.model_fields_set):
                raise ValueError(f"{key}: an llm-compressor setting; backend gptqmodel does not use it")
        if "sensitive_bits" in self.model_fields_set and self.size_budget == 1.0:
            raise ValueError("sensitive_bits: does nothing without size_budget above 1.0; set size_budget or remove it")
        if self.size_budget > 1.0 and self.sensitive_bits <= self.bits:
            raise ValueError(
                f"sensitive_bits: {self.sensitive_bits} is not above bits ({self.bits}); use 16, or 8 with bits 4"
            )
        if self.backend == "gptqmodel" and self.method == "gptq":
            # vLLM's gptq/gptq_marlin loaders refuse these classic-format combinations.
            if not self.symmetric:
                raise ValueError(
                    "symmetric: vLLM rejects classic GPTQ checkpoints with sym=false; use symmetric: true or backend: "
                    "llmcompressor"
                )
            if self.act_order and self.group_size != -1:
                raise ValueError("act_order: vLLM rejects classic GPTQ with desc_act=true unless group_size is -1")
        if self.backend == "gptqmodel" and self.ignore != ["lm_head"]:
            raise ValueError(
                "ignore: backend gptqmodel quantizes every decoder-layer Linear and never lm_head; "
                "use ignore: [lm_head], or backend: llmcompressor for other exclusions"
            )
        if self.backend == "gptqmodel" and self.method == "awq" and self.symmetric:
            raise ValueError("symmetric: the classic AWQ format stores zero points; use symmetric: false")
        return self

    def _rotation_fits(self) -> None:
        """The rotation keys: set only with a rotation, and each rotation only where it is built and served."""
        if self.rotation == "none":
            for key in sorted(set(ROTATION_KEYS[1:]) & self.model_fields_set):
                raise ValueError(
                    f"{key}: does nothing without a rotation; set rotation: quip or spinquant, or remove it"
                )
            return
        if self.backend != "llmcompressor":
            modifier = "QuIPModifier" if self.rotation == "quip" else "SpinQuantModifier"
            raise ValueError(
                f"rotation: {self.rotation} is llm-compressor's {modifier}; backend {self.backend} has none"
            )
        if self.method == "awq" and self.rotation == "quip":
            raise ValueError(
                "rotation: quip rotates each Linear's input online, between AWQ's smoothing layer and the Linears it "
                "balances, so AWQ's scales would act in another basis; use rotation: spinquant with AWQ"
            )
        block = self.rotation_block_size
        if self.rotation_type == "hadamard" and block is not None and block & (block - 1):
            raise ValueError(f"rotation_block_size: a hadamard rotation needs a power of two, got {block}")


def load_recipe(path: str | Path) -> Recipe:
    return _validate(Recipe, Path(path))
