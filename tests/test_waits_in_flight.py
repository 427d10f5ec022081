"""A request's bound counts every request in flight with it (mutation audit of issue 42: the bound of a
request alone, openai_client's `bound_s(r, 1)`, passed every test, as tests/test_waits.py's two requests get
the same rate as one). Against tests/test_waits.py's silent server on 127.0.0.1."""

import pytest
from test_waits import SLACK_S, outcome_within, silent_server  # noqa: F401 - the fixture

from pipeline.openai_client import CompletionsClient, Pace, Request, ServerError

PACE = Pace(first_token_s=1.0, request_tok_s=20.0, server_tok_s=40.0)


def test_four_requests_in_flight_each_wait_at_a_quarter_of_the_server_s_rate(silent_server):  # noqa: F811
    requests = [Request([1, 2, 3], max_tokens=17)] * 4  # 4 in flight: 10 tok/s each, 1 + 20 / 10 = 3 s
    assert PACE.bound_s(requests[0], 4) == pytest.approx(3.0) != PACE.bound_s(requests[0], 1)
    client = CompletionsClient(silent_server, "key", "m", concurrency=4, pace=PACE)
    error, wall = outcome_within(3.0 + SLACK_S + 5, lambda: client.complete(requests))
    assert isinstance(error, ServerError) and 3.0 <= wall <= 3.0 + SLACK_S, (error, wall)
    assert "no answer to a request in 3 s, its bound (1 s to a first token + 3 prompt and 17 new tokens at 10 " in (
        str(error)
    )
