"""The llm-compressor backend: a recipe as llm-compressor modifiers, run by oneshot() over the calibration
token ids into compressed-tensors checkpoints, in one process or as its distributed oneshot over DP
ranks (torchrun). llm-compressor is imported where it is used: bf16 and GPTQModel builds never load it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.process_failure import failure_cause
from pipeline.quantize.mixed_precision import mixed_precision_plan
from pipeline.schema import MixedPrecisionPlan, Recipe
from pipeline.serving import die_with_parent
from pipeline.settings import ROOT, pipeline_quiet
from pipeline.staging import write_json

Samples = list[list[int]]


def quantize_llmcompressor(
    model_dir: Path, recipe: Recipe, samples: Samples | None, out: Path, ranks: int = 1
) -> tuple[MixedPrecisionPlan | None, list[int] | None]:
    """Quantize into out. Returns the mixed-precision plan when the recipe asks for one (size_budget > 1),
    and with ranks > 1 each rank's peak GPU bytes."""
    model = plan = None
    if recipe.size_budget > 1.0 and recipe.method != "fp8-dynamic":
        model = load_bf16(model_dir)
        plan = mixed_precision_plan(model, samples, recipe)  # on the whole model, before any rank starts
    if ranks > 1:
        del model
        return plan, ddp_quantize(model_dir, recipe, samples, out, plan, ranks)
    oneshot_llmcompressor(model or load_bf16(model_dir), recipe, samples, plan, out)
    return plan, None


def load_bf16(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)


def weight_scheme(recipe: Recipe) -> dict:
    """The recipe's integer weights as a compressed-tensors quantization args dict."""
    weights = {
        "num_bits": recipe.bits,
        "type": "int",
        "symmetric": recipe.symmetric,
        "strategy": "channel" if recipe.group_size == -1 else "group",
        "group_size": None if recipe.group_size == -1 else recipe.group_size,
    }
    if recipe.observer != "minmax":  # weights are observed once: memoryless
        weights["observer"] = {"mse": "memoryless_mse", "imatrix_mse": "imatrix_mse"}[recipe.observer]
    return weights


def config_groups(recipe: Recipe, plan: MixedPrecisionPlan | None) -> tuple[dict, list[str]]:
    """compressed-tensors config groups and the ignore list: the plan's kept layers are left out of the
    quantization (sensitive_bits 16) or get a group of their own at sensitive_bits."""
    weights, ignore = weight_scheme(recipe), list(recipe.ignore)
    groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
    if plan and plan.kept:
        kept = "re:" + plan.prefix.replace(".", r"\.") + r"\.(" + "|".join(map(str, plan.kept)) + r")\."
        if recipe.sensitive_bits == 16:
            ignore.append(kept)
        else:  # a name regex outranks the class target "Linear" in compressed-tensors and vLLM
            groups["group_1"] = {"targets": [kept], "weights": {**weights, "num_bits": recipe.sensitive_bits}}
    return groups, ignore


def modifiers(recipe: Recipe, plan: MixedPrecisionPlan | None) -> list:
    """The recipe's method as the llm-compressor modifiers oneshot() runs, in order."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    if recipe.method == "fp8-dynamic":
        return [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=recipe.ignore)]
    from pipeline.quantize.llmcompressor_shims import AWQ, GPTQ  # checks llm-compressor's version

    groups, ignore = config_groups(recipe, plan)
    # "static" act-order reorders columns while quantizing and stores no g_idx: free at inference
    gptq = GPTQ(
        config_groups=groups,
        ignore=ignore,
        dampening_frac=recipe.damping,
        actorder="static" if recipe.act_order else None,
    )
    if recipe.method == "gptq":
        return [*rotation(recipe, ignore), gptq]
    if recipe.method == "autoround":
        from llmcompressor.modifiers.autoround import AutoRoundModifier

        # Intel's SignRound, one decoder layer at a time; torch.compile off: it compiles each layer anew
        # (docs/measurements/2026-12-01-int4-techniques-cpu/ measured without it)
        return [AutoRoundModifier(config_groups=groups, ignore=ignore, iters=recipe.iters, enable_torch_compile=False)]
    # AWQ's scales, then GPTQ's error-compensating rounding of the scaled weights, or round-to-nearest.
    # oneshot runs each modifier through its own pipeline: all of AWQ's smoothing, then the rounding
    # (GPTQ collects its Hessians in a second calibration pass, over the smoothed model)
    rounding = gptq if recipe.rounding == "gptq" else QuantizationModifier(config_groups=groups, ignore=ignore)
    awq = AWQ(n_grid=recipe.n_grid, duo_scaling=recipe.duo_scaling, grid_subsample=recipe.grid_subsample)
    return [*rotation(recipe, ignore), awq, rounding]


def rotation(recipe: Recipe, ignore: list[str]) -> list:
    """rotation: quip as llm-compressor's QuIPModifier, input side only ("v": the output side costs more
    and gains nothing, llm-compressor's own advice), over the Linears the quantizer quantizes; spinquant as
    its SpinQuantModifier's R1 and R2, the two fused into the weights (R3 and R4 would rotate online)."""
    if recipe.rotation == "none":
        return []
    import torch
    from llmcompressor.modifiers.transform import QuIPModifier, SpinQuantModifier

    if recipe.rotation == "spinquant":
        return [
            SpinQuantModifier(
                rotations=["R1", "R2"],
                transform_type=recipe.rotation_type,
                transform_block_size=recipe.rotation_block_size,
                precision=getattr(torch, recipe.rotation_precision),
            )
        ]
    return [
        QuIPModifier(
            rotations=["v"],
            transform_type=recipe.rotation_type,
            transform_block_size=recipe.rotation_block_size,
            precision=getattr(torch, recipe.rotation_precision),
            targets=["Linear"],
            ignore=ignore,
        )
    ]


