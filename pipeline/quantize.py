"""make quantize: turn one source model into one variant, as its recipe says.

    python -m pipeline.quantize --model MODEL --recipe recipes/gptq-w4a16.yaml \\
        --calib calib/synthetic-math-chat.yaml [--data-dir ../shared/data] [--out artifacts] [--force] [--dp N]

MODEL is a local Hugging Face folder or a hub id. The steps, in order:
  1. check everything that could fail later (recipe, calibration data, weights, group size, disk)
  2. calibration token ids, hashed                              (GPTQ and AWQ only)
  3. quantize with the recipe's backend into a temporary folder (llm-compressor or GPTQModel)
  4. load that folder in vLLM and generate a few tokens          (pipeline/smoke.py, serve env)
  5. write manifest.json, then rename the folder to artifacts/<model>/<variant>/
A variant whose recipe, calibration and source weights are unchanged is not rebuilt. --dp N runs step 3
for GPTQ and AWQ as llm-compressor's distributed oneshot over N GPUs (torchrun, one rank a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pipeline import settings
from pipeline.artifacts import (
    RANDOM_WEIGHTS_BANNER,
    WEIGHT_GLOBS,
    check_weights,
    file_hashes,
    git_commit,
    manifest_differences,
    package_versions,
    peak_rss_bytes,
    read_json,
    read_manifest,
    read_variant_manifest,
    remove_stale,
    sha256_file,
    size_on_disk,
    staging_dir,
    tree_hash,
    write_json,
)
from pipeline.data import load_records, text_fields, word_problems
from pipeline.quiet import quiet
from pipeline.schema import CalibSet, ConfigError, Recipe, VariantManifest, check_data, load_calib, load_recipe
from pipeline.serving import die_with_parent, visible_gpus
from pipeline.settings import ROOT


# ---------------------------------------------------------------------------------------- the model
def resolve_model(model: str) -> Path:
    """A local checkpoint folder, or a hub id fetched to the local cache (online only)."""
    path = Path(model)
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"MODEL={model}: no config.json there; point MODEL at a Hugging Face checkpoint folder")
        if not any(p for g in WEIGHT_GLOBS for p in path.glob(g)):
            raise ConfigError(f"MODEL={model}: holds no weights (*.safetensors or pytorch_model*.bin)")
        check_config(path, f"MODEL={model}")
        check_weights(path, f"MODEL={model}")
        return path
    if model.count("/") != 1:
        raise ConfigError(f"MODEL={model}: no such folder, and not a hub id of the form owner/name")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]))
    except Exception as e:
        raise ConfigError(
            f"MODEL={model}: not a local folder and not downloadable ({type(e).__name__}); offline, pass a local folder"
        ) from None


def check_config(path: Path, what: str) -> None:
    """config.json parses and names an architecture transformers knows without running the model's own
    code (this pipeline never passes trust_remote_code: a checkpoint's Python is not run)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as e:
        raise ConfigError(f"{what}: config.json is not valid JSON ({e}); fix or re-download it") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{what}: config.json is not a JSON object; fix or re-download it")
    from transformers import CONFIG_MAPPING

    if config.get("model_type") not in CONFIG_MAPPING:
        custom = " and needs its own code (auto_map in config.json)" if "auto_map" in config else ""
        raise ConfigError(
            f"{what}: model_type {config.get('model_type')!r} is not one transformers knows{custom}; "
            "this pipeline runs no code from a checkpoint: use a model transformers and vLLM support"
        )


def model_name(model: str) -> str:
    return Path(model.rstrip("/")).name


def source_identity(model_dir: Path) -> dict:
    """Which weights a variant came from: the hash of the files on disk (a second for 135M parameters,
    seconds for 1.5B). Where the source has a manifest (we made it), the files must still match it: a
    damaged or edited copy is refused, never built under the good copy's hash."""
    manifest = read_manifest(model_dir) or {}
    hashes = file_hashes(model_dir)
    if manifest.get("files") and (changed := manifest_differences(manifest["files"], hashes)):
        raise ConfigError(
            f"MODEL={model_dir}: {'; '.join(changed)} (damaged or edited since it was made); rebuild the "
            "source (`make source` / `make random-model`)"
        )
    return {
        "path": str(model_dir),
        "sha256": tree_hash(hashes),
        "origin": manifest.get("origin", "external"),
        "random_weights": bool(manifest.get("random_weights", False)),
    }


def _ignored(name: str, patterns: list[str]) -> bool:
    # Same rule as llm-compressor's `ignore`: "re:" patterns match the module name, others its tail.
    return any(re.match(p[3:], name) if p.startswith("re:") else name == p or name.endswith("." + p) for p in patterns)


def check_modules(model_dir: Path, recipe: Recipe) -> None:
    """Every `ignore` entry names a module of this model (a typo such as `lm_hed` would otherwise
    quantize lm_head and fail in vLLM a minute later), and the group size divides the input features
    of every Linear the recipe quantizes.

    Checked on a weightless (meta-device) copy of the model, so it costs a second, not a load.
    """
    if recipe.method == "bf16":
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    names = [name for name, _ in model.named_modules()]
    for pattern in recipe.ignore:
        if not any(_ignored(name, [pattern]) for name in names):
            tails = sorted({name.rsplit(".", 1)[-1] for name in names if name})
            near = difflib.get_close_matches(pattern, tails, n=1)
            raise ConfigError(
                f"ignore: {pattern!r} matches no module of {model_dir.name}"
                f"{f' (did you mean {near[0]!r}?)' if near else ''}; fix the name, or use re: for a regex"
            )
    if not recipe.needs_calibration or recipe.group_size == -1:  # the grouped INT methods
        return
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not _ignored(name, recipe.ignore):
            if module.in_features % recipe.group_size:
                raise ConfigError(
                    f"group_size: {recipe.group_size} does not divide the {module.in_features} input features of "
                    f"{name}; use a group size that divides it (e.g. 64 or 32), or -1"
                )


def check_disk(model_dir: Path, recipe: Recipe, out_root: Path) -> None:
    weights = sum(p.stat().st_size for g in WEIGHT_GLOBS for p in model_dir.glob(g))
    # a 16-bit source shrinks by weight_bits/16; 25% margin for scales, zero points and tokenizer
    need = int(weights * recipe.weight_bits / 16 * 1.25) + (64 << 20)
    check_writable(out_root)
    free = shutil.disk_usage(out_root).free
    if free < need:
        raise ConfigError(
            f"{out_root}: {free / 2**30:.1f} GiB free, the variant needs about {need / 2**30:.1f} GiB; free some space"
        )


def check_writable(out_root: Path) -> None:
    """OUT can hold a new folder: refused now, not after the quantizer ran for minutes."""
    try:
        out_root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=out_root, prefix=".probe-").cleanup()
    except OSError as e:
        raise ConfigError(
            f"OUT={out_root}: cannot write there ({e.strerror or e}); set OUT to a writable folder"
        ) from None


