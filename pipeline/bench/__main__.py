"""python -m pipeline.bench (make bench)."""

from pipeline.bench.cli import main
from pipeline.serving import exit_without_teardown

if __name__ == "__main__":  # vLLM's engine starts processes that re-import the main module
    exit_without_teardown(main())  # every server is stopped by now