def calibration_kwargs(recipe: Recipe, samples: Samples | None, model_config) -> dict:
    """oneshot()'s data settings: the token ids as they are (already tokenized and hashed), and with
    calib_batch_size > 1 padded batches in length order (little padding in a batch)."""
    if samples is None:
        return {}
    from datasets import Dataset

    batching = padded_batching(recipe.calib_batch_size, model_config) if recipe.calib_batch_size > 1 else {}
    if not recipe.propagate_error:
        batching["propagate_error"] = False
    if recipe.calib_batch_size > 1:
        samples = sorted(samples, key=len)
    return dict(
        dataset=Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]}),
        num_calibration_samples=len(samples),
        max_seq_length=max(map(len, samples)),
        shuffle_calibration_samples=False,
        **batching,
    )


def oneshot_llmcompressor(model, recipe: Recipe, samples: Samples | None, plan: MixedPrecisionPlan | None, out: Path):
    """The recipe's modifiers run by oneshot() over the calibration ids; saves to out."""
    from llmcompressor import oneshot

    oneshot(model=model, recipe=modifiers(recipe, plan), **calibration_kwargs(recipe, samples, model.config))
    model.save_pretrained(out, save_compressed=True)  # rank 0 writes; the others wait


def padded_batching(batch_size: int, config) -> dict:
    """oneshot() settings that feed batch_size samples a forward pass (one sample a pass is mostly
    per-call overhead on a small model): right-padded, so that no real token attends to padding, and
    loss_mask = attention_mask (use_loss_mask), so that AWQ's activation statistics and grid-search
    loss, and GPTQ's Hessians (llmcompressor_shims.GPTQ), see no padding token."""
    import torch

    pad = config.pad_token_id if config.pad_token_id is not None else 0

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.clone()}

    return dict(batch_size=batch_size, data_collator=collate, use_loss_mask=True)


def ddp_quantize(
    model_dir: Path, recipe: Recipe, samples, out: Path, plan: MixedPrecisionPlan | None, ranks: int
) -> list[int]:
    """llm-compressor's distributed oneshot: `torchrun` starts one process per GPU, rank 0 loads the
    weights and shares them, each rank calibrates on its share of the samples (oneshot splits a data set
    that every rank holds), and GPTQ's Hessians / AWQ's statistics are reduced across ranks before each
    layer is compressed. The ranks run `python -m pipeline.quantize --ddp-worker SPEC`; each writes its
    peak GPU memory next to the spec."""
    with tempfile.TemporaryDirectory(prefix="quantize-ranks-") as spec_dir:
        spec = Path(spec_dir) / "spec.json"
        write_json(
            spec,
            {
                "model_dir": str(model_dir),
                "recipe": recipe.model_dump(exclude_unset=True),
                "samples": samples,
                "out": str(out),
                "plan": plan and plan.model_dump(mode="json"),
            },
        )
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        proc = subprocess.run(
            [*cmd, "-m", "pipeline.quantize", "--ddp-worker", str(spec)],
            cwd=ROOT,
            capture_output=pipeline_quiet(),  # VERBOSE=1: the ranks' output as it comes
            text=True,
            preexec_fn=die_with_parent,
        )
        if proc.returncode:
            cause = failure_cause((proc.stderr or "") + (proc.stdout or ""))
            raise RuntimeError(f"distributed quantization over {ranks} ranks failed (exit {proc.returncode}): {cause}")
        return [json.loads((Path(spec_dir) / f"rank-{r}.json").read_text())["peak_gpu_bytes"] for r in range(ranks)]


def ddp_worker(spec_path: Path) -> None:
    """One rank of ddp_quantize."""
    import torch
    import torch.distributed as dist
    from compressed_tensors.offload import init_dist, load_offloaded_model
    from transformers import AutoModelForCausalLM

    spec = json.loads(spec_path.read_text())
    if torch.accelerator.is_available():
        init_dist()  # NCCL, one GPU a rank
    else:
        dist.init_process_group("gloo")  # CPU ranks (tests): the same code path
    with load_offloaded_model():  # rank 0 reads the weights; the other ranks get them from it
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.bfloat16, device_map="auto_offload")
    plan = spec["plan"] and MixedPrecisionPlan.model_validate(spec["plan"])
    oneshot_llmcompressor(model, Recipe.model_validate(spec["recipe"]), spec["samples"], plan, Path(spec["out"]))
    write_json(spec_path.parent / f"rank-{dist.get_rank()}.json", {"peak_gpu_bytes": torch.cuda.max_memory_allocated()})
    dist.barrier()
    dist.destroy_process_group()