# ---------------------------------------------------------------------------------- calibration
def calibration_texts(calib: CalibSet, data_dir: str | None, what: str) -> tuple[list[tuple[str, str | None]], dict]:
    """(prompt, response) pairs, a fixed seeded sample of the set, and where they were read from (with
    the data file's sha256 when it is a local file, so the manifest says which bytes were used)."""
    answer = calib.response_field if calib.responses == "data" else None  # responses: model writes its own
    fields = [f for f in (calib.prompt_field, answer) if f]
    if calib.generator:
        rows = word_problems(calib.num_samples, calib.seed)
        origin = {"read_from": f"generator:{calib.generator}"}
    else:
        rows, places = load_records(calib, data_dir, what)
        if data_dir:
            path = Path(data_dir) / calib.local_file
            origin = {
                "read_from": f"DATA_DIR/{calib.local_file}",
                "data_dir": str(data_dir),
                "data_file_sha256": sha256_file(path),
            }
        else:
            origin = {"read_from": f"hub:{calib.hub_id}", "split": calib.split}
        text_fields(rows, places, fields, what)  # all rows, so the error names the file and line
        if len(rows) < calib.num_samples:
            raise ConfigError(
                f"{what}: num_samples: {calib.num_samples} asked, "
                f"{path if data_dir else f'{calib.hub_id} ({calib.split})'} has {len(rows)} rows"
            )
        import random

        rows = [rows[i] for i in sorted(random.Random(calib.seed).sample(range(len(rows)), calib.num_samples))]
    return [(r[calib.prompt_field], r[answer] if answer else None) for r in rows], origin


def calibration_samples(
    calib: CalibSet, tokenizer, data_dir: str | None, what: str, model: tuple[Path, dict, Path] | None = None
) -> tuple[list[list[int]], dict]:
    """Token ids fed to the quantizer, one list per sample, at most max_seq_len long, and their origin.
    With responses: model, `model` is (source folder, source identity, cache folder) for model_answers."""
    samples = []
    pairs, origin = calibration_texts(calib, data_dir, what)
    if calib.responses == "model":
        return model_answers(calib, tokenizer, [prompt for prompt, _ in pairs], origin, what, *model)
    for prompt, response in pairs:
        if calib.chat_template:
            if not tokenizer.chat_template:
                raise ConfigError(
                    f"{what}: chat_template: true but the model's tokenizer has no chat template; set it to false"
                )
            messages = [{"role": "user", "content": prompt}]
            if response is not None:
                messages.append({"role": "assistant", "content": response})
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has them already
        else:
            ids = tokenizer(prompt + ("\n" + response if response else ""))["input_ids"]
        samples.append(ids[: calib.max_seq_len])
    return samples, origin


