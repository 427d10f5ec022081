"""The stages' vLLM server (pipeline.vllm_server) serves as `vllm serve` does, so that a setting a published
serve.yaml passes to `vllm serve` acts on the servers bench measured it on: here --api-server-count, which
vLLM's api_server module, run as a script, takes and ignores (one API server whatever it says)."""

import re
from importlib.util import find_spec

import pytest

from pipeline.serving import Server, free_port, vllm_server_command


@pytest.mark.e2e  # starts vLLM: a minute
@pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (.venv-serve)")
def test_the_stages_server_runs_as_many_api_servers_as_api_server_count_says(tmp_path, tiny_model):
    port = free_port()
    command = vllm_server_command(
        tiny_model, port, max_model_len=256, max_num_seqs=4, enforce_eager=True, extra={"api_server_count": 2}
    )
    log = tmp_path / "server.log"
    with Server(command, port, log, 240, {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO"}) as server:
        server.wait_healthy()
        # vLLM names each API server process in its log lines: ApiServer_0, ApiServer_1, ...
        api_servers = set(re.findall(r"^\(ApiServer_(\d+) pid=", log.read_text(), re.MULTILINE))
    assert api_servers == {"0", "1"}, f"API servers in {log}: {sorted(api_servers) or 'one, unnamed'}"
