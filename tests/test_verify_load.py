"""verify-published's load test (pipeline/publish/load_test.py): the published config served at the
capacity its folder states, with the recorded workload, as make bench measured it: a warm-up, then one
sustained point at the stated rate with the confirm runs' window, through vLLM's own `vllm bench serve`;
the SLO not holding is one line saying which target and by how much (pipeline/load/steady.py's slo_broken,
the one SLO check bench and verify share). The passing case runs in the chain (tests/test_chain.py:
bench/cpu-test.yaml measures a capacity, publish states it, verify-published loads it)."""

import json
import re

import pytest
import yaml
from test_capacity import capacity_section, make_variant

from pipeline.load.steady import QueueRule, slo_broken
from pipeline.publish.load_test import stated_capacity
from pipeline.schema import Workload

SETTINGS = {"max-model-len": 256, "max-num-seqs": 4, "gpu-memory-utilization": 0.9}


def test_slo_broken_says_by_how_much_each_target_was_missed():
    workload = Workload(name="chat", input_len=32, output_len=8, slo={"p90_ttft_ms": 2000, "p99_e2el_ms": 3000})
    assert slo_broken(workload, {"p90_ttft_ms": 2412.0, "p99_e2el_ms": 2900.0}, 0, 20) == [
        "p90_ttft_ms 2412.0 > 2000 ms (+21%)"
    ]
    assert slo_broken(workload, {"p90_ttft_ms": 1500.0, "p99_e2el_ms": 2900.0}, 0, 20) == []
    # a target not measured and failed requests
    assert slo_broken(workload, {"p90_ttft_ms": 1500.0}, 2, 20) == [
        "2 of 20 requests failed",
        "p99_e2el_ms: not measured",
    ]
    # a sustained point that completed fewer than arrived, and whose requests in flight grew beyond noise
    rule = QueueRule(max_shortfall=0.1, max_backlog_z=3.0)
    assert rule.broken(10.0, 8.0, 120, 6.04) == [
        "achieved 8 of 10 req/s sent (-20%, more than max_shortfall 0.1): the queue grew",
        "120 more requests in flight at the window's end than at its start (z 6.0 > max_backlog_z 3, beyond arrival "
        "noise): the queue grew",
    ]
    assert rule.broken(10.0, 9.5, 12, 1.2) == [] and rule.broken(10.0, 9.5, 0, None) == []


def test_the_published_manifest_states_the_chosen_configs_capacity_and_how_to_load_it(tiny_model):
    from pipeline.publish.serve_yaml import measured_capacity
    from pipeline.schema import Bench, Deployment, MeasuredWorkload

    from stage_files import bench_record

    section = capacity_section(2.0, SETTINGS)
    bench = Bench.model_validate(bench_record("tiny", "bf16", [], {}, capacity=section))
    stated = stated_capacity(measured_capacity(bench, Deployment(), tiny_model))
    assert stated["capacity_rps"] == 2.0 and stated["config"] == "mnbt" and stated["device_name"] == "Test CPU"
    assert stated["workload"]["slo"] == {"p90_ttft_ms": 3000, "p99_e2el_ms": 3000}
    # what the load test sizes its point by: the E2E bound, and the rule of a point from bench's profile
    assert stated["workload"]["e2e_bound_ms"] == 3000
    assert MeasuredWorkload.model_validate(stated["workload"]).as_input().name == "chat"
    search = stated["search"]
    assert search["min_requests"] == 4 and search["warmup_requests"] == 2 and search["confirm_window"] == 1.5
    assert (search["ramp_e2e"], search["window_e2e"], search["window_min_s"]) == (0.5, 1, 3)
    assert stated_capacity(None) is None


@pytest.mark.e2e
def test_verify_published_fails_in_one_line_where_the_stated_slo_does_not_hold(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("vllm")
    from pipeline.publish.load_test import this_device
    from pipeline.publish.publishing import publish
    from pipeline.publish.verify import verify_serving
    from pipeline.report.assemble import report

    model_dir = tmp_path / "artifacts/tiny"
    section = capacity_section(2.0, SETTINGS)  # config mnbt (SETTINGS) holds 2 req/s, the profile's 0.5: mnbt chosen
    section["device_name"] = this_device()  # measured on this device class: the load test judges
    # no server answers in 10 us; the E2E target (3 s) is what the point is sized by
    section["workloads"][0]["slo"] = {"p90_ttft_ms": 0.01, "p99_e2el_ms": 3000}
    make_variant(model_dir, "bf16", tiny_model, section)
    policy = tmp_path / "policy.yaml"
    objective = {"description": "t", "device": "cpu", "objective": [{"maximize": "chat.capacity_rps"}]}
    policy.write_text(yaml.safe_dump(objective))
    assert report(model_dir, policy).chosen == "bf16"
    dest = publish(model_dir, tmp_path / "published")
    stated = json.loads((dest / "manifest.json").read_text())["stated_capacity"]
    assert stated["capacity_rps"] == 2.0 and stated["workload"]["slo"] == {"p90_ttft_ms": 0.01, "p99_e2el_ms": 3000}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    with pytest.raises(RuntimeError) as failed:
        verify_serving(dest, "test-key", timeout_s=300)
    line = str(failed.value)
    assert "\n" not in line, line
    # bench/cpu-test.yaml's rule at E = 3 s: a ramp of 0.5 E, then a window of max(3 s, 1 E, 4 requests / 2 req/s)
    # x confirm_window 1.5 = 4.5 s of Poisson arrivals; the window's requests counted as they arrived
    found = re.search(
        r"load test, (\d+) requests over (\d+) s at the stated 2 req/s \(after a 2 s ramp\), "
        r"p90 TTFT <= 0\.01 ms, p99 E2E <= 3000 ms \(32 tokens in, 8 out, Poisson arrivals, sustained\): "
        r"did not hold on (.+?): (.+)$",
        line,
    )
    assert found, line
    requests, window_s, device, broken = found.groups()
    assert int(requests) > 0 and int(window_s) <= 12 and device == this_device()
    assert re.match(r"p90_ttft_ms \d+\.\d > 0\.01 ms \(\+\d+%\)", broken), broken