def model_answers(
    calib: CalibSet, tokenizer, prompts: list[str], origin: dict, what: str, model_dir: Path, source: dict, cache: Path
) -> tuple[list[list[int]], dict]:
    """Calibration samples whose answers the source model wrote: each prompt (through the chat template,
    generation prompt included) followed by the token ids vLLM generated for it, as the model produced
    them (no re-tokenization; the think block of R1-style models stays, which their chat template would
    strip from an assistant message). Generated once per source weights, prompts and settings, and cached."""
    if calib.chat_template and not tokenizer.chat_template:
        raise ConfigError(
            f"{what}: chat_template: true but the model's tokenizer has no chat template; set it to false"
        )
    prompt_ids = [
        tokenizer(
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        if calib.chat_template
        else tokenizer(p)["input_ids"]
        for p in prompts
    ]
    inputs = {
        "source": source["sha256"],
        "prompts": prompt_ids,
        "max_new_tokens": calib.max_new_tokens,
        "seed": calib.seed,
    }
    key = hashlib.sha256(json.dumps(inputs, separators=(",", ":")).encode()).hexdigest()
    path = cache / f"answers-{key[:16]}.json"
    cached = None
    with contextlib.suppress(ConfigError):  # a cache file cut short or edited is made again
        cached = read_json(path, "make quantize")
    if cached is None:
        print(f"{what}: generating the model's own answers to {len(prompts)} prompts with vLLM", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".tmp-answers-") as tmp:
            (Path(tmp) / "prompts.json").write_text(json.dumps(prompt_ids))
            args = [str(model_dir), f"{tmp}/prompts.json", f"{tmp}/answers.json"]
            proc = run_in_serve_env(
                "pipeline.traces", *args, "--max-tokens", str(calib.max_new_tokens), "--seed", str(calib.seed)
            )
            if proc.returncode:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise RuntimeError(
                    f"{what}: vLLM could not generate the model's answers (exit {proc.returncode}): {tail}"
                )
            answers = json.loads((Path(tmp) / "answers.json").read_text())
            write_json(path, {"inputs_sha256": key, **inputs, **answers})
    answers = read_json(path, "make quantize")
    outputs = answers["output_ids"]
    samples = [(p + o)[: calib.max_seq_len] for p, o in zip(prompt_ids, outputs)]
    return samples, {
        **origin,
        "responses": "model",
        "answers_file": str(path),
        "answers_sha256": sha256_file(path),
        "answer_sampling": answers["sampling"],
        "answer_tokens": sum(map(len, outputs)),
        "answers_cut_at_max_new_tokens": sum(r == "length" for r in answers["finish_reasons"]),
    }


def token_hash(samples: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------------------------- backends
def export_bf16(model_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).save_pretrained(out)


def quantize_llmcompressor(
    model_dir: Path, recipe: Recipe, samples: list[list[int]] | None, out: Path, ranks: int = 1
) -> tuple[dict | None, list[int] | None]:
    """compressed-tensors checkpoints through llm-compressor's oneshot(). Returns the mixed-precision plan
    (sensitivity table and the layers kept at sensitive_bits) when the recipe asks for one, and with
    ranks > 1 (llm-compressor's distributed oneshot over that many GPUs, ddp_quantize) each rank's peak
    GPU bytes."""
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


def oneshot_llmcompressor(model, recipe: Recipe, samples: list[list[int]] | None, plan: dict | None, out: Path):
    """The recipe as llm-compressor modifiers, run by oneshot() over the calibration ids; saves to out."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    batching = {}  # calib_batch_size and propagate_error: oneshot() settings
    if recipe.method == "fp8-dynamic":
        modifiers = [QuantizationModifier(targets=["Linear"], scheme="FP8_DYNAMIC", ignore=recipe.ignore)]
    else:
        weights = {
            "num_bits": recipe.bits,
            "type": "int",
            "symmetric": recipe.symmetric,
            "strategy": "channel" if recipe.group_size == -1 else "group",
            "group_size": None if recipe.group_size == -1 else recipe.group_size,
        }
        if recipe.observer != "minmax":  # weights are observed once: memoryless
            weights["observer"] = {"mse": "memoryless_mse", "imatrix_mse": "imatrix_mse"}[recipe.observer]
        groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
        if plan and plan["kept"]:
            kept = "re:" + plan["prefix"].replace(".", r"\.") + r"\.(" + "|".join(map(str, plan["kept"])) + r")\."
            if recipe.sensitive_bits == 16:
                recipe = recipe.model_copy(update={"ignore": [*recipe.ignore, kept]})
            else:  # a name regex outranks the class target "Linear" in compressed-tensors and vLLM
                groups["group_1"] = {"targets": [kept], "weights": {**weights, "num_bits": recipe.sensitive_bits}}
        # "static" act-order reorders columns while quantizing and stores no g_idx: free at inference
        gptq = gptq_modifier(
            config_groups=groups,
            ignore=recipe.ignore,
            dampening_frac=recipe.damping,
            actorder="static" if recipe.act_order else None,
        )
        if recipe.method == "gptq":
            modifiers = [gptq]
        elif recipe.method == "autoround":
            from llmcompressor.modifiers.autoround import AutoRoundModifier

            # Intel's SignRound, one decoder layer at a time. torch.compile off: every run measured here
            # (docs/recipes.md) ran without it, and it compiles each layer anew.
            modifiers = [
                AutoRoundModifier(
                    config_groups=groups, ignore=recipe.ignore, iters=recipe.iters, enable_torch_compile=False
                )
            ]
        else:
            if not torch.accelerator.is_available():
                # AWQ pins its cached activations for faster host-to-device copies; with no device
                # there is nothing to copy to, and pin_memory() fails. Pinning is only a speed-up.
                from llmcompressor.pipelines.cache import IntermediatesCache

                IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None
            # AWQ's scales, then GPTQ's error-compensating rounding of the scaled weights, or round-to-nearest
            rounding = (
                gptq if recipe.rounding == "gptq" else QuantizationModifier(config_groups=groups, ignore=recipe.ignore)
            )
            # oneshot runs each modifier through its own pipeline: all of AWQ's smoothing, then the rounding
            # (GPTQ collects its Hessians in a second calibration pass, over the smoothed model)
            modifiers = [awq_modifier(recipe), rounding]
        if samples is not None and recipe.calib_batch_size > 1:
            batching = padded_batching(recipe.calib_batch_size, model.config)
        if not recipe.propagate_error:
            batching["propagate_error"] = False
    calibration = {}
    if samples is not None:  # already tokenized (and hashed): llm-compressor takes the ids as they are
        from datasets import Dataset

        if batching.get("batch_size", 1) > 1:  # the same samples, in length order: little padding in a batch
            samples = sorted(samples, key=len)
        calibration = dict(
            dataset=Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]}),
            num_calibration_samples=len(samples),
            max_seq_length=max(map(len, samples)),
            shuffle_calibration_samples=False,
        )
        calibration.update(batching)
    oneshot(model=model, recipe=modifiers, **calibration)
    model.save_pretrained(out, save_compressed=True)  # rank 0 writes; the others wait


def ddp_quantize(model_dir: Path, recipe: Recipe, samples, out: Path, plan: dict | None, ranks: int) -> list[int]:
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
                "plan": plan,
            },
        )
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        proc = subprocess.run(
            [*cmd, "-m", "pipeline.quantize", "--ddp-worker", str(spec)],
            cwd=ROOT,
            capture_output=bool(os.environ.get("PIPELINE_QUIET")),  # VERBOSE=1: the ranks' output as it comes
            text=True,
            preexec_fn=die_with_parent,
        )
        if proc.returncode:
            tail = " | ".join(((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-4:])
            raise RuntimeError(f"distributed quantization over {ranks} ranks failed (exit {proc.returncode}): {tail}")
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
    oneshot_llmcompressor(
        model, Recipe.model_validate(spec["recipe"]), spec["samples"], spec["plan"], Path(spec["out"])
    )
    write_json(spec_path.parent / f"rank-{dist.get_rank()}.json", {"peak_gpu_bytes": torch.cuda.max_memory_allocated()})
    dist.barrier()
    dist.destroy_process_group()


def awq_modifier(recipe: Recipe):
    """llm-compressor's AWQModifier with the recipe's grid; with grid_subsample > 1, a subclass whose grid
    search scores each candidate scale on every grid_subsample-th calibration batch only (the activation
    statistics the candidates are made from, and the next layer's inputs, still come from all)."""
    import torch
    from llmcompressor.core import active_session
    from llmcompressor.modifiers.transform.awq import AWQModifier

    kwargs = dict(n_grid=recipe.n_grid, duo_scaling=recipe.duo_scaling)
    if recipe.grid_subsample == 1:
        return AWQModifier(**kwargs)
    stride = recipe.grid_subsample

    class AWQ(AWQModifier):
        @torch.no_grad()
        def _run_samples(self, module):
            cache, masks = self._parent_args_cache[module], active_session().state.loss_masks
            outputs = []
            for i in range(0, len(cache), stride):
                out = module(**cache.fetch(i))
                out = out[0] if isinstance(out, tuple) else out
                # real tokens only (calib_batch_size > 1 pads): the loss below needs no masks
                outputs.append(out[masks[i].to(out.device).bool()] if masks else out)
            return outputs

        @torch.no_grad()
        def _compute_loss(self, fp16_outputs, int_w_outputs):
            sums = torch.zeros(2, dtype=torch.float64, device=fp16_outputs[0].device)  # squared error, elements
            for a, b in zip(fp16_outputs, int_w_outputs):
                sums[0] += torch.nn.functional.mse_loss(a.float(), b.to(a.device).float(), reduction="sum")
                sums[1] += a.numel()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(sums)  # distributed: every rank scores over all ranks' samples
            return (sums[0] / sums[1]).item()

    return AWQ(**kwargs)


def gptq_modifier(**kwargs):
    """llm-compressor's GPTQModifier, its Hessians summed over real tokens only. With calib_batch_size > 1
    the batches are right-padded, and a padding position's activations would enter H = sum 2 x x^T;
    dropping them leaves the sum over the same tokens as one sample a pass, and the sample count is
    kept as one sample a pass counts it: that Hessian from calib_batch_size times fewer forward passes,
    up to how batched bf16 passes round (enough to move GPTQ's result: docs/recipes.md)."""
    import torch
    from llmcompressor.core import active_session
    from llmcompressor.modifiers.quantization import GPTQModifier

    class GPTQ(GPTQModifier):
        def calibrate_module(self, module, args, _output):
            state = active_session().state
            if state.loss_masks is None:  # one sample a pass: nothing padded
                return super().calibrate_module(module, args, _output)
            inp = args[0]
            real = state.loss_masks[state.current_batch_idx].to(inp.device).bool()
            super().calibrate_module(module, (inp[real].unsqueeze(0), *args[1:]), _output)
            self._num_samples[module] += inp.shape[0] - 1  # one per sample, as without batching

        def compress_modules(self):
            super().compress_modules()
            # Distributed over CPU ranks, the offloaded weights sit in shared memory and llm-compressor
            # broadcasts nothing (its GPU ranks wait on a broadcast from each layer's owner): without
            # this barrier rank 0 can propagate, and save, a layer that another rank is still writing
            # (seen under load: a Linear's 4-bit values at chance agreement with one process's).
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.barrier()

    return GPTQ(**kwargs)


def padded_batching(batch_size: int, config) -> dict:
    """oneshot() settings that feed batch_size samples a forward pass (one sample a pass is mostly
    per-call overhead on a small model): right-padded, so that no real token attends to padding, and
    loss_mask = attention_mask, so that AWQ's activation statistics and grid-search loss, and GPTQ's
    Hessians (gptq_modifier), see no padding token. The caller passes the samples in length order, so
    that a batch holds little padding."""
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


SENSITIVITY_SAMPLES, SENSITIVITY_TOKENS = 8, 256  # the first calibration samples, cut to this length


def round_to_grid(w, bits: int, group_size: int, symmetric: bool):
    """w rounded to nearest on the recipe's integer grid, one scale (and zero point) per group of inputs."""
    rows, cols = w.shape
    g = w.float().reshape(rows, -1, cols if group_size == -1 else group_size)
    if symmetric:
        scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-8) / (2 ** (bits - 1) - 0.5)
        q = (g / scale).round().clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) * scale
    else:
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / (2**bits - 1)).clamp(min=1e-8)
        zero = (-lo / scale).round()
        q = ((g / scale).round() + zero).clamp(0, 2**bits - 1).sub(zero) * scale
    return q.reshape(rows, cols).to(w.dtype)


