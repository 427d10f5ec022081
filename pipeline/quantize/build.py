"""The build of one variant: the checks, the calibration ids and the build key, the up-to-date decision,
the backend into a staging folder, the smoke test, and the manifest (schema.VariantManifest) written
into the folder before it is renamed into place."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline import exits
from pipeline.artifacts import RANDOM_WEIGHTS_BANNER, read_manifest, read_variant_manifest
from pipeline.checkpoint_files import file_hashes, size_on_disk
from pipeline.identity import tree_hash
from pipeline.quantize.calibration_samples import AnswersFrom, calibration_samples, token_hash
from pipeline.quantize.checks import (
    check_disk,
    check_modules,
    check_ranks,
    model_name,
    resolve_model,
    source_identity,
    variant_bytes,
)
from pipeline.quantize.gptqmodel import quantize_gptqmodel
from pipeline.quantize.llmcompressor import quantize_llmcompressor
from pipeline.quantize.serve_env import check_servable, serve_python, smoke_check
from pipeline.run_record import git_commit, package_versions, peak_rss_bytes
from pipeline.schema import (
    CalibrationRecord,
    CalibSet,
    ConfigError,
    MixedPrecisionPlan,
    QuantizeRun,
    Recipe,
    SourceRef,
    VariantManifest,
    load_calib,
    load_recipe,
)
from pipeline.staging import remove_stale, staging_dir, write_json


def export_bf16(model_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).save_pretrained(out)


def build_key(recipe: Recipe, token_ids_sha256: str | None, source: SourceRef) -> str:
    """What the variant is a function of: the recipe (the keys its method uses, so a setting added for
    another method rebuilds nothing), the exact token ids the quantizer was fed (so new rows in the data
    file, another DATA_DIR or another tokenizer rebuild it) and the source's bytes."""
    blob = json.dumps(
        {"recipe": recipe.used(), "calibration_token_ids": token_ids_sha256, "source": source.sha256},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def checkpoint_format(folder: Path) -> str:
    quant = json.loads((folder / "config.json").read_text()).get("quantization_config") or {}
    return quant.get("quant_method") or quant.get("format") or "unquantized"


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


def up_to_date(dest: Path, key: str, force: bool) -> bool:
    """The variant on disk was built with this key and its files still match its manifest (the one place
    quantize reads a variant's manifest back)."""
    if force or read_manifest(dest) is None:  # none, or not JSON: nothing to keep
        return False
    try:  # files that no longer match their manifest are rebuilt, not kept
        old = read_variant_manifest(dest, verify="sizes")
    except ConfigError as e:
        print(f"{dest}: rebuilding: {e}", flush=True)
        return False
    if old is None or old.build_key != key:
        return False
    print(f"{dest}: up to date")
    return True


def quantize(
    model: str,
    recipe_path: Path,
    calib_path: Path | None,
    data_dir: str | None,
    out_root: Path,
    force: bool = False,
    ranks: int = 1,
) -> Path:
    """Build artifacts/<model>/<variant>/ from MODEL as the recipe says, unless it is up to date."""
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
    answers_from = AnswersFrom(model_dir, source.sha256, out_root / model_name(model) / "calibration")
    samples, origin = (
        calibration_samples(calib, tokenizer, data_dir, str(calib_path), answers_from) if calib else (None, None)
    )
    key = build_key(recipe, samples and token_hash(samples), source)
    if up_to_date(dest, key, force):
        return dest
    # everything else that can fail later, before any long work
    check_modules(model_dir, recipe)
    check_disk(model_dir, recipe, out_root)
    check_servable(recipe, recipe_path)
    calibration = samples and calibration_record(calib, calib_path, origin, samples)
    build(Build(model, recipe_path, recipe, model_dir, source, tokenizer, samples, calibration, key, ranks), dest)
    return dest


@dataclass(frozen=True)
class Build:
    """What build() needs, all checked: the recipe validated, the source identified, the ids hashed."""

    model: str
    recipe_path: Path
    recipe: Recipe
    model_dir: Path
    source: SourceRef
    tokenizer: object
    samples: list[list[int]] | None
    calibration: CalibrationRecord | None
    key: str
    ranks: int


def calibration_record(calib: CalibSet, calib_path: Path, origin: dict, samples: list[list[int]]) -> CalibrationRecord:
    """The manifest's calibration entry: the set as read, where from, and the ids' count and hash."""
    return CalibrationRecord.model_validate(
        {
            "file": str(calib_path),
            **calib.model_dump(exclude={"split"} if origin.get("split") is None else set()),
            **origin,
            "samples": len(samples),
            "tokens": sum(map(len, samples)),
            "token_ids_sha256": token_hash(samples),
        }
    )


def build(b: Build, dest: Path) -> None:
    recipe = b.recipe
    print(
        f"{dest}: building ({recipe.method} via {recipe.backend}"
        f"{f', {len(b.samples)} calibration samples' if b.samples else ''})",
        flush=True,
    )
    t0 = time.time()
    exits.doing(f"building {dest}")
    with staging_dir(dest, needs=variant_bytes(b.model_dir, recipe)) as tmp:
        plan, run = run_backend(b, tmp)
        print(f"{dest}: {recipe.method} took {run.wall_s:.0f} s; now the smoke test in vLLM", flush=True)
        smoke = smoke_check(tmp, recipe.kv_cache_dtype)
        smoke["peak_rss_bytes"] = peak_rss_bytes("children")  # vLLM's peak, now that it has exited
        manifest = variant_manifest(b, tmp, plan, run, smoke)
        write_json(tmp / "manifest.json", manifest.model_dump(mode="json", exclude_unset=True))
    print(
        f"{dest}: done in {time.time() - t0:.0f} s, {manifest.size_bytes / 2**20:.1f} MiB, "
        f"peak RSS {run.peak_rss_bytes / 2**30:.2f} GiB, vLLM says {smoke['text']!r}"
    )


def run_backend(b: Build, tmp: Path) -> tuple[MixedPrecisionPlan | None, QuantizeRun]:
    """The recipe's backend into tmp, with the tokenizer and generation config every variant carries."""
    t0, plan, rank_peaks = time.time(), None, None
    if b.recipe.method == "bf16":
        export_bf16(b.model_dir, tmp)
    elif b.recipe.backend == "llmcompressor":
        plan, rank_peaks = quantize_llmcompressor(b.model_dir, b.recipe, b.samples, tmp, b.ranks)
    else:
        quantize_gptqmodel(b.model_dir, b.recipe, b.samples, tmp)
    b.tokenizer.save_pretrained(tmp)  # tokenizer and chat template travel with every variant
    if (b.model_dir / "generation_config.json").is_file():
        shutil.copy2(b.model_dir / "generation_config.json", tmp / "generation_config.json")
    # over several ranks the quantizer ran in torchrun's processes: the largest of them
    wall_s, rss = time.time() - t0, max(peak_rss_bytes("self"), peak_rss_bytes("children"))
    return plan, QuantizeRun(wall_s=round(wall_s, 1), peak_rss_bytes=rss, **quantize_device(rank_peaks))


def variant_manifest(
    b: Build, tmp: Path, plan: MixedPrecisionPlan | None, run: QuantizeRun, smoke: dict
) -> VariantManifest:
    hashes = file_hashes(tmp)
    return VariantManifest(
        model=model_name(b.model),
        variant=b.recipe_path.stem,
        **({"banner": RANDOM_WEIGHTS_BANNER} if b.source.random_weights else {}),
        random_weights=b.source.random_weights,
        source=b.source,
        recipe={"file": str(b.recipe_path), **b.recipe.used()},
        format=checkpoint_format(tmp),
        backend=b.recipe.backend,
        calibration=b.calibration,
        build_key=b.key,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        git_commit=git_commit(),
        packages=package_versions(),
        serve_packages=smoke.pop("packages", None),
        quantize=run,
        **({"mixed_precision": plan} if plan else {}),
        smoke=smoke,
        size_bytes=size_on_disk(tmp),
        sha256=tree_hash(hashes),
        files=hashes,
    )
