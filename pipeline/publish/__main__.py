"""python -m pipeline.publish (pipeline/publish/cli.py)."""

import sys

from pipeline.serving import engine_children_die_with_parent

# processes started from this one die with it: the server of `verify` runs through serving.Server, whose
# own process is set to die with this one
engine_children_die_with_parent()

if __name__ == "__main__":  # vLLM's CPU engine starts worker processes that re-import the main module
    from pipeline.publish.cli import main

    sys.exit(main())
