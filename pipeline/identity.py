"""What a variant is, as every figure measured on it records it (schema.Identity), and whether figures
recorded with an identity were measured on the variant now on disk: the staleness line that tells which
command measures them again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.schema import Identity, VariantManifest


def tree_hash(hashes: dict[str, str]) -> str:
    """One hash for a whole checkpoint, from its per-file hashes."""
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def variant_identity(manifest: VariantManifest) -> Identity:
    """What a variant is, as every figure measured on it records it (schema.Identity): the hash of its
    files as built, of its recipe and of its calibration token ids, all from its manifest (read with
    read_variant_manifest, which holds the manifest to the files)."""
    # as the manifest records it (a default it does not write is not part of the hash); the path does not
    # make the weights
    recipe = manifest.recipe.model_dump(mode="json", exclude_unset=True, exclude={"file"})
    return Identity(
        checkpoint_sha256=tree_hash(manifest.files),
        recipe_sha256=hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest(),
        calibration_sha256=manifest.calibration and manifest.calibration.token_ids_sha256,
    )


# What measures the figures of each file that records an identity: the command that measures them again.
RERUN = {
    "eval-report.json": "make eval RECIPES={}",
    "eval/results.json": "make eval RECIPES={}",
    "bench.json": "make bench BENCH_RECIPES={}",
}
IDENTITY_KEYS = {"checkpoint_sha256": "", "recipe_sha256": "recipe ", "calibration_sha256": "calibration "}


def stale_figures(
    what: str, measured: Identity | None, variant_dir: Path, current: Identity | None, rerun: str
) -> str | None:
    """None where the figures in `what` were measured on the variant now in `variant_dir` (`current`: its
    variant_identity, None where it has no manifest); else one line saying what differs and to run
    `rerun`, e.g. "eval-report.json was measured on gptq-w4a16 14cd3493…, but artifacts/m/gptq-w4a16 is
    now 9ab1c2d4…: run make eval RECIPES=gptq-w4a16"."""
    name = variant_dir.name
    if measured is None:
        return f"{what} does not record which checkpoint of {name} it measured: run {rerun}"
    if current is None:
        was = measured.checkpoint_sha256[:8]
        return f"{what} was measured on {name} {was}…, but {variant_dir} has no manifest.json: run {rerun}"
    for key, label in IDENTITY_KEYS.items():
        if getattr(measured, key) != getattr(current, key):
            was, now = (str(x)[:8] + "…" if x else "none" for x in (getattr(measured, key), getattr(current, key)))
            return f"{what} was measured on {name} {label}{was}, but {variant_dir} is now {label}{now}: run {rerun}"
    return None
