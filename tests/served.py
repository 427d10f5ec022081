"""One real vLLM server of a model, started as bench starts one, for tests that need a served model and do
not measure its speed (tests/conftest.py's tiny_server shares one for the session)."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pipeline.bench import server_command
from pipeline.schema import load_profile
from pipeline.serving import Server, free_port
from pipeline.settings import ROOT, VLLM_CPU_KVCACHE_SPACE

# A user's keys, in the environment the server starts from: a server a stage starts must answer its own
# clients only, whatever the user exported.
USER_KEYS = {"VLLM_API_KEY": "the-users-key", "OPENAI_API_KEY": "the-users-openai-key"}


@contextlib.contextmanager
def serve_as_bench_does(model: Path, log: Path) -> Iterator[Server]:
    """bench/cpu-test.yaml's server command (eager, short context, few sequences) with a 1 GiB KV cache
    and USER_KEYS in its environment; healthy when yielded, stopped with every process under it after."""
    profile = load_profile(ROOT / "bench/cpu-test.yaml")
    port = free_port()
    env = {"VLLM_CPU_KVCACHE_SPACE": VLLM_CPU_KVCACHE_SPACE, **USER_KEYS}
    with Server(server_command(model, profile, port), port, log, 600, env) as server:
        server.wait_healthy()
        yield server
