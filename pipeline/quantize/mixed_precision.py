"""Sensitivity-guided mixed precision (recipes with size_budget > 1): which decoder layers to keep at
sensitive_bits, measured on the whole bf16 model before the quantizer runs."""

from __future__ import annotations

import time

from pipeline.quantize.checks import matches_ignore
from pipeline.schema import ConfigError, LayerSensitivity, MixedPrecisionPlan, Recipe

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


def mixed_precision_plan(model, samples: list[list[int]], recipe: Recipe) -> MixedPrecisionPlan:
    """For each decoder layer, the KLD (nats a token) of the model's next-token distribution to its own
    when that layer's Linears alone are rounded to the recipe's grid (round to nearest: a proxy for what
    GPTQ and AWQ leave, cheap enough for every layer), on the first calibration samples. The most
    sensitive layers are kept at sensitive_bits, most sensitive first, while the estimated checkpoint
    stays within size_budget x the all-`bits` one."""
    import torch

    t0 = time.time()
    prefix, layers = decoder_layers(model)
    batch = [torch.tensor([s[:SENSITIVITY_TOKENS]]) for s in samples[:SENSITIVITY_SAMPLES]]
    with torch.no_grad():
        table = layer_sensitivities(model, batch, prefix, layers, recipe)
    kept, ratio = layers_within_budget(model, table, recipe)
    return MixedPrecisionPlan(
        method="each decoder layer alone rounded to nearest on the recipe's grid: KLD to the source, nats/token",
        samples=len(batch),
        tokens=sum(ids.shape[1] for ids in batch),
        seconds=round(time.time() - t0, 1),
        prefix=prefix,
        size_budget=recipe.size_budget,
        sensitive_bits=recipe.sensitive_bits,
        estimated_size_ratio=ratio,
        kept=sorted(kept),
        table=table,
    )


def layer_sensitivities(model, batch, prefix: str, layers, recipe: Recipe) -> list[LayerSensitivity]:
    """Each layer's KLD with only its Linears rounded; the weights are put back after each."""
    import torch

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
            m
            for name, m in layer.named_modules()
            if isinstance(m, torch.nn.Linear) and not matches_ignore(f"{prefix}.{i}.{name}", recipe.ignore)
        ]
        saved = [m.weight.data.clone() for m in linears]
        for m in linears:
            m.weight.data = round_to_grid(m.weight.data, recipe.bits, recipe.group_size, recipe.symmetric)
        table.append(LayerSensitivity(layer=i, kld=round(kld(), 6), params=sum(m.weight.numel() for m in linears)))
        for m, w in zip(linears, saved):
            m.weight.data = w
    return table


def layers_within_budget(model, table: list[LayerSensitivity], recipe: Recipe) -> tuple[list[int], float]:
    """The layers kept at sensitive_bits, most sensitive first while the estimated size fits the budget,
    and the estimated size ratio to the all-`bits` checkpoint."""
    quantized_params = sum(row.params for row in table)
    other_params = sum(p.numel() for p in model.parameters()) - quantized_params
    # bytes a weight: bits/8, plus a 16-bit scale (and a packed zero point) per group
    group = model.config.get_text_config().hidden_size if recipe.group_size == -1 else recipe.group_size
    per_weight = recipe.bits / 8 + (2 + (0 if recipe.symmetric else recipe.bits / 8)) / group
    all_low = quantized_params * per_weight + other_params * 2
    extra_per_weight = recipe.sensitive_bits / 8 - per_weight + (0 if recipe.sensitive_bits == 16 else 2 / group)
    budget, kept = (recipe.size_budget - 1) * all_low, []
    for row in sorted(table, key=lambda r: -r.kld):
        cost = row.params * extra_per_weight
        if cost <= budget:
            kept.append(row.layer)
            budget -= cost
    return kept, round((all_low + (recipe.size_budget - 1) * all_low - budget) / all_low, 4)
