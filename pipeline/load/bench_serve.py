"""One sustained point (pipeline/load/steady.py) through vLLM's own serving benchmark, what `vllm bench serve`
runs (pipeline/load/client.py), from as many client processes as the point's token stream needs: one
Python process parses a streamed token in tens of microseconds, so near 15,000 tokens a second one client
is what a point measures, not the server; the processes are a pool a search keeps between its points.
Each client's per-request results (--save-detailed: send times, TTFTs, inter-token gaps, errors) are read
back from the file it saves, merged on the clock they share, and summarised by the steady-state rule."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.figure_names import LATENCY_METRICS, PERCENTILES
from pipeline.load.client import ClientRun, client_run
from pipeline.load.steady import PointPlan, QueueRule, Request, clients_for, summarize, timed_out
from pipeline.schema import CapacityPoint, CapacitySearch, Workload


@dataclass(frozen=True)
class Target:
    """The server a point loads and where its client's files go."""

    base_url: str
    model: str  # the served model id
    tokenizer: str  # a folder with the model's tokenizer
    api_key: str | None
    result_dir: Path
    log: Path  # vLLM's benchmark client prints here
    max_clients: int | None = None  # client processes a point may use (unset: max_clients())
    pool: ClientPool | None = None  # the processes it keeps up between points (unset: each point its own)


def bench_serve_args(
    target: Target, workload: Workload, plan: PointPlan, part: ClientShare, dataset: Path | None
) -> list[str]:
    """`vllm bench serve`'s arguments for one client's part of a point; dataset: a from_eval workload's prompts."""
    args = ["--backend", "vllm", "--base-url", target.base_url, "--model", target.model]
    args += ["--tokenizer", target.tokenizer]
    if workload.from_eval is not None:
        # eval's prompts are chat-templated already; output_tokens per line (custom-output-len -1)
        args += ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1"]
        args += ["--skip-chat-template"]
    else:
        args += ["--dataset-name", "random", "--random-input-len", str(workload.input_len)]
        args += ["--random-output-len", str(workload.output_len), "--random-range-ratio", str(workload.range_ratio)]
    args += ["--num-prompts", str(part.num_prompts), "--seed", str(part.seed), "--ignore-eos", "--disable-tqdm"]
    rate = "inf" if part.rate is None else f"{part.rate:.6g}"
    args += ["--request-rate", rate, "--burstiness", str(workload.burstiness)]
    args += ["--percentile-metrics", ",".join(LATENCY_METRICS), "--metric-percentiles", ",".join(map(str, PERCENTILES))]
    args += ["--save-result", "--save-detailed", "--result-dir", str(target.result_dir), "--result-filename", part.name]
    return args


def requests_of(saved: dict, client: int = 0) -> list[Request]:
    """The requests of a saved detailed result, in the order they were sent, sent_s on the clock every
    client process shares (time.perf_counter: CLOCK_MONOTONIC). vLLM 0.26 saves no latencies: there a
    request's is its TTFT plus its inter-token gaps (the time of its last token)."""
    ttfts, itls = saved["ttfts"], saved["itls"]
    latencies = saved.get("latencies") or [(t or 0.0) + sum(gaps or []) for t, gaps in zip(ttfts, itls, strict=True)]
    return [
        Request(
            sent_s=start,
            ok=not error,
            ttft_s=ttft or 0.0,
            latency_s=latency or 0.0,
            output_tokens=tokens or 0,
            itl_s=list(itl or []),
            client=client,
        )
        for start, error, ttft, latency, tokens, itl in zip(
            saved["start_times"], saved["errors"], ttfts, latencies, saved["output_lens"], itls, strict=True
        )
    ]


def from_first(requests: list[Request]) -> list[Request]:
    """The requests of every client in the order they were sent, sent_s since the first."""
    first = min((r.sent_s for r in requests), default=0.0)
    return sorted((dataclasses.replace(r, sent_s=r.sent_s - first) for r in requests), key=lambda r: r.sent_s)


@dataclass(frozen=True)
class ClientShare:
    """What one client process of a point sends: its part of the rate and of the prompts, its own seed
    (its arrivals independent of the others'), the file its results go to."""

    index: int
    rate: float | None
    num_prompts: int
    seed: int
    name: str


# seconds more arrivals each of several clients sends: they start within a second or two of each other,
# and the window they all send in (steady.sending_together) keeps the plan's length
CLIENT_SLACK_S = 5.0


def shares(plan: PointPlan, clients: int, name: str) -> list[ClientShare]:
    rate = None if plan.rate is None else plan.rate / clients
    slack = 0.0 if rate is None or clients == 1 else CLIENT_SLACK_S * plan.rate
    n = math.ceil((plan.num_prompts + slack) / clients)
    stem = name.removesuffix(".json")
    return [ClientShare(i, rate, n, plan.seed + 1000 * i, f"{stem}-c{i}.json") for i in range(clients)]


