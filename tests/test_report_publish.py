"""make report / make publish on a tiny model's files: the report and its plots, the published folder
a deployment pulls, its verification, and what publish refuses. The figures fed to the policy are made
up (a test of the rules, not a measurement). Runs where matplotlib is (the report's plots): .venv-serve.
"""

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("matplotlib")

from pipeline.artifacts import file_hashes, size_on_disk, tree_hash
from pipeline.publish import (
    kv_bytes_per_token,
    publish,
    serve_config,
    verify_files,
)
from pipeline.report import pareto_front, report
from pipeline.schema import ConfigError, Deployment, Policy

from stage_files import bench_record, eval_report, eval_results, identity, variant_manifest


def test_pareto_front_keeps_only_undominated_points():
    points = {"a": (1.0, 0.5), "b": (2.0, 0.6), "c": (2.5, 0.55), "d": (1.0, 0.4)}
    assert pareto_front(points) == ["a", "b"]


# ----------------------------------------------------------------------------------- end to end
def make_variant(
    model_dir: Path, name: str, source: Path, method: str, size_gib: float, tpot: float, shift: float = 0.0
) -> None:
    """A variant folder as quantize leaves it: the tiny checkpoint (its final norm's weights moved by
    `shift`, so that variants differ in their weights as quantized ones do), its manifest, and a bench.json."""
    out = model_dir / name
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("manifest.json"))
    if shift:
        from safetensors import safe_open
        from safetensors.torch import save_file

        weights = out / "model.safetensors"
        with safe_open(str(weights), "pt") as f:
            tensors, metadata = {key: f.get_tensor(key) for key in f.keys()}, f.metadata()
        tensors["model.norm.weight"] = tensors["model.norm.weight"] + shift
        save_file(tensors, str(weights), metadata=metadata)
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
    make_variant(model_dir, "small", tiny_model, "bf16", 0.2, 60, shift=0.25)
    make_variant(model_dir, "slow", tiny_model, "bf16", 0.1, 500, shift=0.5)
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

    # publishing the same thing again changes nothing (no file written, replaced or added); other
    # content is refused unless forced
    before = snapshot(out)
    assert publish(model_dir, out) == dest
    assert snapshot(out) == before
    rep = json.loads((model_dir / "report.json").read_text())
    rep["policy"]["deployment"]["replicas"] = 5  # as if the policy had been edited and the report made again
    (model_dir / "report.json").write_text(json.dumps(rep))
    with pytest.raises(ConfigError, match="already published with other content .*k8s.yaml.*immutable"):
        publish(model_dir, out)
    assert verify_files(dest) == [] and "replicas: 3" in (dest / "k8s.yaml").read_text()  # untouched
    publish(model_dir, out, force=True)
    assert "replicas: 5" in (dest / "k8s.yaml").read_text() and verify_files(dest) == []


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file and folder under `folder`: its content's hash (files), inode and modification time."""
    return {
        str(p.relative_to(folder)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None,
            p.stat().st_ino,
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
    }


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


def test_the_published_checkpoint_is_the_chosen_variant_as_quantize_recorded_it(tmp_path, model_dir):
    assert report(model_dir, write_policy(tmp_path, max_tpot=100))["chosen"] == "small"
    dest = publish(model_dir, tmp_path / "published")
    built = json.loads((model_dir / "small/manifest.json").read_text())
    # hashed here, from the published bytes, against what quantize wrote, not against publish's own manifest
    assert {rel: hashlib.sha256((dest / rel).read_bytes()).hexdigest() for rel in built["files"]} == built["files"]
    assert (dest / "build-manifest.json").read_bytes() == (model_dir / "small/manifest.json").read_bytes()
    assert json.loads((dest / "manifest.json").read_text())["checkpoint_sha256"] == built["sha256"]
    weights = {
        v: json.loads((model_dir / v / "manifest.json").read_text())["files"]["model.safetensors"]
        for v in ("bf16", "small", "slow")
    }
    assert len(set(weights.values())) == 3  # the fixture's variants differ: another one's files cannot pass


def test_sha256sum_checks_every_published_file(tmp_path, model_dir):
    """The pull check the model card names, with coreutils' own sha256sum: every file but manifest.json
    (which holds SHA256SUMS's hash) and SHA256SUMS itself is listed, and a changed byte fails it."""
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    dest = publish(model_dir, tmp_path / "published")

    def sha256sum_check() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dest, capture_output=True, text=True
        )

    proc = sha256sum_check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert sorted(proc.stdout.splitlines()) == [
        f"{rel}: OK" for rel in files if rel not in ("manifest.json", "SHA256SUMS")
    ]
    flip_a_byte(dest / "model.safetensors")
    proc = sha256sum_check()
    assert proc.returncode == 1 and "model.safetensors: FAILED" in proc.stdout.splitlines()


def test_a_checkpoint_changed_since_it_was_built_is_not_published(tmp_path, model_dir):
    report(model_dir, write_policy(tmp_path, max_tpot=100))
    flip_a_byte(model_dir / "small/model.safetensors")
    with pytest.raises(
        ConfigError,
        match=r"/small: changed since it was built \(.*model\.safetensors: sha256 differs from manifest\.json\); "
        r"rebuild it with `make quantize RECIPES=small FORCE=1`$",
    ):
        publish(model_dir, tmp_path / "published")
    assert not (tmp_path / "published").exists()


def test_a_variant_rebuilt_since_the_report_is_not_published(tmp_path, model_dir):
    report(model_dir, write_policy(tmp_path, max_tpot=100))  # chooses small
    # `make quantize FORCE=1` rebuilt small since: other weights, and a manifest that matches them
    folder = model_dir / "small"
    shutil.copyfile(model_dir / "slow/model.safetensors", folder / "model.safetensors")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = json.loads((model_dir / "slow/manifest.json").read_text())["files"][
        "model.safetensors"
    ]
    manifest["sha256"] = tree_hash(manifest["files"])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"/small: rebuilt since .*report\.json was made; run `make report` again"):
        publish(model_dir, tmp_path / "published")
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


def test_random_weights_are_published_by_a_rehearsal_policy_only(tmp_path, model_dir):
    path = write_policy(tmp_path, max_tpot=100)
    rule = yaml.safe_load(path.read_text())
    with pytest.raises(ValueError, match="rehearsal"):
        Policy.model_validate(rule | {"rehearsal": True})  # with an accuracy rule: meaningless for random weights
    for manifest_path in model_dir.glob("*/manifest.json"):
        manifest_path.write_text(json.dumps(json.loads(manifest_path.read_text()) | {"random_weights": True}))
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
