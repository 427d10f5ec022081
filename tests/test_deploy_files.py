"""The k8s and compose files make publish writes (the published folder's, and the pull deployment's under
deploy/), checked by the real tools where they are installed: kubernetes-validate --strict (PyPI; found
on PATH, as KUBERNETES_VALIDATE, or in a venv of this checkout's .venv-validate/) against the oldest and
newest Kubernetes schemas it ships that we claim, and `docker compose config` (the docker CLI's compose
plugin, or docker-compose). Each skips with the reason where its tool is absent."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.publish import compose_file, k8s_objects
from pipeline.publish.pull_deploy import compose_with_pull, k8s_with_pull
from pipeline.schema import Deployment
from pipeline.settings import ROOT

NAME, VERSION, URL = "tiny-bf16", "0123456789abcdef", "s3://models/published"
IMAGE = "vllm/vllm-openai:v0.26.0"
KUBERNETES = ("1.33.0", "1.37.0")


def kubernetes_validate() -> str | None:
    local = ROOT / ".venv-validate/bin/kubernetes-validate"
    return (
        os.environ.get("KUBERNETES_VALIDATE")
        or shutil.which("kubernetes-validate")
        or (str(local) if local.is_file() else None)
    )


def compose_cli() -> list[str] | None:
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) and subprocess.run([*command, "version"], capture_output=True).returncode == 0:
            return command
    return None


def written(tmp_path: Path) -> dict[str, Path]:
    """The four files as publish writes them: the folder's k8s.yaml and compose, and the pulling ones."""
    d = Deployment(replicas=2)
    objects, compose = k8s_objects(NAME, d, 1, image=IMAGE), compose_file(NAME, d, 1, image=IMAGE)
    files = {
        "k8s.yaml": yaml.safe_dump_all(objects, sort_keys=False),
        "docker-compose.yml": yaml.safe_dump(compose, sort_keys=False),
        "deploy-k8s.yaml": yaml.safe_dump_all(k8s_with_pull(objects, URL, NAME, VERSION, 3 * 2**30), sort_keys=False),
        "deploy-docker-compose.yml": yaml.safe_dump(compose_with_pull(compose, URL, NAME, VERSION), sort_keys=False),
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    return {rel: tmp_path / rel for rel in files}


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_k8s_files_pass_kubernetes_validate_strict(tmp_path, version):
    tool = kubernetes_validate()
    if tool is None:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate into .venv-validate/)")
    files = written(tmp_path)
    for rel in ("k8s.yaml", "deploy-k8s.yaml"):
        got = subprocess.run([tool, "--strict", "-k", version, str(files[rel])], capture_output=True, text=True)
        assert got.returncode == 0, f"{rel}: {got.stdout}{got.stderr}"
        assert "INFO" in got.stdout and "ERROR" not in got.stdout, got.stdout


def test_kubernetes_validate_rejects_what_strict_should(tmp_path):
    """The check can fail: an unknown key in the container is refused under --strict."""
    tool = kubernetes_validate()
    if tool is None:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate into .venv-validate/)")
    objects = k8s_objects(NAME, Deployment(), 1, image=IMAGE)
    objects[0]["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump_all(objects))
    got = subprocess.run([tool, "--strict", "-k", KUBERNETES[-1], str(tmp_path / "bad.yaml")], capture_output=True)
    assert got.returncode != 0


def test_the_compose_files_pass_docker_compose_config(tmp_path):
    command = compose_cli()
    if command is None:
        pytest.skip("no docker compose here (the docker CLI has no compose plugin and there is no docker-compose)")
    files = written(tmp_path)
    (tmp_path / "pull.py").write_text("")
    env = {**os.environ, "VLLM_API_KEY": "k", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"}
    for rel in ("docker-compose.yml", "deploy-docker-compose.yml"):
        got = subprocess.run([*command, "-f", str(files[rel]), "config", "-q"], capture_output=True, text=True, env=env)
        assert got.returncode == 0, f"{rel}: {got.stderr}"
