"""Which variant is another's step: the same recipe with techniques added (a rotation, mixed precision, an
FP8 KV cache, a search setting), so that eval and the report can show what each technique buys against the
variant without it, on the same items, rather than only each against bf16.

A variant B is a base of V where their recipes (as the manifests record them) differ only in keys that B
leaves at the recipe schema's default and V sets: gptq-w4a16 is gptq-w4a16-quip-b64's base (the rotation
keys), and gptq-w4a16-quip-b64 is gptq-w4a16-quip-b64-mixed8's (size_budget, sensitive_bits). A different
method or backend has no default, so awq and gptq are never each other's. V's step is over each of its
nearest bases (the fewest keys added): a chain of variants reads as one technique at a time."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.schema import Recipe

NOT_COMPARED = {"description", "file"}  # what a recipe says about itself, not how it builds
# each key's default in the recipe schema; a required key (method, backend) has none, so is never "added"
DEFAULTS = {k: f.get_default(call_default_factory=True) for k, f in Recipe.model_fields.items() if not f.is_required()}


@dataclass(frozen=True)
class Step:
    """V over B: the keys V adds to B's recipe, with V's values."""

    variant: str
    base: str
    added: dict[str, object]


def recipe_values(record: dict) -> dict:
    """Every recipe key's value for a manifest's recipe record: the record's, else the schema's default
    (a key a method does not use, or the rotation keys where rotation is off, is at its default)."""
    return {k: record.get(k, DEFAULTS.get(k)) for k in Recipe.model_fields if k not in NOT_COMPARED}


def added_over(variant: dict, base: dict) -> dict | None:
    """The keys `variant` adds to `base` (both recipe_values), or None where base is not its base."""
    changed = {k for k in variant if variant[k] != base[k]}
    if not changed or not all(k in DEFAULTS and base[k] == DEFAULTS[k] for k in changed):
        return None
    return {k: variant[k] for k in Recipe.model_fields if k in changed}


def steps(recipes: dict[str, dict]) -> list[Step]:
    """Each variant's steps over its nearest bases, from {variant: its manifest's recipe record}."""
    values = {name: recipe_values(record) for name, record in recipes.items()}
    found = []
    for name in sorted(values):
        over = {b: added for b in sorted(values) if b != name and (added := added_over(values[name], values[b]))}
        if over:
            fewest = min(len(a) for a in over.values())
            found += [Step(variant=name, base=b, added=a) for b, a in over.items() if len(a) == fewest]
    return found
