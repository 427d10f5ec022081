"""Capacity at an SLO (pipeline/bench/capacity/, pipeline/load/): the profile's SLO, workloads and search
checked with one-line errors, a grid config's vLLM flags and engine arguments, a workload replayed from
eval's samples through `vllm bench serve`'s arguments, the published files carrying the chosen settings,
replicas sized from traffic and a reasoning model sized by its reasoning workload. The search's logic is
tests/test_capacity_search.py's (a server simulated in virtual time); `make bench` with the CPU test profile
measuring a capacity on a real server is tests/test_chain.py's bench step (assert_capacity_measured)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.artifacts import read_bench, read_variant_manifest
from pipeline.bench.capacity import configs
from pipeline.bench.capacity.eval_workload import eval_dataset
from pipeline.load.bench_serve import Target, bench_serve_args, shares
from pipeline.load.steady import burst_plan, sustained_plan
from pipeline.schema import (
    Bench,
    Capacity,
    CapacitySearch,
    ConfigError,
    Deployment,
    MeasuredWorkload,
    ServingConfig,
    Workload,
    load_policy,
    load_profile,
)
from pipeline.settings import ROOT

from stage_files import bench_record, identity, samples_file, write_manifest
from stage_files import capacity_section as capacity_section_of

PROFILE = """\
description: test
shapes: [{name: chat, input_len: 32, output_len: 8}]
concurrency: [1]
max_model_len: 256
max_num_seqs: 4
memory_budget_gib: 4
capacity:
  workloads:
    - {name: chat, input_len: 32, output_len: 8, slo: {p90_ttft_ms: 500, p99_e2el_ms: 2000}}
  grid: [{name: profile}]
  warmup_requests: 2
  saturation_requests: 4
  ramp_e2e: 1
  window_e2e: 2
  window_min_s: 5
  min_requests: 4
  max_shortfall: 0.2
  max_points: 2
  budget_s: 30
  confirm_window: 2
