"""The smoke test's verdict on vLLM's output (pipeline/quantize/smoke.py): output that shows broken weights fails."""

import pytest

from pipeline.quantize.smoke import output_problem


@pytest.mark.parametrize(
    "text, tokens, logprobs, problem",
    [
        (" Paris.", 3, [-0.5, -1.0, -0.1], None),
        ("", 8, [-0.1] * 8, "8 tokens that decode to no visible text"),
        ("  \n", 2, [-0.1, -0.2], "2 tokens that decode to no visible text"),
        (" x", 2, [float("nan"), -0.1], "non-finite log-probabilities"),
        ("", 0, [], "generated no tokens"),
    ],
)
def test_smoke_output_that_shows_broken_weights_fails(text, tokens, logprobs, problem):
    found = output_problem(text, tokens, logprobs)
    assert found == problem if problem is None else found.startswith(problem)