def decoder_layers(model):
    """(qualified name, ModuleList) of the model's decoder layers: the list as long as num_hidden_layers."""
    import torch

    n = model.config.get_text_config().num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return name, module
    raise ConfigError(
        f"size_budget: found no list of {n} decoder layers in {type(model).__name__}; set size_budget: 1.0"
    )


def mixed_precision_plan(model, samples: list[list[int]], recipe: Recipe) -> dict:
    """Sensitivity-guided mixed precision: for each decoder layer, the KLD (nats a token) of the model's
    next-token distribution to its own when that layer's Linears alone are rounded to the recipe's grid
    (round to nearest: a proxy for what GPTQ and AWQ leave, cheap enough for every layer), on the
    first calibration samples. The most sensitive layers are kept at sensitive_bits, most sensitive first,
    while the estimated checkpoint stays within size_budget x the all-`bits` one."""
    import torch

    t0 = time.time()
    prefix, layers = decoder_layers(model)
    batch = [torch.tensor([s[:SENSITIVITY_TOKENS]]) for s in samples[:SENSITIVITY_SAMPLES]]
    with torch.no_grad():
        reference = [model(ids).logits[0].float().log_softmax(-1).to(torch.bfloat16) for ids in batch]

        def kld() -> float:
            total = positions = 0
            for ids, ref in zip(batch, reference):
                logq = model(ids).logits[0].float().log_softmax(-1)
                logp = ref.float()
                total += (logp.exp() * (logp - logq)).sum().item()
                positions += ids.shape[1]
            return total / positions

        table = []
        for i, layer in enumerate(layers):
            linears = [
                (name, m)
                for name, m in layer.named_modules()
                if isinstance(m, torch.nn.Linear) and not _ignored(f"{prefix}.{i}.{name}", recipe.ignore)
            ]
            saved = [m.weight.data.clone() for _, m in linears]
            for _, m in linears:
                m.weight.data = round_to_grid(m.weight.data, recipe.bits, recipe.group_size, recipe.symmetric)
            table.append({"layer": i, "kld": round(kld(), 6), "params": sum(m.weight.numel() for _, m in linears)})
            for (_, m), w in zip(linears, saved):
                m.weight.data = w
    quantized_params = sum(row["params"] for row in table)
    other_params = sum(p.numel() for p in model.parameters()) - quantized_params
    # bytes a weight: bits/8, plus a 16-bit scale (and a packed zero point) per group
    group = model.config.get_text_config().hidden_size if recipe.group_size == -1 else recipe.group_size
    per_weight = recipe.bits / 8 + (2 + (0 if recipe.symmetric else recipe.bits / 8)) / group
    all_low = quantized_params * per_weight + other_params * 2
    extra_per_weight = recipe.sensitive_bits / 8 - per_weight + (0 if recipe.sensitive_bits == 16 else 2 / group)
    budget, kept = (recipe.size_budget - 1) * all_low, []
    for row in sorted(table, key=lambda r: -r["kld"]):
        cost = row["params"] * extra_per_weight
        if cost <= budget:
            kept.append(row["layer"])
            budget -= cost
    return {
        "method": "each decoder layer alone rounded to nearest on the recipe's grid: KLD to the source, nats/token",
        "samples": len(batch),
        "tokens": sum(ids.shape[1] for ids in batch),
        "seconds": round(time.time() - t0, 1),
        "prefix": prefix,
        "size_budget": recipe.size_budget,
        "sensitive_bits": recipe.sensitive_bits,
        "estimated_size_ratio": round((all_low + (recipe.size_budget - 1) * all_low - budget) / all_low, 4),
        "kept": sorted(kept),
        "table": table,
    }