"""
SLO = "slo: {p90_ttft_ms: 500, p99_e2el_ms: 2000}"


def search_settings(**fields) -> CapacitySearch:
    base = yaml.safe_load(PROFILE)["capacity"]
    return CapacitySearch.model_validate(base | fields)


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (SLO, "slo: {p95_ttft_ms: 500, p99_e2el_ms: 2000}", "capacity.workloads.0: slo: 'p95_ttft_ms' is not a"),
        (SLO, "slo: {p90_tpot_ms: 50}", "slo: needs a ttft or e2el target"),
        (SLO, "slo: {p90_ttft_ms: 0, p99_e2el_ms: 2000}", "slo: p90_ttft_ms must be above 0 ms"),
        (SLO, "slo: {}", "capacity.workloads.0.slo: Dictionary should have at least 1"),
        # a sustained point is sized by the E2E latency the SLO allows: a TTFT target alone bounds none
        (
            SLO,
            "slo: {p90_ttft_ms: 500}",
            "capacity.workloads.0: slo: bound the E2E latency: an e2el target, or a ttft target with a tpot or itl one",
        ),
        (SLO, "slo: {p90_ttft_ms: 500, p99_itl_ms: 0}", "slo: p99_itl_ms must be above 0 ms"),
        ("input_len: 32, output_len: 8, slo", "input_len: 32, output_len: 1, slo", "workloads.0.output_len"),
        ("- {name: chat, input_len", "- {name: chat, traffic: batch, input_len", "capacity.workloads.0.traffic: Input"),
        ("grid: [{name: profile}]", "grid: [{name: a}, {name: a}]", "capacity: grid: names must be unique"),
        (
            "grid: [{name: profile}]",
            "grid: [{name: a, kv_cache_dtype: int8}]",
            "capacity.grid.0.kv_cache_dtype: Input should be 'auto' or 'fp8'",
        ),
        (
            "grid: [{name: profile}]",
            "grid: [{name: a, max_cudagraph_capture_size: 0}]",
            "capacity.grid.0.max_cudagraph_capture_size: Input should be greater than 0",
        ),
        (
            "grid: [{name: profile}]",
            "grid: [{name: profile, workloads: [rag]}]",
            "capacity: grid: profile: workload 'rag' is not one of chat",
        ),
        (
            f"{SLO}}}\n  grid: [{{name: profile}}]",
            f"{SLO}}}\n    - {{name: rag, input_len: 64, output_len: 8, {SLO}}}\n"
            "  grid: [{name: a, workloads: [chat]}]",
            "capacity: grid: no config measures workload rag",
        ),
        ("ramp_e2e: 1", "ramp_e2e: 0.1", "capacity.ramp_e2e: Input should be greater than or equal to 0.5"),
        ("window_e2e: 2", "window_e2e: 0.5", "capacity.window_e2e: Input should be greater than or equal to 1"),
        ("window_min_s: 5", "window_min_s: 0", "capacity.window_min_s: Input should be greater than 0"),
        ("max_shortfall: 0.2", "max_shortfall: 1", "capacity.max_shortfall: Input should be less than 1"),
        ("confirm_window: 2", "confirm_window: 0.5", "capacity.confirm_window: Input should be greater than or"),
        ("min_requests: 4", "min_requests: 2", "capacity.min_requests: Input should be greater than or equal to 4"),
        ("budget_s: 30", "budget_s: 30\n  confirm_repeats: 6", "capacity.confirm_repeats: Input should be less than"),
        ("budget_s: 30", "budget_s: 30\n  confirm_repeats: -1", "capacity.confirm_repeats: Input should be greater"),
        # the old search's settings are gone: a profile that still gives one says so
        ("budget_s: 30", "budget_s: 30\n  point_duration_s: 2", "capacity.point_duration_s: unknown key"),
        ("{name: chat, input_len", "{name: 'chat 2', input_len", "capacity.workloads.0.name: String should match"),
        ("input_len: 32, output_len: 8, slo", "slo", "workloads.0: give input_len and output_len (random prompts), or"),
        ("input_len: 32, output_len: 8, slo", "from_eval: gsm8k, input_len: 32, slo", "input_len: from_eval takes the"),
    ],
)
def test_a_bad_slo_workload_or_search_is_one_line_naming_the_file_and_key(tmp_path, old, new, message):
    path = tmp_path / "profile.yaml"
    assert old in PROFILE
    path.write_text(PROFILE.replace(old, new))
    with pytest.raises(ConfigError) as e:
        load_profile(path)
    text = str(e.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_the_profile_as_written_loads_with_the_defaults_of_what_it_leaves_out(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(PROFILE)
    search = load_profile(path).capacity
    assert (search.ramp_e2e, search.window_e2e, search.window_min_s, search.max_shortfall) == (1, 2, 5, 0.2)
    assert search.confirm_repeats == 1 and search.tolerance == 0.1 and search.confirm_window == 2
    (chat,) = search.workloads
    assert chat.traffic == "chat" and chat.e2e_bound_ms(8) == 2000
    # TTFT and TPOT bound the E2E latency too: TTFT + (tokens - 1) x TPOT
    both = Workload(name="r", input_len=8, output_len=64, slo={"p90_ttft_ms": 500, "p90_tpot_ms": 20})
    assert both.e2e_bound_ms(64) == 500 + 63 * 20


def test_every_profile_in_bench_loads_and_the_cpu_ones_measure_capacity():
    for path in sorted((ROOT / "bench").glob("*.yaml")):
        load_profile(path)
    for name in ("cpu", "cpu-test", "h200-capacity"):
        assert load_profile(ROOT / f"bench/{name}.yaml").capacity is not None, name


def test_a_policy_states_traffic_or_replicas_and_names_capacity_figures(tmp_path):
    path = tmp_path / "policy.yaml"
    body = {
        "description": "d",
        "limits": {"chat.capacity_rps": {"min": 10}},
        "objective": [{"maximize": "chat.capacity_rps"}],
    }
    path.write_text(yaml.safe_dump(body | {"deployment": {"traffic_rps": 100, "headroom": 0.2}}))
    assert load_policy(path).deployment.traffic_rps == 100
    path.write_text(yaml.safe_dump(body | {"deployment": {"traffic_rps": 100, "replicas": 2}}))
    with pytest.raises(ConfigError, match=r"deployment: replicas: give replicas or traffic_rps"):
        load_policy(path)
    path.write_text(yaml.safe_dump(body | {"deployment": {"headroom": 0.2}}))
    with pytest.raises(ConfigError, match=r"headroom/workload: used only with traffic_rps"):
        load_policy(path)
    path.write_text(yaml.safe_dump(body | {"limits": {"chat.capacity": {"min": 10}}}))
    with pytest.raises(ConfigError, match=r"'chat.capacity' is not a figure the stages write"):
        load_policy(path)


# ------------------------------------------------------------------------- a config's vLLM flags
FLAG = "--max-cudagraph-capture-size"


def graph_cap(cmd: list[str]) -> str | None:
    return cmd[cmd.index(FLAG) + 1] if FLAG in cmd else None


def test_a_configs_settings_become_vllm_flags_and_its_servers_engine_arguments(tmp_path, monkeypatch):
    from pipeline import serving

    monkeypatch.setattr(serving, "on_gpu", lambda: False)
    monkeypatch.setattr(configs, "on_gpu", lambda: False)
    profile = load_profile(ROOT / "bench/h200-capacity.yaml")
    config = ServingConfig(
        name="x",
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        api_server_count=4,
        stream_interval=8,
    )
    assert configs.server_settings(config, profile) == {
        "max-model-len": 4096,
        "max-num-seqs": 128,
        "gpu-memory-utilization": 0.9,
        "max-num-batched-tokens": 2048,
        "enable-prefix-caching": False,
        "api-server-count": 4,
        "stream-interval": 8,
    }
    args = configs.engine_arguments(config, profile)
    assert args == {
        "max_num_seqs": 128,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "auto",
        "max_cudagraph_capture_size": None,
        "extra": {
            "max_num_batched_tokens": 2048,
            "enable_prefix_caching": False,
            "api_server_count": 4,
            "stream_interval": 8,
        },
    }
    cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=4096, dtype="bfloat16", **args)
    assert cmd[cmd.index("--max-num-seqs") + 1] == "128" and cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"
    assert cmd[cmd.index("--api-server-count") + 1] == "4" and cmd[cmd.index("--stream-interval") + 1] == "8"
    assert "--no-enable-prefix-caching" in cmd and "--kv-cache-dtype" not in cmd
    # no config (the latency levels' server): the profile's own settings
    assert configs.server_settings(None, profile) == {
        "max-model-len": 4096,
        "max-num-seqs": 1024,
        "gpu-memory-utilization": 0.9,
    }
    assert configs.engine_arguments(None, profile)["extra"] == {}


def test_on_a_gpu_graphs_cover_every_sequence_unless_a_config_sets_the_cap(monkeypatch, tmp_path):
    """vLLM captures graphs up to 512 by default; above that the server's command, and the settings bench
    records for serve.yaml, raise the cap to max-num-seqs (not eager, on a GPU only). A config that sets
    max_cudagraph_capture_size (vLLM's own 512: the reference of bench/h200-capacity.yaml) runs with it."""
    from pipeline import serving

    monkeypatch.setattr(serving, "on_gpu", lambda: True)
    monkeypatch.setattr(configs, "on_gpu", lambda: True)
    profile = load_profile(ROOT / "bench/h200-capacity.yaml")
    for seqs, eager, cap in ((1024, False, 1024), (512, False, None), (1024, True, None)):
        cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=4096, max_num_seqs=seqs, enforce_eager=eager)
        assert graph_cap(cmd) == (str(cap) if cap else None)
        as_run = profile.model_copy(update={"enforce_eager": eager})
        settings = configs.server_settings(ServingConfig(name="x", max_num_seqs=seqs), as_run)
        assert settings.get("max-cudagraph-capture-size") == cap
    explicit = ServingConfig(name="vllm-defaults", max_cudagraph_capture_size=512)
    assert configs.server_settings(explicit, profile)["max-cudagraph-capture-size"] == 512
    args = configs.engine_arguments(explicit, profile)
    assert args["max_num_seqs"] == 1024 and args["max_cudagraph_capture_size"] == 512
    assert graph_cap(serving.vllm_server_command(tmp_path, 1, max_model_len=4096, **args)) == "512"
    # eager: no graphs whatever the config says
    eager = profile.model_copy(update={"enforce_eager": True})
    assert "max-cudagraph-capture-size" not in configs.server_settings(explicit, eager)
    cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=4096, enforce_eager=True, **args)
    assert graph_cap(cmd) is None
    # on a CPU neither the rule nor a config's cap
    monkeypatch.setattr(serving, "on_gpu", lambda: False)
    monkeypatch.setattr(configs, "on_gpu", lambda: False)
    cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=4096, max_num_seqs=1024, dtype="bfloat16")
    assert graph_cap(cmd) is None
    assert "max-cudagraph-capture-size" not in configs.server_settings(explicit, profile)
    cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=4096, dtype="bfloat16", **args)
    assert graph_cap(cmd) is None


