"""Quiet by default (pipeline/quiet.py): the libraries' known noise is dropped, their real warnings and
errors and the stages' own lines are kept, and VERBOSE=1 (no PIPELINE_QUIET) keeps everything.

Each case runs in a fresh interpreter, as a stage does: quiet() first, then the libraries' loggers and
tqdm as they are. The lines are the ones a CPU run prints."""

import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.settings import ROOT

LIBRARY_LINES = textwrap.dedent(
    """\
    import logging, sys, warnings
    from pipeline.quiet import quiet
    quiet(quantizer=True)
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger
    # noise
    log("torchao").warning("Failed to load /v/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load")
    log("torch.utils._pytree").warning(
        "<enum 'KernelPreference'> is an Enum subclass ... Calling register_constant() on Enum subclasses is deprecated"
    )
    cpu = log("vllm.v1.worker.cpu_worker")
    cpu.warning("%s is not found in LD_PRELOAD. For best performance, please follow ...", "libtcmalloc")
    cpu.warning("%s is not found in LD_PRELOAD. For best performance, please follow ...", "libiomp")
    for _ in range(5):
        cpu.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
    warnings.warn("Attempting to save a model with offloaded modules; shard_size (50GB default)")
    # kept
    cpu.warning("sleep mode is not supported on CPU, ignore it.")
    log("torchao").error("Failed to quantize: out of memory")
    log("vllm.engine").error("EngineCore failed to start")
    warnings.warn("calibration set has 3 samples; results may be poor")
    print("awq-w4a16: building (awq via llmcompressor, 128 calibration samples)", file=sys.stderr)
    from tqdm import tqdm
    for _ in tqdm(range(3), desc="Grid search for model.layers.0.mlp.up_proj"):
        pass
    """
)

NOISE = ["Failed to load", "register_constant()", "LD_PRELOAD", "torch.set_num_threads", "offloaded modules"]
KEPT = [
    "sleep mode is not supported on CPU",
    "Failed to quantize: out of memory",
    "EngineCore failed to start",
    "calibration set has 3 samples",
    "awq-w4a16: building",
]


def run(script: str, quiet: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PIPELINE_QUIET", "TQDM_DISABLE")}
    env |= {"PIPELINE_QUIET": "1"} if quiet else {}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_quiet_drops_the_known_noise_and_keeps_warnings_errors_and_stage_lines():
    out = run(LIBRARY_LINES, quiet=True)
    for noise in NOISE:
        assert noise not in out, out
    assert "Grid search" not in out  # quantizer=True: no progress bars
    for kept in KEPT:
        assert kept in out, out


def test_verbose_keeps_everything():
    out = run(LIBRARY_LINES, quiet=False)
    for line in NOISE + KEPT + ["Grid search"]:
        assert line in out, out
    assert out.count("torch.set_num_threads") == 5


def test_hidden_progress_bars_are_not_passed_on_to_child_processes():
    out = run(
        "import os, sys; from pipeline.quiet import quiet; quiet(quantizer=True); "
        "print('TQDM_DISABLE' in os.environ, file=sys.stderr)",
        quiet=True,
    )
    assert out.strip() == "False"  # vLLM's generate() with a bar divides by a disabled bar's elapsed time


def test_quiet_itself_prints_nothing():
    out = run("import sys; from pipeline.quiet import quiet; quiet(); print('stage line', file=sys.stderr)", quiet=True)
    assert out == "stage line\n"


def test_the_vllm_filter_survives_vllms_own_logging_set_up():
    """vLLM sets up its loggers (dictConfig) when an engine starts: the filter, set before, stays."""
    pytest.importorskip("vllm")
    out = run(
        "from pipeline.quiet import quiet; quiet()\n"
        "from vllm.config.logging import LoggingConfig\n"
        "from vllm.logger import configure_logging, init_logger\n"
        "configure_logging(LoggingConfig())  # what the engine does\n"
        "log = init_logger('vllm.v1.worker.cpu_worker')\n"
        "log.warning('libtcmalloc is not found in LD_PRELOAD. For best performance ...')\n"
        'log.warning_once("CPU backend doesn\'t allow to use `torch.set_num_threads` after the thread binding")\n'
        "log.warning('sleep mode is not supported on CPU, ignore it.')\n",
        quiet=True,
    )
    assert "LD_PRELOAD" not in out and "set_num_threads" not in out, out
    assert "sleep mode is not supported on CPU" in out and "WARNING" in out, out
