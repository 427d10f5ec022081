"""No request is sent on a connection its server may be closing. vLLM's server (uvicorn) closes a kept-alive
connection after 5 s idle while aiohttp pools it for 15 (vLLM's benchmark client: 60), and a request sent on
it as it closes is lost ("ServerDisconnectedError: Server disconnected": make measure's eval, in a clean
clone's make test, 2026-12-07). The stages' client opens a connection a request, against a real HTTP/1.1
server on 127.0.0.1 that answers the first request of a connection, keeps it open, and closes it on the next
one without answering, as uvicorn's keep-alive timer does when it fires as a request arrives; the servers the
stages start keep idle connections longer than any of their clients pools them."""

import json
import re
from http.server import BaseHTTPRequestHandler
from importlib.util import find_spec
from pathlib import Path

import pytest

from pipeline.openai_client import CompletionsClient, Pace, Request
from pipeline.serving import KEEP_ALIVE_S, Server

from local_http import local_http_server

pytest.importorskip("aiohttp")


@pytest.fixture()
def one_request_a_connection_server():
    connections = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the connection stays open after a reply

        def setup(self):
            super().setup()
            self.answered = 0
            connections.append(self)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.answered:  # its keep-alive timer fired: closed, the request unanswered
                self.close_connection = True
                return
            self.answered += 1
            choice = {"text": "4", "token_ids": [19], "finish_reason": "stop"}
            body = json.dumps({"choices": [choice]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with local_http_server(Handler) as url:
        yield url, connections


def test_each_request_goes_on_a_connection_of_its_own(one_request_a_connection_server):
    url, connections = one_request_a_connection_server
    client = CompletionsClient(url, "key", "m", concurrency=2, pace=Pace(5.0, 20.0, 40.0))
    completions = client.complete([Request([1, 2, 3], max_tokens=1)] * 5)
    assert [c.text for c in completions] == ["4"] * 5
    assert len(connections) == 5


def test_a_server_the_stages_start_keeps_idle_connections_longer_than_its_clients_pool_them(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    server = Server(["true"], 1, tmp_path / "server.log", 10)
    assert int(server.env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) == KEEP_ALIVE_S
    monkeypatch.setenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "120")  # the user's, where set
    assert Server(["true"], 1, tmp_path / "server.log", 10).env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "120"
    # the pools of the clients that load these servers: aiohttp's default, and vLLM's benchmark client's as the
    # installed vLLM sets it (a vLLM that pools longer must be matched here)
    vllm = find_spec("vllm")  # found, not imported
    client = Path(vllm.submodule_search_locations[0]) / "benchmarks/serve.py" if vllm else None
    pools = [15] + [int(v) for v in re.findall(r"keepalive_timeout=(\d+)", client.read_text())] if client else [15]
    assert KEEP_ALIVE_S > max(pools), pools