def test_a_configs_kv_cache_dtype_is_measured_but_ships_only_with_a_recipe_of_that_dtype(tmp_path, monkeypatch):
    from pipeline import serving

    monkeypatch.setattr(serving, "on_gpu", lambda: False)
    monkeypatch.setattr(configs, "on_gpu", lambda: False)
    profile = load_profile(ROOT / "bench/cpu-test.yaml")
    fp8, plain = ServingConfig(name="kv-fp8", kv_cache_dtype="fp8"), ServingConfig(name="profile")
    assert configs.server_settings(fp8, profile)["kv-cache-dtype"] == "fp8"
    args = configs.engine_arguments(fp8, profile)
    assert args["kv_cache_dtype"] == "fp8"
    cmd = serving.vllm_server_command(tmp_path, 1, max_model_len=256, dtype="bfloat16", **args)
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"
    # unset: the recipe's (an fp8 recipe's servers run fp8; auto is vLLM's default, not listed)
    assert "kv-cache-dtype" not in configs.server_settings(plain, profile)
    assert configs.server_settings(plain, profile, "fp8")["kv-cache-dtype"] == "fp8"
    assert configs.engine_arguments(plain, profile, "fp8")["kv_cache_dtype"] == "fp8"
    # a config's dtype other than the recipe's: measured, never shipped (eval measured the recipe's)
    why = configs.not_chosen_because(fp8, "auto")
    assert why is not None and why.startswith("kv-cache-dtype fp8: eval measured this variant's accuracy with the KV")
    assert "kv_cache_dtype: fp8 ships it" in why
    assert configs.not_chosen_because(fp8, "fp8") is None
    assert configs.not_chosen_because(plain, "auto") is None and configs.not_chosen_because(plain, "fp8") is None
    assert configs.not_chosen_because(ServingConfig(name="kv16", kv_cache_dtype="auto"), "fp8") is not None


