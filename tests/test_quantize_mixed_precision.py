"""Sensitivity-guided mixed precision (pipeline/quantize/mixed_precision.py): the grid a layer is rounded to,
and the layers kept within the size budget."""

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")

from pipeline.quantize.mixed_precision import mixed_precision_plan, round_to_grid
from pipeline.schema import load_recipe
from pipeline.settings import ROOT


@pytest.mark.parametrize("symmetric", [True, False])
def test_round_to_grid_puts_each_group_on_16_levels_within_half_a_step(symmetric):
    import torch

    w = torch.randn(8, 128, dtype=torch.bfloat16)
    q = round_to_grid(w, 4, 64, symmetric).float()
    for group in q.reshape(8, 2, 64).reshape(-1, 64):
        assert len(torch.unique(group)) <= 16
    g = w.float().reshape(-1, 64)
    span = g.abs().amax(-1) * 2 if symmetric else g.amax(-1) - g.amin(-1)
    step = span / 15
    assert ((q.reshape(-1, 64) - g).abs() <= step[:, None] * 0.51 + 1e-2).all()


def test_mixed_precision_keeps_the_most_sensitive_layers_within_the_budget(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = [[1, *range(100, 140)], [1, *range(200, 260)]]
    recipe = load_recipe(ROOT / "recipes/gptq-w4a16.yaml")
    roomy = mixed_precision_plan(model, samples, recipe.model_copy(update={"size_budget": 4.0}))
    assert [r.layer for r in roomy.table] == [0, 1] and all(r.kld > 0 for r in roomy.table)
    assert roomy.kept == [0, 1] and roomy.prefix == "model.layers" and roomy.tokens == 41 + 61
    # room for one layer: the one whose rounding alone moves the output distribution most
    one = roomy.estimated_size_ratio - 1
    tight = mixed_precision_plan(model, samples, recipe.model_copy(update={"size_budget": 1 + one * 0.6}))
    assert tight.kept == [max(roomy.table, key=lambda r: r.kld).layer]
    assert tight.estimated_size_ratio <= 1 + one * 0.6
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the weights are put back
