"""An OpenAI-compatible completions server with a known latency curve, for the capacity search's tests:
it stands in for vLLM's engine (whose curve is not known in advance), not for the benchmark client, which
is vLLM's own. Run as `python tests/knee_server.py --port N --slots M --knee K ...` on 127.0.0.1.

Every request holds one of `slots` for its whole life (an engine's max-num-seqs; later ones queue). Its
first token comes ttft_ms after it gets a slot, plus penalty_ms when `knee` or more requests were in the
server (queued or running) as it arrived; then one token every tpot_ms. At a Poisson rate L well below
the slots' ceiling the number a request finds in the server is Poisson with mean L x D, D its time in the
server, so p90 TTFT crosses a target between ttft_ms and ttft_ms + penalty_ms where
P(Poisson(L x D) >= knee) = 0.1: the knee the search must find (tests/test_capacity.py computes it).
POST /curve {"knee": K} moves the knee while the server runs: a curve that shifts between runs.
"""

import argparse
import asyncio
import json
import time

from aiohttp import web


def build_app(slots: int, knee: int, ttft_ms: float, tpot_ms: float, penalty_ms: float) -> web.Application:
    semaphore = asyncio.Semaphore(slots)
    state = {"in_server": 0, "knee": knee}

    async def health(request):
        return web.Response(text="ok")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "knee", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        tokens = int(body.get("max_tokens") or 16)
        crowded = state["in_server"] >= state["knee"]
        state["in_server"] += 1
        try:
            async with semaphore:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await asyncio.sleep((ttft_ms + (penalty_ms if crowded else 0)) / 1000)
                for i in range(tokens):
                    if i:
                        await asyncio.sleep(tpot_ms / 1000)
                    chunk = {"id": "c", "object": "text_completion", "created": int(time.time()), "model": "knee"}
                    chunk["choices"] = [{"index": 0, "text": " a", "finish_reason": None}]
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                usage = {"prompt_tokens": len(str(body.get("prompt", "")).split()), "completion_tokens": tokens}
                await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                await response.write(b"data: [DONE]\n\n")
                return response
        finally:
            state["in_server"] -= 1

    async def curve(request):
        state["knee"] = int((await request.json())["knee"])
        return web.json_response({"knee": state["knee"]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/curve", curve)
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--knee", type=int, default=4)
    p.add_argument("--ttft-ms", type=float, default=20)
    p.add_argument("--tpot-ms", type=float, default=20)
    p.add_argument("--penalty-ms", type=float, default=200)
    a = p.parse_args()
    app = build_app(a.slots, a.knee, a.ttft_ms, a.tpot_ms, a.penalty_ms)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