# ------------------------------------------------------------------------------- from_eval workloads
def test_a_workload_from_eval_replays_the_variants_own_prompts_and_output_lengths(tmp_path):
    variant = tmp_path / "artifacts/m/bf16"
    workload = Workload(name="math", from_eval="synthetic-math", slo={"p90_ttft_ms": 100, "p99_e2el_ms": 5000})
    with pytest.raises(
        ConfigError, match=r"from_eval synthetic-math: no .*samples_synthetic-math.jsonl; run make eval"
    ):
        eval_dataset(variant, workload, 256, tmp_path / "math.jsonl")
    lengths = [2, 5, 40, 300, 7, 9, 11, 13, 15, 17]  # 300: more than max_model_len leaves; 2: the shortest kept
    samples_file(
        variant / "eval/samples_synthetic-math.jsonl",
        [
            {
                "doc_id": i,
                "prompt": "word " * (10 + i),
                "prompt_tokens": 10 + i,
                "output_tokens": n,
                "output": "4",
                "exact_match": 1.0,
            }
            for i, n in enumerate(lengths)
        ],
    )
    dataset = tmp_path / "math.jsonl"
    stats = eval_dataset(variant, workload, 256, dataset)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert [r["output_tokens"] for r in rows] == [2, 5, 40, 256 - 13, 7, 9, 11, 13, 15, 17]
    assert rows[0]["prompt"] == "word " * 10 and stats.items == 10
    assert stats.output_tokens.max == 243 and stats.prompt_tokens.p50 == 15 and stats.output_tokens.mean == 36.2
    measured = MeasuredWorkload.model_validate(
        workload.model_dump() | {"lengths": stats.model_dump(), "e2e_bound_ms": workload.e2e_bound_ms(36.2)}
    )
    text = measured.slo_text()
    assert text.startswith("p90 TTFT <= 100 ms, p99 E2E <= 5000 ms (eval's synthetic-math prompts and output")
    assert "lengths, 10 items: in p50 15" in text and text.endswith("Poisson arrivals, sustained)"), text
    assert measured.as_input() == workload  # what verify-published replays: the workload as the profile said
    target = Target("http://127.0.0.1:8000", "m", "t", None, tmp_path / "results", tmp_path / "client.log")
    plan = sustained_plan("search", 2.5, search_settings(), measured.e2e_bound_ms, seed=3)
    args = bench_serve_args(target, workload, plan, shares(plan, 1, "r.json")[0], dataset)
    assert args[args.index("--dataset-name") + 1] == "custom" and args[args.index("--dataset-path") + 1] == str(dataset)
    assert "--skip-chat-template" in args and "--random-input-len" not in args
    # the plan's arrivals, and every request's results saved for the steady-state rule to read back
    assert args[args.index("--num-prompts") + 1] == str(plan.num_prompts) and args[args.index("--seed") + 1] == "3"
    assert args[args.index("--request-rate") + 1] == "2.5" and "--save-detailed" in args
    assert args[args.index("--result-dir") + 1] == str(tmp_path / "results")
    assert args[args.index("--result-filename") + 1] == "r-c0.json"
    # a random workload: vLLM's random dataset at its lengths; a burst: every request at once
    chat = search_settings().workloads[0]
    burst = burst_plan("saturation", 4, 2000, seed=2)
    args = bench_serve_args(target, chat, burst, shares(burst, 1, "s.json")[0], None)
    assert args[args.index("--dataset-name") + 1] == "random" and args[args.index("--random-input-len") + 1] == "32"
    assert args[args.index("--request-rate") + 1] == "inf" and args[args.index("--num-prompts") + 1] == "4"
    assert "--skip-chat-template" not in args and "--save-detailed" in args


