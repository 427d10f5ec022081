"""What the system python3 that runs make (pipeline/settings.py) reads of a recipe without a YAML parser: its
top-level keys as written, and the widths of its integer weights, which decide where vLLM serves them dense."""

from __future__ import annotations

import re
from pathlib import Path

# The recipe methods whose weights are integers (W4A16, W8A16): vLLM serves them through its WNA16 kernels
WNA16_METHODS = ("gptq", "awq", "autoround")


def recipe_field(path: Path, key: str) -> str:
    """A top-level `key:` of a recipe file, as written ("" where the file or the key is missing)."""
    found = re.search(rf"^{key}:\s*([\w.-]+)", path.read_text(), re.M) if path.is_file() else None
    return found.group(1) if found else ""


def integer_weight_bits(recipe: dict) -> set[int]:
    """The widths of a recipe's integer weights (its keys as a dict): `bits`, and 8 where a mixed recipe
    (size_budget) keeps its sensitive layers at INT8; none for bf16 and FP8."""
    if recipe.get("method") not in WNA16_METHODS:
        return set()
    bits = {int(recipe.get("bits") or 4)}
    if recipe.get("size_budget") and int(recipe.get("sensitive_bits") or 16) == 8:
        bits.add(8)
    return bits


def recipe_weight_bits(path: Path) -> set[int]:
    """integer_weight_bits of a recipe file."""
    return integer_weight_bits({k: recipe_field(path, k) for k in ("method", "bits", "size_budget", "sensitive_bits")})
