"""What could fail later, checked before any long work: the model folder, the recipe against the model's
modules, OUT's disk space, DP. Each failure is a ConfigError of one line naming the setting."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from pipeline.artifacts import read_manifest
from pipeline.checkpoint_files import WEIGHT_GLOBS, check_weights, file_hashes, manifest_differences
from pipeline.identity import tree_hash
from pipeline.schema import ConfigError, Recipe, SourceRef
from pipeline.serving import visible_gpus


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


def source_identity(model_dir: Path) -> SourceRef:
    """Which weights a variant came from: the hash of the files on disk (seconds, not a load). Where
    the source has a manifest (we made it), the files must still match it: a damaged or edited copy is
    refused, never built under the good copy's hash."""
    manifest = read_manifest(model_dir) or {}
    hashes = file_hashes(model_dir)
    if manifest.get("files") and (changed := manifest_differences(manifest["files"], hashes)):
        raise ConfigError(
            f"MODEL={model_dir}: {'; '.join(changed)} (damaged or edited since it was made); rebuild the "
            "source (`make source` / `make random-model`)"
        )
    return SourceRef(
        path=str(model_dir),
        sha256=tree_hash(hashes),
        origin=manifest.get("origin", "external"),  # a folder from elsewhere has no manifest
        random_weights=bool(manifest.get("random_weights", False)),
    )


def matches_ignore(name: str, patterns: list[str]) -> bool:
    """llm-compressor's `ignore` rule: "re:" patterns match the module name, others its tail."""
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
        if not any(matches_ignore(name, [pattern]) for name in names):
            tails = sorted({name.rsplit(".", 1)[-1] for name in names if name})
            near = difflib.get_close_matches(pattern, tails, n=1)
            raise ConfigError(
                f"ignore: {pattern!r} matches no module of {model_dir.name}"
                f"{f' (did you mean {near[0]!r}?)' if near else ''}; fix the name, or use re: for a regex"
            )
    check_rotation(model, recipe)
    if not recipe.needs_calibration or recipe.group_size == -1:  # the grouped INT methods
        return
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not matches_ignore(name, recipe.ignore):
            if module.in_features % recipe.group_size:
                raise ConfigError(
                    f"group_size: {recipe.group_size} does not divide the {module.in_features} input features of "
                    f"{name}; use a group size that divides it (e.g. 64 or 32), or -1"
                )


def check_rotation(model, recipe: Recipe) -> None:
    """rotation: quip rotates the input of every Linear the recipe quantizes by a Hadamard matrix of
    rotation_block_size (or of the Linear's input features); spinquant rotates the residual stream (R1) in
    blocks of rotation_block_size (or hidden_size) and each head's values (R2) by one of the head dimension.
    Each size must divide what it rotates, and a Hadamard matrix of that size must exist (hadamard: a power
    of two; random-hadamard: a known matrix's size times a power of two, compressed-tensors' table)."""
    if recipe.rotation == "none":
        return
    import torch

    if recipe.rotation == "spinquant":
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotated = [("hidden size", config.hidden_size, recipe.rotation_block_size), ("head dimension", head_dim, None)]
    else:
        rotated = [
            (f"input features of {name}", module.in_features, recipe.rotation_block_size)
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not matches_ignore(name, recipe.ignore)
        ]
    for what, width, block in rotated:
        size = block or width
        if width % size:
            raise ConfigError(
                f"rotation_block_size: {size} does not divide the {width} {what}; use a block size that divides "
                "every rotated width (e.g. 64), or leave it unset"
            )
        if not hadamard_exists(size, recipe.rotation_type):
            raise ConfigError(
                f"rotation_block_size: no {recipe.rotation_type} matrix of size {size} (the {what}"
                f"{'' if block else ', the block size unset'}); set a block size that divides it"
                f"{' and is a power of two' if recipe.rotation_type == 'hadamard' else ''}"
            )


def hadamard_exists(size: int, kind: str) -> bool:
    """Whether compressed-tensors can make a Hadamard matrix of this size (what QuIPModifier builds)."""
    if size & (size - 1) == 0:
        return True
    if kind == "hadamard":  # Sylvester's construction: powers of two only
        return False
    import torch
    from compressed_tensors.transform.utils.hadamard import _fetch_hadamard_divisor

    return _fetch_hadamard_divisor(size, torch.float32, device=torch.device("meta")) is not None


def variant_bytes(model_dir: Path, recipe: Recipe) -> int:
    """About what the variant takes on disk, with a margin: a 16-bit source shrinks by weight_bits/16; 25%
    for scales, zero points and tokenizer."""
    weights = sum(p.stat().st_size for g in WEIGHT_GLOBS for p in model_dir.glob(g))
    return int(weights * recipe.weight_bits / 16 * 1.25) + (64 << 20)


def check_disk(model_dir: Path, recipe: Recipe, out_root: Path) -> None:
    need = variant_bytes(model_dir, recipe)
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


def check_ranks(ranks: int, recipe: Recipe, what: str) -> int:
    """How many processes quantize this recipe: DP for a calibrated llm-compressor method (its distributed
    oneshot: one GPU a rank, or CPU ranks over gloo where there is no GPU), else 1. A one-line error where
    DP asks for what cannot run."""
    if ranks < 1:
        raise ConfigError(f"DP={ranks}: must be at least 1")
    if ranks == 1 or not recipe.needs_calibration:  # bf16 / fp8-dynamic: nothing to calibrate or share
        return 1
    if recipe.rotation != "none":
        raise ConfigError(
            f"{what}: DP={ranks}: rotation: {recipe.rotation} is built in one process here; leave DP unset"
        )
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
