"""vLLM's OpenAI server, started so that it and its engine processes die with the stage that started it.

    python -m pipeline.vllm_server ARGS...     # = python -m vllm.entrypoints.openai.api_server ARGS...

The bench and verify-published start the server as a child process (its own process group, stopped on
the way out). A stage killed with SIGKILL cannot stop it, and vLLM's EngineCore does not watch its
parent: the server gets the parent-death signal from its Popen, and its engine processes, which
re-import this main module when they are spawned, get it here.
"""

import runpy

from pipeline.serving import engine_children_die_with_parent

engine_children_die_with_parent()

if __name__ == "__main__":
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