# --------------------------------------------------------------------------------- published files
def capacity_section(chat_capacity: float | None, settings: dict) -> dict:
    """Two configs: the profile's (the reference) holds 0.5 req/s and broke at 0.525, `settings` hold
    chat_capacity; each run twice more. mnbt is chosen where it held above the reference's bracket."""
    configs = {"profile": ({"max-num-seqs": 4}, 0.5), "mnbt": (settings, chat_capacity)}
    return capacity_section_of(configs, "Test CPU", repeats=2)


def make_variant(model_dir: Path, name: str, source: Path, section: dict | None) -> None:
    out = model_dir / name
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("manifest.json"))
    manifest = write_manifest(out, model_dir.name, name)
    fields = {"identity": identity(manifest), **({"capacity": section} if section else {})}
    bench = bench_record(model_dir.name, name, levels=[], memory={}, **fields)
    (out / "bench.json").write_text(json.dumps(bench))


# stage_files.capacity_section's confirm runs at 4 req/s: achieved 4, 3.92 and 3.84 over a 10 s window
SPREAD = "held over a 10 s window in 3 of 3 runs, achieved 96%-100% of offered"
CHAT_SLO = "p90 TTFT <= 3000 ms, p99 E2E <= 3000 ms (32 tokens in, 8 out, Poisson arrivals, sustained)"


