"""A deterministic stand-in for vLLM's offline engine, in a module of its own: the data-parallel test
spawns replica processes that import it, and this keeps their imports light (no test module, no numpy)."""


class ArithmeticLLM:
    """A deterministic engine: each output is a function of the request alone (its tokens, seed and
    length limit), as a vLLM output is with a per-request seed; prompt log-probabilities when asked."""

    def generate(self, requests, params, use_tqdm=False):
        from pipeline.serving import Completion, Generated, TokenLogprob

        params = params if isinstance(params, list) else [params] * len(requests)
        out = []
        for request, sp in zip(requests, params):
            ids = request["prompt_token_ids"]
            n = 1 + (sum(ids) + sp.get("seed", 0)) % sp["max_tokens"]
            text = f"the answer is {sum(ids) * (sp.get('seed') or 1)}"
            lps = None
            if sp.get("prompt_logprobs"):
                lps = [None] + [prompt_logprobs(t, sp["prompt_logprobs"], TokenLogprob) for t in ids[1:]]
            out.append(
                Generated([Completion(text, list(range(n)), "length" if n == sp["max_tokens"] else "stop")], lps)
            )
        return out


def prompt_logprobs(token: int, k: int, logprob) -> dict:
    """One position's prompt log-probabilities in vLLM's order (vllm/v1/engine/logprobs.py,
    append_logprobs_for_next_position): the prompt's own token first with its rank, whatever that rank
    is, then the top k by rank, the prompt token not repeated. Here the prompt token ranks 1 + token % (k + 2)
    (inside the top k or beyond it) and rank r has log-probability -r."""
    rank = 1 + token % (k + 2)
    entry = {token: logprob(-float(rank), rank)}
    for r in range(1, k + 1):
        entry.setdefault(token if r == rank else top_token(token, r), logprob(-float(r), r))
    return entry


def top_token(token: int, rank: int) -> int:
    """The token at `rank` (other than the prompt token's rank) at a position whose prompt token is `token`."""
    return 1000 + 10 * token + rank


def arithmetic_llm(**engine_args):
    return ArithmeticLLM()
