"""python -m pipeline.bench (make bench)."""

from pipeline import exits

if __name__ == "__main__":  # vLLM's engine starts processes that re-import the main module
    from pipeline.bench.cli import main

    # what an interruption leaves is said variant by variant, as the loop reaches each (cli.py)
    exits.run("bench", main, "every bench.json written so far is whole", vllm_in_process=True)
