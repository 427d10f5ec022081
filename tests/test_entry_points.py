"""pyproject.toml's console scripts name functions that exist: a stage that became a package moves its
main(), and a stale entry point fails only when someone installs the package and runs it."""

import importlib
import tomllib

import pytest

from pipeline.settings import ROOT

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_names_a_callable(name):
    module, _, attr = SCRIPTS[name].partition(":")
    try:
        target = getattr(importlib.import_module(module), attr)
    except ImportError as e:  # a stage whose libraries this environment lacks (each env runs the tests)
        pytest.skip(f"{module}: {e}")
    assert callable(target), SCRIPTS[name]
