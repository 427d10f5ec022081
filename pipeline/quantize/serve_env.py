"""The serve environment (.venv-serve: vLLM) seen from the quantizer's: its interpreter, checked before
any long work, a module run in it, and the smoke test of a finished checkpoint (pipeline/quantize/smoke.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from pipeline.openai_client import CPU_PACE, GPU_PACE, Request
from pipeline.process_failure import failure_cause
from pipeline.schema import ConfigError
from pipeline.serving import (
    DENSE_MEANS,
    Wait,
    cpu_kernel_gap,
    dense_weights_name,
    die_with_parent,
    on_gpu,
    process_tree,
    served_dense,
    start_wait,
    stop_processes,
)
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
    (serving.cpu_kernel_gap: an FP8 KV cache needs AVX-512 on a CPU); INT4 served dequantized here, one
    line that says so (INT4 without an INT4 kernel, INT8 on any CPU)."""
    if recipe.rotation == "quip" and recipe.rotation_type == "hadamard" and not on_gpu():
        raise ConfigError(
            f"{recipe_path}: rotation_type: hadamard is served by vLLM's hadacore kernel, CUDA only, and this "
            "machine has no GPU (its smoke test, eval and bench would fail); use random-hadamard, or build on a GPU"
        )
    if gap := cpu_kernel_gap(recipe.kv_cache_dtype):
        raise ConfigError(
            f"{recipe_path}: vLLM's CPU build serves {gap} only on x86 with AVX-512, and this CPU has none (its "
            "smoke test, eval and bench would fail); build it on a GPU machine, or leave it out of RECIPES"
        )
    if served_dense(keys := recipe.model_dump()):
        name = dense_weights_name(keys)
        print(f"{recipe_path}: {name} on this CPU is {DENSE_MEANS} (make bench leaves it out)", flush=True)


def run_in_serve_env(module: str, *args: str, wait: Wait) -> subprocess.CompletedProcess:
    """python -m <module> in the serve environment (vLLM), which pins another compressed-tensors than the
    quantizers; a killed quantize takes it with it. Stopped with every process under it after `wait`, a
    one-line RuntimeError: an engine that hangs would otherwise hold make quantize for good."""
    python = serve_python()
    env = dict(os.environ)
    if "SERVE_PYTHONPATH" in os.environ:  # where vLLM lives in a site dir, not a venv (the H200 kit)
        env["PYTHONPATH"] = os.environ["SERVE_PYTHONPATH"]
    cmd = [python, "-m", module, *args]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=die_with_parent
    )
    try:
        stdout, stderr = proc.communicate(timeout=wait.seconds)
    except subprocess.TimeoutExpired:
        stop_processes(process_tree(proc.pid), timeout_s=10)  # vLLM's engine processes too
        proc.communicate()
        raise RuntimeError(
            f"python -m {module} (vLLM, the serve environment): no result in {wait.seconds:.0f} s, its bound "
            f"({wait.why}); stopped"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def vllm_run_wait(model: Path, prompt_lengths: list[int], max_tokens: int) -> Wait:
    """How long an offline vLLM run on `model` may take: its engine's start (serving.start_wait), then its
    prompts and max_tokens each, all in one batch at this machine's pace."""
    pace, n = GPU_PACE if on_gpu() else CPU_PACE, len(prompt_lengths)
    start = start_wait(model)
    longest = Request([0] * max(prompt_lengths, default=0), max_tokens)
    why = f"{start.why}, then {n} prompts: {pace.why(longest, n)}"
    return Wait(start.seconds + pace.bound_s(longest, n), why)


# pipeline/quantize/smoke.py's prompt (a few tokens in any tokenizer) and its default --max-tokens
SMOKE_PROMPT_TOKENS, SMOKE_MAX_TOKENS = 64, 8


def smoke_check(path: Path, kv_cache_dtype: str = "auto") -> dict:
    """Load the checkpoint in vLLM (serve environment) as it will be served, and generate; a failure is
    an error."""
    t0 = time.time()
    wait = vllm_run_wait(path, [SMOKE_PROMPT_TOKENS], SMOKE_MAX_TOKENS)
    proc = run_in_serve_env("pipeline.quantize.smoke", str(path), "--kv-cache-dtype", kv_cache_dtype, wait=wait)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("SMOKE ")), None)
    result = json.loads(line[6:]) if line is not None else None
    if result and result.get("problem"):
        raise RuntimeError(
            f"vLLM loaded {path.name} but its output is degenerate: {result['problem']} "
            f"({result['text']!r}); the weights are broken"
        )
    if proc.returncode or result is None:
        cause = failure_cause(proc.stderr or proc.stdout)
        raise RuntimeError(f"vLLM could not load or run {path.name} (exit {proc.returncode}): {cause}")
    return {**result, "wall_s": round(time.time() - t0, 1)}