def quantize_gptqmodel(model_dir: Path, recipe: Recipe, samples: list[list[int]], out: Path) -> None:
    """Classic `gptq` / `awq` checkpoints through GPTQModel (auto-gptq's maintained successor)."""
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


def quantize_device(rank_peaks: list[int] | None = None) -> dict:
    """Where the quantizer ran: both libraries use the GPU when torch sees one (llm-compressor onloads
    one layer at a time); its peak memory is torch's own count, what a smaller card must hold (over
    several ranks, the largest rank's, and how many GPUs)."""
    import torch

    ranks = {"ranks": len(rank_peaks)} if rank_peaks else {}
    if not torch.cuda.is_available():
        return {"device": "cpu", **ranks}
    peak = max(rank_peaks) if rank_peaks else torch.cuda.max_memory_allocated()
    return {"device": torch.cuda.get_device_name(0), "peak_gpu_bytes": peak, **ranks}


def check_ranks(ranks: int, recipe: Recipe, what: str) -> int:
    """How many processes quantize this recipe: DP for a calibrated llm-compressor method (its distributed
    oneshot: one GPU a rank, or CPU ranks over gloo where there is no GPU), else 1. A one-line error where
    DP asks for what cannot run."""
    if ranks < 1:
        raise ConfigError(f"DP={ranks}: must be at least 1")
    if ranks == 1 or not recipe.needs_calibration:  # bf16 / fp8-dynamic: nothing to calibrate or share
        return 1
    if recipe.backend != "llmcompressor" or recipe.method not in ("gptq", "awq"):
        raise ConfigError(
            f"{what}: DP={ranks}: only llm-compressor's GPTQ and AWQ quantize over several GPUs "
            f"(this recipe: {recipe.method} via {recipe.backend}); leave DP unset"
        )
    gpus = visible_gpus()
    if not gpus and recipe.method == "awq":  # llm-compressor reduces AWQ's statistics on the GPU only
        raise ConfigError(f"{what}: DP={ranks}: distributed AWQ needs GPUs, and none is visible; leave DP unset")
    if gpus and len(gpus) < ranks:
        raise ConfigError(f"DP={ranks}: one GPU a rank, and {len(gpus)} visible ({','.join(gpus)}); lower DP")
    if not gpus and ranks > (os.cpu_count() or 1):
        raise ConfigError(f"DP={ranks}: no GPU visible, and CPU ranks need a core each ({os.cpu_count()}); lower DP")
    return ranks


