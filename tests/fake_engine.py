"""A deterministic stand-in for a vLLM server behind pipeline.openai_client, for the tests of what the
eval stage makes of its completions (the records, the fidelity arrays)."""

from pipeline.openai_client import Completion, TokenLogprob


class ArithmeticClient:
    """A deterministic server: each completion is a function of the request alone (its tokens, seed and
    length limit), as a vLLM completion is with a per-request seed; prompt log-probabilities when asked."""

    def complete(self, requests):
        out = []
        for r in requests:
            ids, seed = r.prompt, r.seed or 0
            n = 1 + (sum(ids) + seed) % r.max_tokens
            text = f"the answer is {sum(ids) * (r.seed or 1)}"
            lps = None
            if r.prompt_logprobs:
                lps = [None] + [prompt_logprobs(t, r.prompt_logprobs) for t in ids[1:]]
            out.append(Completion(text, list(range(n)), "length" if n == r.max_tokens else "stop", lps))
        return out


def prompt_logprobs(token: int, k: int) -> dict:
    """One position's prompt log-probabilities in vLLM's order (vllm/v1/engine/logprobs.py,
    append_logprobs_for_next_position): the prompt's own token first with its rank, whatever that rank
    is, then the top k by rank, the prompt token not repeated. Here the prompt token ranks 1 + token % (k + 2)
    (inside the top k or beyond it) and rank r has log-probability -r."""
    rank = 1 + token % (k + 2)
    entry = {token: TokenLogprob(-float(rank), rank)}
    for r in range(1, k + 1):
        entry.setdefault(token if r == rank else top_token(token, r), TokenLogprob(-float(r), r))
    return entry


def top_token(token: int, rank: int) -> int:
    """The token at `rank` (other than the prompt token's rank) at a position whose prompt token is `token`."""
    return 1000 + 10 * token + rank
