"""Recipes and calibration sets: every shipped file is valid, and each kind of mistake is one line that
names the file and the key."""

import re

import pytest

from pipeline.schema import ConfigError, load_calib, load_recipe
from pipeline.settings import ROOT

AWQ = "description: x\nmethod: awq\nbackend: llmcompressor\n"
GOOD_GPTQ = """description: x
method: gptq
backend: llmcompressor
bits: 4
group_size: 64
"""


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_recipes_are_valid(path):
    recipe = load_recipe(path)
    assert recipe.description


@pytest.mark.parametrize("path", sorted((ROOT / "calib").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_calibration_sets_are_valid(path):
    assert load_calib(path).num_samples > 0


def write(tmp_path, text, name="r.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(loader, path) -> str:
    with pytest.raises(ConfigError) as e:
        loader(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


@pytest.mark.parametrize(
    "change, expected",
    [
        ("group_sise: 64\n", "group_sise: unknown key; allowed: description, method"),
        ("bits: four\n", "bits:"),
        ("bits: 3\n", "bits:"),
        ("damping: 1.5\n", "damping: Input should be less than 1 (got 1.5)"),
        ("damping: 0\n", "damping: Input should be greater than 0"),
    ],
)
def test_recipe_key_errors_name_the_key(tmp_path, change, expected):
    text = "".join(l + "\n" for l in GOOD_GPTQ.splitlines() if not l.startswith(change.split(":")[0] + ":")) + change
    assert expected in error_of(load_recipe, write(tmp_path, text))


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            GOOD_GPTQ.replace("group_size: 64", "group_size: 100"),
            "group_size: must be -1 (one group per row) or a power of two",
        ),
        (
            GOOD_GPTQ.replace("method: gptq", "method: rtn"),
            "method: Input should be 'bf16', 'gptq', 'awq', 'autoround' or 'fp8-dynamic'",
        ),
        (
            GOOD_GPTQ.replace("backend: llmcompressor", "backend: transformers"),
            "backend: gptq is made by gptqmodel or llmcompressor",
        ),
        (
            "description: x\nmethod: fp8-dynamic\nbackend: llmcompressor\ngroup_size: 32\n",
            "group_size: not used by method fp8-dynamic",
        ),
        (
            GOOD_GPTQ.replace("backend: llmcompressor", "backend: gptqmodel") + "symmetric: false\n",
            "symmetric: vLLM rejects classic GPTQ",
        ),
        (
            GOOD_GPTQ.replace("backend: llmcompressor", "backend: gptqmodel") + "act_order: true\n",
            "act_order: vLLM rejects classic GPTQ with desc_act=true",
        ),
        (
            GOOD_GPTQ.replace("backend: llmcompressor", "backend: gptqmodel") + "ignore: [lm_head, mlp.down_proj]\n",
            "ignore: backend gptqmodel",
        ),
        (
            "description: x\nmethod: awq\nbackend: gptqmodel\ngroup_size: 64\nsymmetric: true\n",
            "symmetric: the classic AWQ format stores zero points",
        ),
        (AWQ + "act_order: true\n", "act_order: used by AWQ only with rounding: gptq"),
        (
            AWQ.replace("llmcompressor", "gptqmodel") + "symmetric: false\nn_grid: 6\n",
            "n_grid: an llm-compressor setting",
        ),
        (AWQ + "n_grid: 1\n", "n_grid: Input should be greater than or equal to 2"),
        (GOOD_GPTQ + "n_grid: 6\n", "n_grid: not used by method gptq"),
        (
            GOOD_GPTQ.replace("llmcompressor", "gptqmodel") + "calib_batch_size: 16\n",
            "calib_batch_size: an llm-compressor setting",
        ),
        (GOOD_GPTQ + "observer: absmax\n", "observer: Input should be 'minmax', 'mse' or 'imatrix_mse'"),
        (
            GOOD_GPTQ.replace("llmcompressor", "gptqmodel") + "observer: mse\n",
            "observer: an llm-compressor setting",
        ),
        (
            "description: x\nmethod: bf16\nbackend: transformers\nkv_cache_dtype: int8\n",
            "kv_cache_dtype: Input should be",
        ),
        (GOOD_GPTQ + "sensitive_bits: 8\n", "sensitive_bits: does nothing without size_budget above 1.0"),
        (
            GOOD_GPTQ.replace("bits: 4", "bits: 8") + "size_budget: 1.1\nsensitive_bits: 8\n",
            "sensitive_bits: 8 is not above bits (8)",
        ),
        (GOOD_GPTQ + "size_budget: 0.9\n", "size_budget: Input should be greater than or equal to 1"),
        (GOOD_GPTQ + "iters: 50\n", "iters: not used by method gptq"),
        (
            GOOD_GPTQ.replace("method: gptq", "method: autoround") + "symmetric: false\n",
            "symmetric: AutoRound through llm-compressor 0.14 loses asymmetric zero points",
        ),
        (
            GOOD_GPTQ.replace("method: gptq", "method: autoround").replace("llmcompressor", "gptqmodel"),
            "backend: autoround is made by llmcompressor, not gptqmodel",
        ),
        (
            "description: x\nmethod: bf16\nbackend: transformers\nsize_budget: 1.1\n",
            "size_budget: not used by method bf16",
        ),
        ("method: bf16\nbackend: transformers\n", "description: Field required"),
        ("- just\n- a list\n", "expected a mapping"),
        ("method: [unclosed\n", "not valid YAML"),
    ],
)
def test_recipe_impossible_values(tmp_path, text, expected):
    assert expected in error_of(load_recipe, write(tmp_path, text))


def test_act_order_with_per_row_groups_is_loadable_classic_gptq(tmp_path):
    text = GOOD_GPTQ.replace("backend: llmcompressor", "backend: gptqmodel").replace("group_size: 64", "group_size: -1")
    assert load_recipe(write(tmp_path, text + "act_order: true\n")).act_order


def test_awq_speed_and_rounding_settings(tmp_path):
    text = AWQ + "symmetric: false\ngroup_size: 64\n"
    fast = "n_grid: 6\ngrid_subsample: 4\ncalib_batch_size: 16\npropagate_error: false\nrounding: gptq\n"
    fast += "act_order: true\n"
    recipe = load_recipe(write(tmp_path, text + fast))
    assert (
        recipe.n_grid,
        recipe.grid_subsample,
        recipe.calib_batch_size,
        recipe.propagate_error,
        recipe.rounding,
        recipe.act_order,
    ) == (6, 4, 16, False, "gptq", True)
    plain = load_recipe(write(tmp_path, text, "plain.yaml"))  # llm-compressor's own defaults
    assert (
        plain.n_grid,
        plain.duo_scaling,
        plain.grid_subsample,
        plain.calib_batch_size,
        plain.propagate_error,
        plain.rounding,
    ) == (20, True, 1, 1, True, "rtn")


def test_quality_settings_are_read_and_used(tmp_path):
    """The scale observer, mixed precision and the FP8 KV cache: each lands in the recipe as its method
    uses it (Recipe.used() is what the build key and the manifest hold)."""
    mixed = load_recipe(write(tmp_path, GOOD_GPTQ + "observer: mse\nsize_budget: 1.1\n", "m.yaml"))
    assert (mixed.observer, mixed.size_budget, mixed.sensitive_bits) == ("mse", 1.1, 16)
    kv = load_recipe(
        write(tmp_path, "description: x\nmethod: bf16\nbackend: transformers\nkv_cache_dtype: fp8\n", "k.yaml")
    )
    assert kv.used() == {"description": "x", "method": "bf16", "backend": "transformers", "kv_cache_dtype": "fp8"}


def test_missing_recipe_file(tmp_path):
    assert "no such file" in error_of(load_recipe, tmp_path / "nope.yaml")


def test_calib_needs_exactly_one_source(tmp_path):
    both = "description: x\nhub_id: a/b\ngenerator: arithmetic-word-problems\nnum_samples: 4\nmax_seq_len: 64\n"
    assert "source: give either generator" in error_of(load_calib, write(tmp_path, both))
    neither = "description: x\nnum_samples: 4\nmax_seq_len: 64\n"
    assert "source: give either generator" in error_of(load_calib, write(tmp_path, neither))


def test_calib_bounds(tmp_path):
    text = "description: x\ngenerator: arithmetic-word-problems\nnum_samples: 0\nmax_seq_len: 64\n"
    assert "num_samples: Input should be greater than 0" in error_of(load_calib, write(tmp_path, text))


def test_duplicate_keys_are_refused_not_last_one_wins(tmp_path):
    path = write(tmp_path, GOOD_GPTQ + "group_size: 32\n")
    assert error_of(load_recipe, path) == f"{path}: line 6: not valid YAML (duplicate key 'group_size')"
    nested = write(tmp_path, "description: x\nsource: {a: 1, a: 2}\n", "c.yaml")
    assert "line 2: not valid YAML (duplicate key 'a')" in error_of(load_calib, nested)


def test_yaml_syntax_errors_give_the_line(tmp_path):
    path = write(tmp_path, "description: x\nmethod: gptq\nbackend: [llmcompressor\n")
    assert re.fullmatch(rf"{re.escape(str(path))}: line 3: not valid YAML \(.+\)", error_of(load_recipe, path))
    path = write(tmp_path, "description: x\n  method: gptq\n")
    assert re.fullmatch(rf"{re.escape(str(path))}: line [12]: not valid YAML \(.+\)", error_of(load_recipe, path))


def test_a_folder_given_as_recipe_says_so(tmp_path):
    assert error_of(load_recipe, tmp_path) == f"{tmp_path}: is a folder; give a .yaml file"