def max_clients() -> int:
    """At most half the cores: the server's API process and engine need theirs."""
    return max(1, (os.cpu_count() or 2) // 2)


def run_point(
    target: Target,
    workload: Workload,
    plan: PointPlan,
    search: CapacitySearch,
    dataset: Path | None = None,
    output_tokens: float | None = None,
) -> CapacityPoint:
    """One point through vLLM's serving benchmark, from as many client processes as its load needs
    (steady.clients_for; one runs in this process), stopped after plan.timeout_s, as a CapacityPoint.
    output_tokens: the workload's mean (unset: its output_len)."""
    tokens = output_tokens or workload.output_len or 1
    wanted = clients_for(plan, tokens, workload.e2e_bound_ms(tokens), search.client_tokens_per_s)
    clients = min(wanted, target.max_clients or max_clients())
    target.result_dir.mkdir(parents=True, exist_ok=True)
    name = f"{workload.name}-{plan.kind}-{plan.seed}.json"
    parts = shares(plan, clients, name)
    for part in parts:
        (target.result_dir / part.name).unlink(missing_ok=True)
    argv = [bench_serve_args(target, workload, plan, part, dataset) for part in parts]
    t0 = time.time()
    with _environ("OPENAI_API_KEY", target.api_key), contextlib.ExitStack() as own:
        # vLLM's client reads the server's API key there
        pool = target.pool or own.enter_context(ClientPool(target.log, target.result_dir))
        run = run_clients(argv, target, plan.timeout_s, pool)
    cpu = run.cpu
    wall = time.time() - t0
    saved = [target.result_dir / part.name for part in parts]
    if cpu is None or not all(f.is_file() for f in saved):
        point = timed_out(plan, workload, wall)
    else:
        requests = [r for i, f in enumerate(saved) for r in requests_of(json.loads(f.read_text()), i)]
        point = summarize(plan, from_first(requests), workload, QueueRule.of(search), wall)
    for f in saved:
        f.unlink(missing_ok=True)  # every request's text: megabytes a point; the summary is what is kept
    busiest = max(cpu) if cpu else None
    return point.model_copy(update={"clients": clients, "client_cpu": busiest, "start_s": run.start_s})


# a client process's start (importing vLLM): seconds on an idle core, minutes beside other work; its own
# bound, so that a slow start never eats the point's timeout (the clients would be told to send too late)
CLIENT_START_S = 300.0


class ClientPool:
    """The client processes (pipeline/load/client.py) of a run of points, e.g. one workload's search on one
    server: started when a point first needs them, each importing vLLM once (15-25 s a process on the H200's
    machine: a fifth of a reasoning point where every point started its own), kept for the next points,
    stopped when the pool closes, and killed where a point ran out of time (they were mid-run)."""

    def __init__(self, log: Path, folder: Path):
        self.log, self.folder = log, folder
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # a Ctrl-C, a stop or an error mid-point: its jobs' results are wanted no more
            self.kill()
        else:
            self.close()

    def _ready(self, index: int) -> Path:
        return self.folder / f".client-{index}.ready"

    def ensure(self, n: int) -> float:
        """At least n processes, each with vLLM imported; the seconds that took (0 where they were up)."""
        t0 = time.time()
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:
            while len(self.procs) < n:
                ready = self._ready(len(self.procs) + 1)
                ready.unlink(missing_ok=True)
                command = [sys.executable, "-m", "pipeline.load.client", "--ready-file", str(ready)]
                out = {"stdout": log, "stderr": subprocess.STDOUT}
                self.procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, **out))
        while not all(self._ready(i).exists() for i in range(1, n + 1)):
            if time.time() > t0 + CLIENT_START_S:
                raise RuntimeError(
                    f"load clients not started after {CLIENT_START_S:.0f} s (CLIENT_START_S: importing vLLM): "
                    f"their output is in {self.log}"
                )
            self.check_alive()
            time.sleep(0.05)
        return time.time() - t0

    def send(self, jobs: list[dict]) -> None:
        """One job a process, the first len(jobs) of them: the line is their signal to send."""
        for proc, job in zip(self.procs, jobs, strict=False):
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()

    def check_alive(self) -> None:
        """A client process that ended while the pool is open failed: the load generator's error, not a
        point that broke."""
        for i, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                raise RuntimeError(f"load client {i} exited with status {proc.returncode}: its output is in {self.log}")

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._forget()

    def close(self) -> None:
        """stdin closed: each process ends after its job; one that does not within 10 s is killed."""
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget()

    def _forget(self) -> None:
        for i in range(1, len(self.procs) + 1):
            self._ready(i).unlink(missing_ok=True)
        self.procs = []


@dataclass(frozen=True)
class ClientsRun:
    """What a point's client processes did: each one's CPU share (None: the point's time ran out), and the
    seconds their start took before the point began (0 where the pool had them up)."""

    cpu: list[float] | None
    start_s: float


def run_clients(argv: list[list[str]], target: Target, timeout_s: float, pool: ClientPool) -> ClientsRun:
    """Each client's benchmark run: the first in this process, the others by the pool's processes, each
    told to send once all of them are up (their start bounded by CLIENT_START_S, a one-line error past it).
    All are stopped timeout_s after they were told to send."""
    start_s = round(pool.ensure(len(argv) - 1), 1)
    cpu_files = [target.result_dir / f".client-{i}.cpu.json" for i in range(1, len(argv))]
    for f in cpu_files:
        f.unlink(missing_ok=True)
    # vLLM's logger writes to sys.stdout as it was when vLLM was imported: the real one, not this
    # point's log, which is closed after the point
    import vllm.benchmarks.serve  # noqa: F401

    deadline = time.time() + timeout_s
    pool.send([{"argv": args, "cpu_file": str(f)} for args, f in zip(argv[1:], cpu_files, strict=True)])
    try:
        with target.log.open("a") as log, contextlib.redirect_stdout(log):
            first = asyncio.run(asyncio.wait_for(client_run(argv[0]), deadline - time.time()))
        while not all(f.exists() for f in cpu_files):
            if time.time() > deadline:
                raise TimeoutError
            pool.check_alive()
            time.sleep(0.05)
    except TimeoutError:
        pool.kill()  # mid-run: the next point starts new ones
        return ClientsRun(None, start_s)
    others = [ClientRun.model_validate_json(f.read_text()) for f in cpu_files]
    for f in cpu_files:
        f.unlink()
    return ClientsRun([run.cpu_share for run in (first, *others)], start_s)


@contextlib.contextmanager
def _environ(key: str, value: str | None):
    old = os.environ.get(key)
    if value is not None:
        os.environ[key] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
