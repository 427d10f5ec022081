"""verify-published's load test (pipeline/publish/load_test.py): the published config served at the
capacity its folder states, with the recorded workload, through vLLM's own `vllm bench serve`; the SLO
not holding is one line saying by how much. The passing case runs in the chain (tests/test_chain.py:
bench/cpu-test.yaml measures a capacity, publish states it, verify-published loads it)."""

import json

import pytest
import yaml
from test_capacity import capacity_section, make_variant

from pipeline.publish.load_test import overshoot, stated_capacity
from pipeline.schema import Workload

SETTINGS = {"max-model-len": 256, "max-num-seqs": 4, "gpu-memory-utilization": 0.9}


def test_overshoot_says_by_how_much_each_target_was_missed():
    workload = Workload(name="chat", input_len=32, output_len=8, slo={"p90_ttft_ms": 200, "p99_e2el_ms": 1000})
    assert overshoot(workload, {"p90_ttft_ms": 250.0, "p99_e2el_ms": 900.0}) == ["p90_ttft_ms 250 > 200 ms (+25%)"]
    assert overshoot(workload, {"p90_ttft_ms": 150.0, "p99_e2el_ms": 900.0}) == []


def test_the_published_manifest_states_the_chosen_configs_capacity_and_how_to_load_it():
    from pipeline.publish import measured_capacity
    from pipeline.schema import Deployment

    section = capacity_section(2.0, SETTINGS)
    from pipeline.schema import Bench

    from stage_files import bench_record

    bench = Bench.model_validate(bench_record("tiny", "bf16", [], {}, capacity=section))
    stated = stated_capacity(measured_capacity(bench, Deployment()))
    assert stated["capacity_rps"] == 2.0 and stated["config"] == "mnbt" and stated["device_name"] == "Test CPU"
    assert stated["workload"]["slo"] == {"p90_ttft_ms": 5000, "p99_e2el_ms": 20000}
    assert stated["search"]["min_requests"] == 4 and stated["search"]["warmup_requests"] == 2
    assert stated_capacity(None) is None


@pytest.mark.e2e
def test_verify_published_fails_in_one_line_where_the_stated_slo_does_not_hold(tmp_path, tiny_model, monkeypatch):
    pytest.importorskip("vllm")
    from pipeline.publish import publish, verify_serving
    from pipeline.publish.load_test import this_device
    from pipeline.report import report

    model_dir = tmp_path / "artifacts/tiny"
    section = capacity_section(2.0, SETTINGS)  # config mnbt (SETTINGS) holds 2 req/s, the profile's 0.5: mnbt chosen
    section["device_name"] = this_device()  # measured on this device class: the load test judges
    section["workloads"][0]["slo"] = {"p90_ttft_ms": 0.01}  # no server answers in 10 us
    make_variant(model_dir, "bf16", tiny_model, section)
    policy = tmp_path / "policy.yaml"
    objective = {"description": "t", "device": "cpu", "objective": [{"maximize": "chat.capacity_rps"}]}
    policy.write_text(yaml.safe_dump(objective))
    assert report(model_dir, policy).chosen == "bf16"
    dest = publish(model_dir, tmp_path / "published")
    stated = json.loads((dest / "manifest.json").read_text())["stated_capacity"]
    assert stated["capacity_rps"] == 2.0 and stated["workload"]["slo"] == {"p90_ttft_ms": 0.01}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    with pytest.raises(RuntimeError) as failed:
        verify_serving(dest, "test-key", timeout_s=300)
    line = str(failed.value)
    assert "\n" not in line and "load test, 4 requests at the stated 2 req/s" in line
    assert "the SLO did not hold" in line and "p90_ttft_ms" in line and "> 0.01 ms (+" in line
