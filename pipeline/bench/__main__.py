"""`python -m pipeline.bench` (make bench) and the console script pipeline-bench; the command line is cli.py."""

from typing import NoReturn

from pipeline import exits


def entry() -> NoReturn:
    from pipeline.bench.cli import main

    # what an interruption leaves is said variant by variant, as the loop reaches each (cli.py)
    exits.run("bench", main, "every bench.json written so far is whole", vllm_in_process=True)


if __name__ == "__main__":  # vLLM's engine starts processes that re-import the main module
    entry()
