"""make measure's choice of one server for eval and bench, or one each, and the settings eval then runs
with (pipeline/measure.py); the chain through make (tests/test_chain.py) runs it on a server."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")
from pipeline.evaluate.options import EvalSettings  # noqa: E402
from pipeline.evaluate.write import EngineRun  # noqa: E402
from pipeline.measure import on_profile_server, why_not_shared  # noqa: E402
from pipeline.schema import load_profile  # noqa: E402
from pipeline.settings import ROOT  # noqa: E402


class Plan:
    def __init__(self, longest: int, suite_paths=(Path("eval/synthetic-math.yaml"),)):
        self.longest, self.suite_paths, self.variant = longest, list(suite_paths), Path("out/m/bf16")


class Job:
    def __init__(self, longest=200, replicas=1, tp=1, args=None):
        self.plan = Plan(longest)
        args = {"model": "out/m/bf16", "seed": 0, "max_logprobs": 20, "max_num_seqs": 256} | (args or {})
        self.engine = EngineRun(args, eager=True, replicas=replicas, tp=tp)
        self.settings = EvalSettings(dtype="bfloat16")


PROFILE = load_profile(ROOT / "bench/cpu.yaml")  # max_model_len 1024, max_num_seqs 32, eager


def test_one_server_where_eval_fits_the_profiles_settings():
    assert why_not_shared(Job(), PROFILE, None) is None


@pytest.mark.parametrize(
    ("job", "dtype", "said"),
    [
        (Job(longest=1025), None, "eval's longest request is 1025 tokens, the profile's max_model_len 1024"),
        (Job(replicas=2), None, "eval runs 2 data-parallel ranks (DP), the bench one server"),
        (Job(tp=2), None, "TP: eval 2 GPUs a rank, the profile 1"),
        (Job(args={"enable_chunked_prefill": False}), None, "need whole prefills"),
        (Job(), "float16", "EVAL_DTYPE=float16"),  # neither bfloat16 nor float32, a CPU profile's auto
    ],
)
def test_two_servers_say_which_setting_differs(job, dtype, said):
    assert said in why_not_shared(job, PROFILE, dtype)


def test_lm_eval_suites_alone_start_no_shared_server():
    job = Job()
    job.plan.suite_paths = []
    assert "lm-eval's only" in why_not_shared(job, PROFILE, None)


def test_eval_takes_the_profiles_serving_settings_and_adds_only_its_own_needs():
    job = Job(args={"max_num_batched_tokens": 4096, "kv_cache_dtype": "fp8"})
    extra = on_profile_server(job, PROFILE)
    assert extra == {"max_logprobs": 20, "generation_config": "vllm"}
    args = job.engine.args
    assert args["max_num_seqs"] == PROFILE.max_num_seqs and args["max_model_len"] == PROFILE.max_model_len
    assert "max_num_batched_tokens" not in args  # the profile's server has vLLM's default
    assert args["kv_cache_dtype"] == "fp8" and job.engine.eager
    assert job.settings.dtype == args["dtype"]  # what results.json records: the profile server's dtype


@pytest.mark.parametrize(
    ("variant", "profile", "said"),
    [
        ("nope", "bench/cpu.yaml", "nope: no such variant folder; build it with `make quantize RECIPES=nope`"),
        (None, "bench/nope.yaml", "bench/nope.yaml: no such file"),
    ],
)
def test_bad_input_is_one_line_before_any_server(tmp_path, variant, profile, said):
    import subprocess
    import sys

    folder = tmp_path / (variant or "bf16")
    if variant is None:
        folder.mkdir()
    argv = [sys.executable, "-m", "pipeline.measure", str(folder), "--suites", "eval/synthetic-math.yaml"]
    proc = subprocess.run([*argv, "--profile", profile], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_a_bench_port_in_use_is_one_line_before_eval(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "pipeline.measure", str(tmp_path), "--suites", "eval/synthetic-math.yaml"]
        argv += ["--profile", "bench/cpu.yaml", "--port", str(port)]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (
        proc.returncode == 2
        and proc.stderr
        == f"error: BENCH_PORT={port}: already in use on 127.0.0.1; free it or leave BENCH_PORT unset for a free port\n"
    )
