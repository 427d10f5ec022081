"""Each environment imports the libraries its tests need. Elsewhere a test that needs a library skips
where it is missing (pytest.importorskip: the other environment), so a broken vLLM in .venv-serve would
turn the serve tests into skips and leave the run green; here, in the environment that must have it,
the same import fails the run.

The environment is the one `make test-quant-env` / `make test-serve-env` names (PIPELINE_TEST_ENV), or
the default venv this interpreter belongs to (.venv-quant, .venv-serve); any other interpreter is
neither and skips these tests.
"""

import importlib
import os
import sys
from pathlib import Path

import pytest

REQUIRED = {
    "serve": ("vllm", "math_verify", "matplotlib", "markdown_it", "gradio", "openai", "psutil", "scipy"),
    "quant": ("llmcompressor", "gptqmodel", "psutil"),
}


def environment() -> str | None:
    named = os.environ.get("PIPELINE_TEST_ENV")
    if named:
        if named not in REQUIRED:
            raise ValueError(f"PIPELINE_TEST_ENV={named}: use one of {', '.join(REQUIRED)}")
        return named
    return {".venv-serve": "serve", ".venv-quant": "quant"}.get(Path(sys.prefix).name)


@pytest.mark.parametrize("env, module", [(env, module) for env, modules in REQUIRED.items() for module in modules])
def test_the_environment_imports_the_libraries_its_tests_need(env, module):
    if environment() != env:
        pytest.skip(f"not the {env} environment")
    importlib.import_module(module)  # an ImportError here is the failure: nothing catches it
