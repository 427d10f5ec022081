"""make report / make publish on a tiny model's files: the report and its plots, the published folder
a deployment pulls, its verification, and what publish refuses. The figures fed to the policy are made
up (a test of the rules, not a measurement). Runs where matplotlib is (the report's plots): .venv-serve.
"""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("matplotlib")

from pipeline.gpu_memory import kv_bytes_per_token
from pipeline.identity import tree_hash
from pipeline.publish.publishing import publish
from pipeline.publish.serve_yaml import serve_config
from pipeline.publish.verify import verify_files
from pipeline.report.assemble import report
from pipeline.schema import Bench, ConfigError, Deployment, Policy, VariantManifest

from report_inputs import tiny_model_dir, write_policy


# ----------------------------------------------------------------------------------- end to end
@pytest.fixture()
def model_dir(tmp_path, tiny_model) -> Path:
    return tiny_model_dir(tmp_path, tiny_model)


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
    data = json.loads((folder / "manifest.json").read_text())
    bench = Bench.model_validate_json((folder / "bench.json").read_text())
    d = Deployment(gpu_memory_gib=24, max_model_len=1024)
    plain, plain_header = serve_config(folder, "tiny-small", VariantManifest.model_validate(data), bench, d)
    data["recipe"]["kv_cache_dtype"] = "fp8"
    fp8, fp8_header = serve_config(folder, "tiny-small", VariantManifest.model_validate(data), bench, d)
    assert "kv-cache-dtype" not in plain and fp8["kv-cache-dtype"] == "fp8"
    config = json.loads((folder / "config.json").read_text())
    assert kv_bytes_per_token(config, "fp8") * 2 == kv_bytes_per_token(config)
    assert f"KV cache {kv_bytes_per_token(config, 'fp8')} bytes/token" in fp8_header


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
    assert decision.chosen is None and "nothing is published" in decision.summary
    assert publish(model_dir, tmp_path / "published") is None
    assert not (tmp_path / "published").exists()


def test_the_published_checkpoint_is_the_chosen_variant_as_quantize_recorded_it(tmp_path, model_dir):
    assert report(model_dir, write_policy(tmp_path, max_tpot=100)).chosen == "small"
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


def test_a_variant_the_published_image_cannot_serve_is_not_published(tmp_path, tiny_model):
    """A rotated Linear with a bias (QuIP on Qwen2's q/k/v): served here only through the pipeline's vLLM
    plugin, which the image in docker-compose.yml and k8s.yaml lacks: refused in one line, nothing written."""
    import torch
    from safetensors.torch import save_file

    rotated = tmp_path / "rotated-source"
    shutil.copytree(tiny_model, rotated, ignore=shutil.ignore_patterns("manifest.json"))
    config = json.loads((rotated / "config.json").read_text())
    online = {"location": "input", "targets": ["Linear"], "ignore": ["lm_head"], "inverse": False}
    config["quantization_config"] = {
        "transform_config": {"config_groups": {"v": {"type": "random-hadamard", "head_dim": 64, "apply": [online]}}}
    }
    (rotated / "config.json").write_text(json.dumps(config))
    q_proj = "model.layers.0.self_attn.q_proj"  # a packed INT4 Linear and its bias, as compressed-tensors stores them
    save_file(
        {f"{q_proj}.weight_packed": torch.zeros(128, 16, dtype=torch.int32), f"{q_proj}.bias": torch.ones(128)},
        str(rotated / "model-rotated.safetensors"),
    )
    model_dir = tiny_model_dir(tmp_path, rotated)
    report(model_dir, write_policy(tmp_path, max_tpot=100))  # chooses small
    with pytest.raises(ConfigError) as e:
        publish(model_dir, tmp_path / "published")
    assert str(e.value).endswith(
        "/small: 1 rotated Linears have a bias (model.layers.0.self_attn.q_proj.bias, ...), which vLLM's transform "
        "method refuses (assert bias is None) unless this pipeline's vLLM plugin passes it on; the vllm/vllm-openai "
        "image docker-compose.yml and k8s.yaml run has no such plugin and would not start it: publish another "
        "variant (POLICY), or serve this one from this repository (PYTHONPATH=<repo> vllm serve)"
    )
    assert "\n" not in str(e.value) and not (tmp_path / "published").exists()


# ------------------------------------------------------------------ republishing, what publish shows
def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def link_outside(path: Path) -> None:
    """The file replaced by a symlink to a copy of it outside its folder: the same bytes, through a link
    that dangles in a copy of the folder (a PVC, an image)."""
    outside = path.parent.parent.parent / f"outside-{path.name}"
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)


def restate_decision(dest: Path) -> None:
    """manifest.json edited where no hash covers it: its files and sha256 as they were."""
    manifest = json.loads((dest / "manifest.json").read_text())
    (dest / "manifest.json").write_text(json.dumps({**manifest, "decision": "Publish it: trust me."}, indent=2))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda dest: flip_a_byte(dest / "model.safetensors"), "model.safetensors: sha256 differs from manifest.json"),
        (lambda dest: (dest / "SHA256SUMS").unlink(), "SHA256SUMS: missing"),
        (lambda dest: (dest / "notes.txt").write_text("x"), "notes.txt: not in manifest.json"),
        (
            lambda dest: link_outside(dest / "model.safetensors"),
            "model.safetensors: a symlink, not a regular file; a published folder holds the bytes themselves",
        ),
        (restate_decision, r"manifest.json: not the one these files publish \(edited\?\)"),
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
        match=f"already published with the same content, but the folder on disk is not what was "
        f"published \\({problem}\\); FORCE_PUBLISH=1 \\(--force\\) rewrites the folder$",
    ):
        publish(model_dir, out)
    assert sorted(p.name for p in dest.iterdir()) == damaged  # refused: nothing touched
    assert publish(model_dir, out, force=True) == dest
    assert verify_files(dest) == [] and (dest / "model.safetensors").read_bytes() == good
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert "trust me" not in (dest / "manifest.json").read_text()


def test_verify_published_refuses_a_symlink_in_one_line_naming_it(tmp_path, model_dir, capsys):
    from pipeline.publish.__main__ import main

    report(model_dir, write_policy(tmp_path, max_tpot=100))
    dest = publish(model_dir, tmp_path / "published")
    link_outside(dest / "model.safetensors")
    assert main(["verify", "--files-only", str(dest)]) == 1
    assert capsys.readouterr().err == (
        f"verify: {dest}/model.safetensors: a symlink, not a regular file; a published folder holds the bytes "
        "themselves\n"
    )


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
    rep["policy"]["file"] = str(policy_path)  # a report.json that records the policy's absolute path
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
