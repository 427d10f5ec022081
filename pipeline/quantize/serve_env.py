"""The serve environment (.venv-serve: vLLM) seen from the quantizer's: its interpreter, checked before
any long work, a module run in it, and the smoke test of a finished checkpoint (pipeline/smoke.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from pipeline.schema import ConfigError
from pipeline.serving import cpu_kernel_gap, die_with_parent
from pipeline.settings import ROOT
from pipeline.settings import serve_python as settings_serve_python


def serve_python() -> str:
    """The serve environment's interpreter (make exports SERVE_PYTHON), checked before any long work: the
    smoke test needs it after the quantizer has run."""
    python = settings_serve_python()
    if not Path(python).exists():
        raise ConfigError(
            f"SERVE_PYTHON={python}: not found; run `make setup` (it creates .venv-serve with vLLM), "
            "or set SERVE_PYTHON to a python with vLLM"
        )
    return python


def check_servable(recipe, recipe_path: Path) -> None:
    """What the smoke test's vLLM cannot serve on this machine, refused in one line before the build
    (serving.cpu_kernel_gap: INT4 and an FP8 KV cache need AVX-512 on a CPU)."""
    if gap := cpu_kernel_gap(recipe.method, recipe.kv_cache_dtype):
        raise ConfigError(
            f"{recipe_path}: vLLM's CPU build serves {gap} only on x86 with AVX-512, and this CPU has none (its "
            "smoke test, eval and bench would fail); build it on a GPU machine, or leave it out of RECIPES"
        )


def run_in_serve_env(module: str, *args: str) -> subprocess.CompletedProcess:
    """python -m <module> in the serve environment (vLLM), which pins another compressed-tensors than the
    quantizers; a killed quantize takes it with it."""
    python = serve_python()
    env = dict(os.environ)
    if "SERVE_PYTHONPATH" in os.environ:  # where vLLM lives in a site dir, not a venv (the H200 kit)
        env["PYTHONPATH"] = os.environ["SERVE_PYTHONPATH"]
    return subprocess.run(
        [python, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, env=env, preexec_fn=die_with_parent
    )


def smoke_check(path: Path, kv_cache_dtype: str = "auto") -> dict:
    """Load the checkpoint in vLLM (serve environment) as it will be served, and generate; a failure is
    an error."""
    t0 = time.time()
    proc = run_in_serve_env("pipeline.smoke", str(path), "--kv-cache-dtype", kv_cache_dtype)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("SMOKE ")), None)
    result = json.loads(line[6:]) if line is not None else None
    if result and result.get("problem"):
        raise RuntimeError(
            f"vLLM loaded {path.name} but its output is degenerate: {result['problem']} "
            f"({result['text']!r}); the weights are broken"
        )
    if proc.returncode or result is None:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"vLLM could not load or run {path.name} (exit {proc.returncode}): {tail}")
    return {**result, "wall_s": round(time.time() - t0, 1)}
