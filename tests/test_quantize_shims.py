"""What pipeline/quantize/llmcompressor_shims.py claims to change in llm-compressor, measured on a tiny
model through oneshot(): AWQ's grid search replays 1 in grid_subsample calibration batches (counted),
GPTQ's Hessians over padded batches count one sample a sample, and any other llm-compressor version
is refused in one line."""

import pytest

# The quantizer environment's tests (.venv-quant): skipped where the quantizers are not installed.
pytest.importorskip("llmcompressor")

from pipeline.quantize import llmcompressor_shims
from pipeline.quantize.llmcompressor import calibration_kwargs, load_bf16, modifiers
from pipeline.schema import load_recipe
from pipeline.settings import ROOT

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


@pytest.mark.e2e  # six oneshot() runs of AWQ: kept out of make test-fast
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


def hessian_inputs(tiny_model, modifier_class, batch_size: int, monkeypatch) -> list[tuple[int, int, int]]:
    """(batch rows, tokens a row, sample count before the call) of each input GPTQ accumulates into the
    Hessian of the first layer's q_proj, over one oneshot() of GPTQ."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import base

    recipe = load_recipe(ROOT / "recipes/gptq-w4a16.yaml").model_copy(update={"calib_batch_size": batch_size})
    model = load_bf16(tiny_model)
    target, seen, accumulate = model.model.layers[0].self_attn.q_proj, [], base.accumulate_hessian

    def recording(inp, module, hessian, num_samples):
        if module is target:
            seen.append((inp.shape[0], inp.shape[1], int(num_samples)))
        return accumulate(inp, module, hessian, num_samples)

    monkeypatch.setattr(base, "accumulate_hessian", recording)
    gptq = modifier_class(config_groups=modifiers(recipe, None)[0].config_groups, ignore=recipe.ignore)
    oneshot(model=model, recipe=[gptq], **calibration_kwargs(recipe, SAMPLES, model.config))
    return seen


@pytest.mark.e2e  # two oneshot() runs of GPTQ, beside the AWQ counts above
def test_gptq_hessians_over_padded_batches_see_real_tokens_only(tiny_model, monkeypatch):
    from llmcompressor.modifiers.quantization import GPTQModifier

    real_tokens = sum(map(len, SAMPLES))
    plain = hessian_inputs(tiny_model, GPTQModifier, 4, monkeypatch)
    assert len(plain) == 4 and sum(rows * tokens for rows, tokens, _ in plain) > real_tokens  # padding counted
    shim = hessian_inputs(tiny_model, llmcompressor_shims.GPTQ, 4, monkeypatch)
    assert [rows for rows, _, _ in shim] == [1] * 4 and sum(tokens for _, tokens, _ in shim) == real_tokens
    assert [n for _, _, n in shim] == [0, 4, 8, 12] == [n for _, _, n in plain]  # one sample a sample
    one_a_pass = hessian_inputs(tiny_model, llmcompressor_shims.GPTQ, 1, monkeypatch)
    assert sum(tokens for _, tokens, _ in one_a_pass) == real_tokens and len(one_a_pass) == len(SAMPLES)