# ---------------------------------------------------------------------------------------- smoke
def serve_python() -> str:
    """The serve environment's interpreter (make exports SERVE_PYTHON), checked before any long work: the
    smoke test needs it after the quantizer has run."""
    python = settings.serve_python()
    if not Path(python).exists():
        raise ConfigError(
            f"SERVE_PYTHON={python}: not found; run `make setup` (it creates .venv-serve with vLLM), "
            "or set SERVE_PYTHON to a python with vLLM"
        )
    return python


def run_in_serve_env(module: str, *args: str) -> subprocess.CompletedProcess:
    """python -m <module> in the serve environment (vLLM), which pins another compressed-tensors than the
    quantizers; a killed quantize takes it with it."""
    python = serve_python()
    env = dict(os.environ)
    if "SERVE_PYTHONPATH" in os.environ:  # where vLLM lives in a site dir, not a venv (the H200 kit)
        env["PYTHONPATH"] = os.environ["SERVE_PYTHONPATH"]
    return subprocess.run(
        [python, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, env=env, preexec_fn=die_with_parent
    )


def smoke_check(path: Path, kv_cache_dtype: str = "auto") -> dict:
    """Load the checkpoint in vLLM (serve environment) as it will be served, and generate; a failure is
    an error."""
    t0 = time.time()
    proc = run_in_serve_env("pipeline.smoke", str(path), "--kv-cache-dtype", kv_cache_dtype)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("SMOKE ")), None)
    result = json.loads(line[6:]) if line is not None else None
    if result and result.get("problem"):
        raise RuntimeError(
            f"vLLM loaded {path.name} but its output is degenerate: {result['problem']} "
            f"({result['text']!r}); the weights are broken"
        )
    if proc.returncode or result is None:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"vLLM could not load or run {path.name} (exit {proc.returncode}): {tail}")
    return {**result, "wall_s": round(time.time() - t0, 1)}