def test_publish_writes_the_measured_config_capacity_and_replicas_from_traffic(tmp_path, tiny_model):
    pytest.importorskip("vllm")  # report and publish run in the serve environment
    from pipeline.publish.publishing import publish
    from pipeline.report.assemble import report

    model_dir = tmp_path / "artifacts/tiny"
    settings = {"max-model-len": 256, "max-num-seqs": 8, "gpu-memory-utilization": 0.9, "max-num-batched-tokens": 512}
    make_variant(model_dir, "bf16", tiny_model, capacity_section(0.8, settings))
    make_variant(model_dir, "fast", tiny_model, capacity_section(4.0, settings))
    policy = tmp_path / "policy.yaml"
    deployment = {"traffic_rps": 10, "headroom": 0.5, "max_model_len": 1024}
    policy.write_text(
        yaml.safe_dump(
            {
                "description": "the most requests a second at the chat SLO",
                "device": "cpu",
                "limits": {"chat.capacity_rps": {"min": 1}},
                "objective": [{"maximize": "chat.capacity_rps"}],
                "deployment": deployment,
            }
        )
    )
    decision = report(model_dir, policy)
    assert decision.chosen == "fast" and "chat.capacity_rps: 0.8 < 1" in decision.verdicts["bf16"].why
    md = (model_dir / "report.md").read_text()
    assert "## Capacity at an SLO" in md and f"**chat** (chat): {CHAT_SLO}." in md
    assert "| fast | **mnbt** |" in md and "| fast | profile |" in md
    # capacity, confirmed, broke at, saturation, achieved at capacity, points, search s, device
    assert f"| 4 | {SPREAD} | 4.2 | 12 | 3.84-4 | 3 | 10 | Test CPU |" in md
    why = "mnbt held 4 req/s, 8.00x the reference profile's 0.5, above the reference's bracket [0.5, 0.525)"
    assert f"- fast: {why}." in md and "- bf16: mnbt held 0.8 req/s, 1.60x the reference" in md
    assert (model_dir / "plots/capacity_chat.png").stat().st_size > 1000
    dest = publish(model_dir, tmp_path / "published")
    serve_text = (dest / "serve.yaml").read_text()
    serve = yaml.safe_load(serve_text)
    # the measured config, not memory arithmetic (which would give max-model-len 1024 from the policy)
    assert serve["max-num-batched-tokens"] == 512 and serve["max-num-seqs"] == 8 and serve["max-model-len"] == 256
    assert f"#   measured capacity 4 req/s (saturation 12 req/s; {SPREAD}) at\n#   {CHAT_SLO},\n" in serve_text
    assert f"#   chosen: {why},\n" in serve_text
    assert "Test CPU with vLLM 0.32.0" in serve_text
    assert "the other configs held (req/s): profile 0.5" in serve_text and "Fallback" not in serve_text
    card = (dest / "README.md").read_text()
    assert f"Capacity: holds 4 req/s ({SPREAD}) at {CHAT_SLO} on Test CPU" in card
    # ceil(10 req/s x 1.5 / 4 req/s) = 4 replicas, in both container files
    compose = yaml.safe_load((dest / "docker-compose.yml").read_text())["services"]["tiny-fast"]
    assert compose["deploy"]["replicas"] == 4 and compose["ports"] == ["127.0.0.1:8000-8003:8000"]
    k8s = next(yaml.safe_load_all((dest / "k8s.yaml").read_text()))
    assert k8s["spec"]["replicas"] == 4 and "ceil(10 req/s x (1 + headroom 0.5)" in (dest / "k8s.yaml").read_text()


def measured_at(capacity_rps: float):
    """The publish stage's MeasuredCapacity of a section whose chosen config held `capacity_rps` on chat."""
    from pipeline.publish.serve_yaml import MeasuredCapacity

    section = Capacity.model_validate(capacity_section_of({"profile": ({"max-num-seqs": 4}, capacity_rps)}, "Test CPU"))
    workload, run = section.chosen_run("chat")
    return MeasuredCapacity(workload, run, section, [])


def test_replicas_from_traffic_round_up_with_the_default_headroom():
    pytest.importorskip("transformers")  # pipeline.publish's imports
    from pipeline.publish.serve_yaml import replica_count

    measured = measured_at(4.0)
    assert measured.run.capacity_rps == 4.0
    # 10 req/s x 1.3 / 4 req/s a replica = 3.25: four replicas (three would carry 12 req/s, not 13)
    replicas, why = replica_count(measured, Deployment(traffic_rps=10), "bf16")
    assert (replicas, why) == (4, "ceil(10 req/s x (1 + headroom 0.3) / 4 req/s a replica)")
    assert replica_count(measured, Deployment(traffic_rps=0.1), "bf16")[0] == 1
    assert replica_count(measured, Deployment(traffic_rps=10, headroom=0), "bf16")[0] == 3  # 2.5 -> 3


