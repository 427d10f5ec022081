"""A point's load from several client processes (pipeline/load/bench_serve.py, pipeline/load/client.py): one
Python client streams a few tens of thousands of tokens a second at most, so a point splits its Poisson
arrivals over processes (rate/k each: together Poisson at the rate) and measures over the time all of them
were sending. The rule's arithmetic runs here on hand-made requests; the processes run against
bench/client_cost.py's stand-in streaming server (no model: the client is what is under test)."""

import dataclasses
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.load.steady import (
    PointPlan,
    QueueRule,
    Request,
    clients_for,
    sending_together,
    summarize,
    sustained_plan,
)
from pipeline.schema import CapacitySearch, Workload

ROOT = Path(__file__).resolve().parent.parent
CHAT = Workload(name="chat", input_len=16, output_len=32, slo={"p90_ttft_ms": 2000, "p90_tpot_ms": 100})


def search(**fields) -> CapacitySearch:
    base = {"workloads": [CHAT], "grid": [{"name": "a"}], "warmup_requests": 2, "saturation_requests": 4}
    base |= {"ramp_e2e": 0.5, "window_e2e": 1, "window_min_s": 6, "min_requests": 4, "max_points": 2}
    return CapacitySearch.model_validate(base | {"budget_s": 100} | fields)


def test_a_point_needs_a_client_for_each_share_of_its_token_stream():
    plan = sustained_plan("search", 15.0, search(), CHAT.e2e_bound_ms(32), seed=1)
    assert clients_for(plan, 1024, 22_460, 5000) == math.ceil(15 * 1024 / 5000) == 4
    assert clients_for(plan, 32, 5100, 5000) == 1
    # a burst streams its tokens within about E at most
    burst = PointPlan("saturation", None, 1024, 0.0, 0.0, 285.0, 2)
    assert clients_for(burst, 1024, 22_460, 5000) == math.ceil(1024 / 22.46 * 1024 / 5000)


def test_the_window_is_when_every_client_was_sending():
    # client 1 starts 2 s after client 0 and stops 1 s before it: each at 5 req/s, together 10
    def sent(at: float, client: int) -> Request:
        return Request(sent_s=at, ok=True, ttft_s=0.1, latency_s=0.5, output_tokens=32, client=client)

    reqs = [sent(t / 5, 0) for t in range(60)] + [sent(2 + t / 5, 1) for t in range(45)]
    assert sending_together(reqs) == (2.0, 10.8)
    plan = PointPlan("search", 10.0, 105, 1.0, 7.8, 60.0, 1)
    point = summarize(plan, sorted(reqs, key=lambda r: r.sent_s), CHAT, QueueRule(0.1, 4.0), 12.0)
    # the ramp counts from the last client's first request; the window ends at the first one's last
    assert point.window_s == pytest.approx(10.8 - 3.0)
    assert point.sent_rps == pytest.approx(10, rel=0.05) and point.held


@pytest.fixture
def stand_in():
    pytest.importorskip("vllm.benchmarks.serve")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "client_cost.py"), "--serve", str(port)])
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def test_two_client_processes_send_the_point_s_rate_together(stand_in, embedded_source, tmp_path):
    from pipeline.load.bench_serve import Target, run_point

    target = Target(stand_in, "m", str(embedded_source), None, tmp_path / "r", tmp_path / "client.log", max_clients=2)
    settings = search(client_tokens_per_s=100)  # 32 tokens at 6 req/s: two clients
    plan = sustained_plan("search", 6.0, settings, CHAT.e2e_bound_ms(32), seed=4)
    point = run_point(target, CHAT, plan, settings)
    assert point.clients == 2 and point.held, point.slo_broken
    # both clients' requests are in the figures: the window's arrivals come at the offered rate, not half
    assert point.sent_rps == pytest.approx(6.0, rel=0.4)
    assert point.window_requests >= 0.6 * 6.0 * plan.window_s
    assert 0 < point.client_cpu < 1.5
    assert not list((tmp_path / "r").glob("*.json"))  # per-request files removed once summarised


def test_a_client_that_starts_slower_than_the_point_s_timeout_still_sends_with_the_others(
    stand_in, embedded_source, tmp_path, monkeypatch
):
    # importing vLLM takes seconds on an idle core and minutes beside other work: the point's timeout counts
    # from when its clients are told to send, not from before the second one had started
    from pipeline.load.bench_serve import Target, run_point

    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(32)\n")  # past the 30 s of slack below
    monkeypatch.setenv("PYTHONPATH", f"{slow}:{ROOT}")
    target = Target(stand_in, "m", str(embedded_source), None, tmp_path / "r", tmp_path / "client.log", max_clients=2)
    settings = search(client_tokens_per_s=100)
    plan = sustained_plan("search", 6.0, settings, CHAT.e2e_bound_ms(32), seed=5)
    point = run_point(target, CHAT, plan, settings)
    assert point.clients == 2 and point.held, point.slo_broken
    # its own timeout: the arrivals and 30 s to drain, less than the second client's start took
    assert point.start_s >= 32 > plan.timeout_s - plan.ramp_s - plan.window_s
    assert point.sent_rps == pytest.approx(6.0, rel=0.4)


def test_a_pool_starts_its_clients_once_for_all_of_a_search_s_points(stand_in, embedded_source, tmp_path):
    # importing vLLM is 15-25 s a client process on the H200's machine: a search's points share them, and a
    # point that runs out of time kills them (they are mid-run) so the next one starts its own
    from pipeline.load.bench_serve import ClientPool, Target, run_point

    log, results = tmp_path / "client.log", tmp_path / "r"
    settings = search(client_tokens_per_s=100)  # 32 tokens at 6 req/s: two clients, one of them the pool's

    def plumbing_point(seed: int):
        """A point whose time never runs out on a busy machine (its rule's own timeout did once, beside
        make test's other suites): what is under test is which clients run it, not how fast they are."""
        plan = sustained_plan("search", 6.0, settings, CHAT.e2e_bound_ms(32), seed=seed)
        point = run_point(target, CHAT, dataclasses.replace(plan, timeout_s=600.0), settings)
        assert not point.timed_out and point.failed == 0 and point.completed > 0, point
        return point

    with ClientPool(log, results) as pool:
        target = Target(stand_in, "m", str(embedded_source), None, results, log, max_clients=2, pool=pool)
        first = plumbing_point(6)
        started = list(pool.procs)
        second = plumbing_point(7)
        assert len(started) == 1 and pool.procs == started
        assert first.start_s > 0 and second.start_s == 0
        cut_short = run_point(target, CHAT, PointPlan("search", 6.0, 60, 1.0, 9.0, 1.0, 8), settings)
        assert cut_short.timed_out and not pool.procs and started[0].poll() is not None
        after = plumbing_point(9)
        assert after.start_s > 0 and len(pool.procs) == 1 and pool.procs[0] is not started[0]
        last = pool.procs[0]
    assert last.poll() is not None and not pool.procs  # closed with the pool
    assert not list(results.glob(".client-*"))
