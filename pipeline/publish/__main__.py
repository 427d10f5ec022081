"""python -m pipeline.publish (pipeline/publish/cli.py)."""

import sys

from pipeline import exits
from pipeline.serving import engine_children_die_with_parent

# processes started from this one die with it: the server of `verify` runs through serving.Server, whose
# own process is set to die with this one
engine_children_die_with_parent()

if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import the main module
    from pipeline.publish.cli import main

    # make's names; verify's load test runs vLLM's benchmark client in this process. What is intact is said
    # command by command (cli.py).
    stage = "verify-published" if sys.argv[1:2] == ["verify"] else "publish"
    exits.run(stage, main, "nothing is half-written", vllm_in_process=True)