def test_the_default_traffic_headroom_is_the_documented_one():
    """docs/policies.md gives each deployment key's default: `headroom` (0.3)."""
    import re

    text = (ROOT / "docs/policies.md").read_text()
    (documented,) = re.findall(r"`headroom` \(([0-9.]+)\)", text)
    assert Deployment(traffic_rps=10).traffic_headroom == float(documented) == 0.3
    assert Deployment(traffic_rps=10, headroom=0).traffic_headroom == 0.0  # given: taken as given, 0 too


def test_without_a_capacity_serve_yaml_says_it_is_memory_arithmetic_and_traffic_cannot_size_replicas(
    tmp_path, tiny_model
):
    pytest.importorskip("vllm")
    from pipeline.publish.serve_yaml import capacity_sentence, measured_capacity, replica_count, serve_config

    model_dir = tmp_path / "artifacts/tiny"
    make_variant(model_dir, "bf16", tiny_model, None)
    folder = model_dir / "bf16"
    manifest = read_variant_manifest(folder)
    bench, _ = read_bench(folder)
    cfg, header = serve_config(folder, "tiny-bf16", manifest, bench, Deployment(max_model_len=1024))
    assert "Fallback: no capacity was measured" in header and "max-num-batched-tokens" not in cfg
    assert capacity_sentence(None).startswith("Capacity: not measured")
    with pytest.raises(ConfigError, match="deployment.traffic_rps: bf16 has no capacity measured"):
        replica_count(measured_capacity(bench, Deployment(traffic_rps=5), folder), Deployment(traffic_rps=5), "bf16")
    # one config, held once (no confirm runs): stated, and said not to be confirmed
    section = Capacity.model_validate(capacity_section_of({"profile": ({"max-num-seqs": 4}, 2.0)}, "Test CPU"))
    once = bench.model_copy(update={"capacity": section})
    measured = measured_capacity(once, Deployment(), folder)
    assert capacity_sentence(measured).startswith(f"Capacity: holds 2 req/s (one run at that rate) at {CHAT_SLO}")
    assert capacity_sentence(measured).endswith(
        "Measured on one machine: another of the same model can hold less "
        "(two H100s differed by a fifth in TPOT at one load), so leave headroom."
    )
    cfg, header = serve_config(folder, "tiny-bf16", manifest, once, Deployment())
    assert "(saturation 12 req/s; one run at that rate: not confirmed) at" in header and cfg["max-num-seqs"] == 4
    assert "#   chosen: profile: no other config held a rate,\n" in header and "Fallback" not in header
    with_capacity = bench.model_copy(
        update={"capacity": Capacity.model_validate(capacity_section(2.0, {"max-num-seqs": 8}))}
    )
    with pytest.raises(ConfigError, match="deployment.workload: 'rag' was not measured by make bench"):
        measured_capacity(with_capacity, Deployment(traffic_rps=5, workload="rag"), folder)


def with_a_reasoning_workload(section: dict, capacity_rps: float) -> dict:
    """`section` with a second workload, `think` (traffic: reasoning), that its configs held at capacity_rps;
    listed after chat, so a reasoning model is sized by the first *reasoning* workload, not the first."""
    from pipeline.schema import Choice

    think = section["workloads"][0] | {"name": "think", "traffic": "reasoning", "output_len": 64}
    runs = [r | {"workload": "think", "capacity_rps": capacity_rps, "confirmed": []} for r in section["runs"]]
    choice = Choice(config=section["chosen"]["chat"]["config"], reference="profile", why="profile: the reference")
    return section | {
        "workloads": [*section["workloads"], think],
        "grid": [c | {"workloads": ["chat", "think"]} for c in section["grid"]],
        "runs": section["runs"] + runs,
        "chosen": section["chosen"] | {"think": choice.model_dump(mode="json")},
    }


