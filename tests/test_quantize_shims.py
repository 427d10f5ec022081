"""What pipeline/quantize/llmcompressor_shims.py claims to change in llm-compressor, measured on a tiny
model through oneshot(): AWQ's grid search replays 1 in grid_subsample calibration batches (counted),
GPTQ's Hessians over padded batches count one sample a sample, and any other llm-compressor version
is refused in one line."""

from pathlib import Path

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")

from pipeline.quantize import llmcompressor_shims
from pipeline.quantize.llmcompressor import calibration_kwargs, load_bf16, modifiers
from pipeline.schema import load_recipe

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = [[1, *range(100 + i, 120 + 3 * i)] for i in range(16)]  # 16 samples of different lengths


def test_another_llm_compressor_version_is_refused_in_one_line():
    llmcompressor_shims.check_version()  # the installed one: the version the shims were read from
    with pytest.raises(RuntimeError, match=r"^llm-compressor 0\.15\.0: .*llmcompressor_shims\.py was written for"):
        llmcompressor_shims.check_version("0.15.0")


def mlp_calls(tiny_model, **recipe_settings) -> int:
    """Forward calls of the first decoder layer's MLP (the parent module of AWQ's gate/up mapping) over
    one oneshot() of AWQ with round-to-nearest."""
    from llmcompressor import oneshot

    recipe = load_recipe(ROOT / "recipes/awq-w4a16.yaml").model_copy(update={"rounding": "rtn", **recipe_settings})
    model = load_bf16(tiny_model)
    calls = []
    model.model.layers[0].mlp.register_forward_hook(lambda *_: calls.append(1))
    oneshot(model=model, recipe=modifiers(recipe, None), **calibration_kwargs(recipe, SAMPLES, model.config))
    return len(calls)


@pytest.mark.e2e  # six oneshot() runs of AWQ: about a minute, kept out of make test-fast
@pytest.mark.parametrize("batch_size, stride", [(1, 8), (2, 4)])  # one sample a pass; padded, masked batches
def test_awq_grid_search_replays_one_in_grid_subsample_batches(tiny_model, batch_size, stride):
    """Calls = the calibration passes (the same in every run) + c x the batches each candidate is scored
    on (c: candidates + the unquantized pass, per mapping with this parent). 16 samples in batches of
    batch_size: grid_subsample 1 replays all batches, `stride` one in stride, and the batch count one."""
    batches = len(SAMPLES) // batch_size
    settings = {"calib_batch_size": batch_size}
    every = mlp_calls(tiny_model, grid_subsample=1, **settings)
    one_in_stride = mlp_calls(tiny_model, grid_subsample=stride, **settings)
    only_first = mlp_calls(tiny_model, grid_subsample=batches, **settings)
    assert every > one_in_stride > only_first
    # every - only_first = c (batches - 1); one_in_stride - only_first = c (batches / stride - 1)
    assert (every - only_first) * (batches // stride - 1) == (one_in_stride - only_first) * (batches - 1)
    assert (every - only_first) % ((batches - 1) * (load_recipe(ROOT / "recipes/awq-w4a16.yaml").n_grid + 1)) == 0