# ---------------------------------------------------------------------------------------- build
def build_key(recipe: Recipe, token_ids_sha256: str | None, source: dict) -> str:
    """What the variant is a function of: the recipe (the keys its method uses, so a setting added for
    another method rebuilds nothing), the exact token ids the quantizer was fed (so new rows in the data
    file, another DATA_DIR or another tokenizer rebuild it) and the source's bytes."""
    blob = json.dumps(
        {"recipe": recipe.used(), "calibration_token_ids": token_ids_sha256, "source": source["sha256"]},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def checkpoint_format(folder: Path) -> str:
    quant = json.loads((folder / "config.json").read_text()).get("quantization_config") or {}
    return quant.get("quant_method") or quant.get("format") or "unquantized"


def quantize(
    model: str,
    recipe_path: Path,
    calib_path: Path | None,
    data_dir: str | None,
    out_root: Path,
    force: bool = False,
    ranks: int = 1,
) -> Path:
    recipe = load_recipe(recipe_path)
    ranks = check_ranks(ranks, recipe, str(recipe_path))
    serve_python()  # the smoke test's vLLM (and calibration on the model's own answers)
    if recipe.needs_calibration and calib_path is None:
        raise ConfigError(f"{recipe_path}: method {recipe.method} needs calibration data; set CALIB")
    calib = load_calib(calib_path) if recipe.needs_calibration else None
    model_dir = resolve_model(model)
    dest = out_root / model_name(model) / recipe_path.stem
    if dest.parent.is_dir():
        remove_stale(dest.parent)  # what a killed run left, also when this variant turns out up to date
    source = source_identity(model_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # The calibration token ids are part of the build key, so they are made (seconds) before deciding.
    answers_by = (model_dir, source, out_root / model_name(model) / "calibration")  # responses: model
    samples, origin = (
        calibration_samples(calib, tokenizer, data_dir, str(calib_path), answers_by) if calib else (None, None)
    )
    key = build_key(recipe, samples and token_hash(samples), source)
    old = read_manifest(dest)
    if old and old.get("build_key") == key and not force:
        try:  # the same build key over files that no longer match their manifest is rebuilt, not kept
            read_variant_manifest(dest, verify="sizes")
            print(f"{dest}: up to date")
            return dest
        except ConfigError as e:
            print(f"{dest}: rebuilding: {e}", flush=True)

    # everything else that can fail later, before any long work
    check_modules(model_dir, recipe)
    check_disk(model_dir, recipe, out_root)

    print(
        f"{dest}: building ({recipe.method} via {recipe.backend}"
        f"{f', {len(samples)} calibration samples' if samples else ''})",
        flush=True,
    )
    t0 = time.time()
    mixed_precision = rank_peaks = None
    with staging_dir(dest) as tmp:
        if recipe.method == "bf16":  # 3.
            export_bf16(model_dir, tmp)
        elif recipe.backend == "llmcompressor":
            mixed_precision, rank_peaks = quantize_llmcompressor(model_dir, recipe, samples, tmp, ranks)
        else:
            quantize_gptqmodel(model_dir, recipe, samples, tmp)
        tokenizer.save_pretrained(tmp)  # tokenizer and chat template travel with every variant
        if (model_dir / "generation_config.json").is_file():
            shutil.copy2(model_dir / "generation_config.json", tmp / "generation_config.json")
        # over several ranks the quantizer ran in torchrun's processes: the largest of them
        quantize_s, quantize_rss = time.time() - t0, max(peak_rss_bytes("self"), peak_rss_bytes("children"))
        device = quantize_device(rank_peaks)
        print(f"{dest}: {recipe.method} took {quantize_s:.0f} s; now the smoke test in vLLM", flush=True)
        smoke = smoke_check(tmp, recipe.kv_cache_dtype)  # 4.
        smoke["peak_rss_bytes"] = peak_rss_bytes("children")  # vLLM's peak, now that it has exited
        hashes = file_hashes(tmp)
        manifest = {  # 5.
            "model": model_name(model),
            "variant": recipe_path.stem,
            **({"banner": RANDOM_WEIGHTS_BANNER} if source["random_weights"] else {}),
            "random_weights": source["random_weights"],
            "source": source,
            "recipe": {"file": str(recipe_path), **recipe.used()},
            "format": checkpoint_format(tmp),
            "backend": recipe.backend,
            "calibration": None
            if samples is None
            else {
                "file": str(calib_path),
                **calib.model_dump(exclude={"split"} if origin.get("split") is None else set()),
                **origin,
                "samples": len(samples),
                "tokens": sum(map(len, samples)),
                "token_ids_sha256": token_hash(samples),
            },
            "build_key": key,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "packages": package_versions(),
            "serve_packages": smoke.pop("packages", None),
            "quantize": {"wall_s": round(quantize_s, 1), "peak_rss_bytes": quantize_rss, **device},
            **({"mixed_precision": mixed_precision} if mixed_precision else {}),
            "smoke": smoke,
            "size_bytes": size_on_disk(tmp),
            "sha256": tree_hash(hashes),
            "files": hashes,
        }
        check_data(VariantManifest, manifest, dest / "manifest.json")  # what eval, bench, report read
        write_json(tmp / "manifest.json", manifest)
    print(
        f"{dest}: done in {time.time() - t0:.0f} s, {manifest['size_bytes'] / 2**20:.1f} MiB, "
        f"peak RSS {quantize_rss / 2**30:.2f} GiB, vLLM says {smoke['text']!r}"
    )
    return dest


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ddp-worker"]:  # one rank of --dp: ddp_quantize starts it through torchrun
        quiet(quantizer=True)
        ddp_worker(Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="local checkpoint folder or hub id")
    # one recipe a process: peak RSS is a per-process figure, and memory is returned between variants
    p.add_argument("--recipe", type=Path, required=True, help="recipes/*.yaml")
    p.add_argument("--calib", type=Path, help="calib/*.yaml; needed by GPTQ and AWQ")
    p.add_argument("--data-dir", default=os.environ.get("DATA_DIR") or None, help="local data folder (offline)")
    p.add_argument("--out", type=Path, default=ROOT / "artifacts")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--dp", type=int, default=1, help="GPUs for llm-compressor's distributed GPTQ/AWQ (torchrun)")
    args = p.parse_args(argv)
    quiet(quantizer=True)  # make's default; VERBOSE=1: all of the libraries' output
    # `kill` and make's Ctrl-C become exceptions, so the temporary folder is removed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        quantize(args.model, args.recipe, args.calib, args.data_dir, args.out, args.force, args.dp)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