def reasoning_tokenizer(folder: Path, source: Path) -> Path:
    """A folder with `source`'s tokenizer and a chat template that drops think blocks, as R1's does."""
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(source / name, folder / name)
    template = (source / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text("{#- history: content.split('</think>')[-1] -#}\n" + template)
    return folder


def bench_with(section: dict) -> Bench:
    """A variant's bench.json with `section` as its capacity and nothing else measured."""
    return Bench.model_validate(bench_record("tiny", "bf16", [], {}, capacity=section))


def test_a_reasoning_model_is_sized_by_its_first_reasoning_workload(tmp_path, tiny_model, embedded_source):
    pytest.importorskip("transformers")
    from pipeline.publish.serve_yaml import capacity_sentence, measured_capacity

    section = with_a_reasoning_workload(capacity_section_of({"profile": ({"max-num-seqs": 4}, 2.0)}, "Test CPU"), 0.7)
    capacity = Capacity.model_validate(section)
    assert capacity.sizing_workload(False) == "chat" and capacity.sizing_workload(True) == "think"
    # no reasoning workload: the first, reasoning model or not
    plain = Capacity.model_validate(capacity_section_of({"profile": ({"max-num-seqs": 4}, 2.0)}, "Test CPU"))
    assert plain.sizing_workload(True) == "chat"
    bench = bench_with(section)
    reasoning = reasoning_tokenizer(tmp_path / "r1-like", embedded_source)
    measured = measured_capacity(bench, Deployment(), reasoning)
    assert measured.workload.name == "think" and measured.run.capacity_rps == 0.7
    assert "0.7 req/s" in capacity_sentence(measured) and "64 out" in capacity_sentence(measured)
    # SmolLM2's own template has no think blocks: sized by the first workload
    measured = measured_capacity(bench, Deployment(), tiny_model)
    assert measured.workload.name == "chat" and measured.run.capacity_rps == 2.0
    # the policy's deployment.workload wins over the model's kind
    assert measured_capacity(bench, Deployment(traffic_rps=5, workload="chat"), reasoning).workload.name == "chat"
    # the other configs serve.yaml's header lists are the sizing workload's runs, never another workload's
    configs = {"profile": ({"max-num-seqs": 4}, 2.0), "mnbt": ({"max-num-seqs": 8}, 3.0)}
    two = with_a_reasoning_workload(capacity_section_of(configs, "Test CPU"), 0.7)
    measured = measured_capacity(bench_with(two), Deployment(), reasoning)
    other = ({"profile", "mnbt"} - {measured.run.config}).pop()
    assert measured.workload.name == "think" and [(r.workload, r.config) for r in measured.others] == [("think", other)]
    # the sizing workload's chosen config held no rate: no capacity stated (not chat's in its place)
    none_held = with_a_reasoning_workload(capacity_section_of(configs, "Test CPU"), None)
    assert measured_capacity(bench_with(none_held), Deployment(), reasoning) is None
    assert capacity_sentence(None).startswith("Capacity: not measured")


def test_a_profile_that_states_vllm_s_graph_cap_measures_its_reference_on_the_levels_server(monkeypatch, tmp_path):
    """bench/h200-reasoning-frontend.yaml: the profile's own server is vLLM's defaults (graphs to 512, not the
    project's rule of graphs to max-num-seqs), so its reference config sets nothing and shares the latency
    levels' server (bench/variant.py): one server start fewer a variant, about 3 minutes on the H200. The
    other config's own capture size reaches its server's command and its settings (the journal's key)."""
    from pipeline import serving
    from pipeline.bench.levels import server_command

    monkeypatch.setattr(serving, "on_gpu", lambda: True)
    monkeypatch.setattr(configs, "on_gpu", lambda: True)
    profile = load_profile(ROOT / "bench/h200-reasoning-frontend.yaml")
    reference, graphs = profile.capacity.grid
    assert not reference.overrides()  # bench/variant.py: measured on the server the levels ran on
    assert configs.server_settings(reference, profile)["max-cudagraph-capture-size"] == 512
    levels = server_command(tmp_path, profile, 8000)
    assert graph_cap(levels) == "512"
    assert configs.engine_arguments(graphs, profile)["max_cudagraph_capture_size"] == 1024
    assert graph_cap(server_command(tmp_path, profile, 8000, graphs)) == "1024"
    settings = configs.server_settings(graphs, profile)
    assert settings["api-server-count"] == 4 and settings["stream-interval"] == 8
    assert settings["max-cudagraph-capture-size"] == 1024
    # a profile without it keeps the project's rule
    rule = profile.model_copy(update={"max_cudagraph_capture_size": None})
    assert graph_cap(server_command(tmp_path, rule, 8000)) == "1024"
