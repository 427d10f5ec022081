"""What vLLM's benchmark client (`vllm bench serve`) costs in CPU per streamed token: the figure that sizes
how many client processes a capacity point needs (CapacitySearch.client_tokens_per_s), so that the load
generator is never what a point measures.

A stand-in OpenAI completions server (one process, asyncio) streams each request's tokens as vLLM does
(one SSE event a token, usage last) at a fixed inter-token gap; `vllm bench serve` loads it at a Poisson
rate; the client's CPU seconds (its process's rusage) over the tokens it received is the figure.

    .venv-serve/bin/python bench/client_cost.py --tokenizer artifacts/sources/smollm2-135m-instruct \
        --rate 8 --output-len 1024 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


async def _stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gap_s: float) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:  # a connection that only checked the port
        writer.close()
        return
    lines = head.split(b"\r\n")
    lengths = [int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length")]
    if not lengths:  # a GET (the client asks which models are served)
        models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(models), models))
        await writer.drain()
        writer.close()
        return
    body = json.loads(await reader.readexactly(lengths[0]))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    n = int(body.get("max_tokens") or 1)  # a probe without a length: one token
    event = {"id": "x", "object": "text_completion", "model": body["model"], "choices": [{"index": 0, "text": " a"}]}
    line = b"data: " + json.dumps(event).encode() + b"\n\n"
    for _ in range(n):
        writer.write(line)
        await writer.drain()
        await asyncio.sleep(gap_s)
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 64, "completion_tokens": n}}
    writer.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await writer.drain()
    writer.close()


def serve(port: int, gap_s: float) -> None:
    async def main():
        server = await asyncio.start_server(lambda r, w: _stream(r, w, gap_s), "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_client(port: int, tokenizer: str, n: int, rate: float, output_len: int) -> tuple[float, int, float]:
    """`vllm bench serve` against the stand-in: (its CPU seconds, the tokens it received, its duration)."""
    out = Path(tempfile.mkdtemp())
    client = [sys.executable, "-m", "pipeline.load.client", "--backend", "vllm"]
    client += ["--base-url", f"http://127.0.0.1:{port}", "--model", "m", "--tokenizer", tokenizer]
    client += ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", str(output_len)]
    client += ["--random-range-ratio", "0", "--num-prompts", str(n), "--request-rate", str(rate)]
    client += ["--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(out)]
    client += ["--result-filename", "r.json"]
    proc = subprocess.Popen(client, stdout=subprocess.DEVNULL, env=os.environ | {"OPENAI_API_KEY": "x"})
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"client_cost: vllm bench serve exited with status {status}")
    saved = json.loads((out / "r.json").read_text())
    return usage.ru_utime + usage.ru_stime, saved["total_output_tokens"], saved["duration"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", help="a folder with a tokenizer (the client's prompts)")
    p.add_argument("--rate", type=float, default=8.0, help="requests a second the client sends")
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--gap-ms", type=float, default=5.0, help="the stand-in server's inter-token gap")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of arrivals")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.gap_ms / 1000)  # the stand-in alone (tests/test_load_clients.py starts it so)
        return
    if not args.tokenizer:
        p.error("--tokenizer is needed: a folder with a tokenizer, e.g. artifacts/sources/smollm2-135m-instruct")
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--gap-ms", str(args.gap_ms)])
    try:
        time.sleep(1.5)
        # the client's start (imports, tokenizer, prompts): one request of one token, subtracted
        cpu0, tokens0, _ = run_client(port, args.tokenizer, 1, args.rate, 1)
        n = max(1, round(args.rate * args.seconds))
        cpu, tokens, duration = run_client(port, args.tokenizer, n, args.rate, args.output_len)
        per_token = (cpu - cpu0) / (tokens - tokens0)
        print(
            f"client_cost: {n} requests x {args.output_len} tokens at {args.rate:g} req/s: "
            f"{tokens / duration:,.0f} tokens/s streamed over {duration:.1f} s; client CPU {cpu:.1f} s "
            f"({cpu0:.1f} s of it start-up): {1e6 * per_token:.1f} us a token, one core at "
            f"{1 / per_token:,.0f} tokens/s"
        )
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
