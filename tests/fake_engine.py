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
                lps = [None] + [{t: TokenLogprob(-0.1 * t, 1), t + 1: TokenLogprob(-3.0, 2)} for t in ids[1:]]
            out.append(
                Generated([Completion(text, list(range(n)), "length" if n == sp["max_tokens"] else "stop")], lps)
            )
        return out


def arithmetic_llm(**engine_args):
    return ArithmeticLLM()
