"""The k8s and compose files make publish writes (the published folder's, and the pull deployment's under
deploy/), checked by the real tools where they are installed: kubernetes-validate --strict (PyPI; found
on PATH, as KUBERNETES_VALIDATE, or in a venv of this checkout's .venv-validate/) against the oldest and
newest Kubernetes schemas it ships that we claim, and `docker compose config` (the docker CLI's compose
plugin, or docker-compose). Each skips with the reason where its tool is absent."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.publish.deploy_files import compose_file, k8s_objects
from pipeline.publish.publishing import deployment_files
from pipeline.publish.pull_deploy import compose_with_pull, k8s_with_pull, write_deploy
from pipeline.schema import Deployment, Policy
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
    (tmp_path / "puller").mkdir()
    env = {**os.environ, "VLLM_API_KEY": "k", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"}
    for rel in ("docker-compose.yml", "deploy-docker-compose.yml"):
        got = subprocess.run([*command, "-f", str(files[rel]), "config", "-q"], capture_output=True, text=True, env=env)
        assert got.returncode == 0, f"{rel}: {got.stderr}"


# ------------------------------------------------------------------------------------ object names
# Kubernetes' rule for a Service's name (RFC 1035 label), which the Deployment, PVC, Secrets and ConfigMap
# named after it then meet too; a compose service's name is checked by the same rule, as it is the same name.
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LONG = "x" * 57  # with "-bf16-a": a published name of 64 characters


def named_in_k8s(objects: list[dict]) -> dict[str, set[str]]:
    """Every name a k8s file gives (metadata.name, by kind) or refers to (claimName, secretKeyRef, secretRef,
    configMap, the app label and the selectors), as {what: names}."""
    names: dict[str, set[str]] = {}
    for o in objects:
        names.setdefault(o["kind"], set()).add(o["metadata"]["name"])
        names.setdefault("app label", set()).update(o["metadata"].get("labels", {}).values())
        spec = o.get("spec", {})
        if o["kind"] == "Service":
            names.setdefault("selector", set()).update(spec["selector"].values())
        if o["kind"] != "Deployment":
            continue
        pod = spec["template"]["spec"]
        names.setdefault("selector", set()).update(spec["selector"]["matchLabels"].values())
        names.setdefault("app label", set()).update(spec["template"]["metadata"]["labels"].values())
        for volume in pod["volumes"]:
            if "persistentVolumeClaim" in volume:
                names.setdefault("PVC", set()).add(volume["persistentVolumeClaim"]["claimName"])
            if "configMap" in volume:
                names.setdefault("ConfigMap used", set()).add(volume["configMap"]["name"])
        for container in pod["containers"] + pod.get("initContainers", []):
            for env in container.get("env", []):
                if "secretKeyRef" in env.get("valueFrom", {}):
                    names.setdefault("Secret", set()).add(env["valueFrom"]["secretKeyRef"]["name"])
            for source in container.get("envFrom", []):
                names.setdefault("Secret", set()).add(source["secretRef"]["name"])
    return names


def published_files(folder: Path, name: str, deploy_out: Path) -> dict[str, Path]:
    """The deployment files publish writes for a published folder of `name`: its own k8s.yaml and
    docker-compose.yml (deployment_files, as publish writes them), and the pulling ones (write_deploy)."""
    folder.mkdir(parents=True)
    policy = Policy(description="x", objective=[{"minimize": "weights_gib"}], deployment=Deployment(replicas=2))
    texts = deployment_files(name, "bf16", policy, {"tensor-parallel-size": 1}, None, (IMAGE, "the test's"))
    for rel, text in texts.items():
        (folder / rel).write_text(text)
    deploy = write_deploy(folder, deploy_out, URL, name, VERSION)
    return {
        "k8s.yaml": folder / "k8s.yaml",
        "docker-compose.yml": folder / "docker-compose.yml",
        "deploy/k8s.yaml": deploy / "k8s.yaml",
        "deploy/docker-compose.yml": deploy / "docker-compose.yml",
        "deploy/README.md": deploy / "README.md",
    }


def k8s_documents(path: Path) -> list[dict]:
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


def every_name(files: dict[str, Path]) -> set[str]:
    """Every name the k8s files give or refer to, and the compose files' server service."""
    names = set()
    for rel in ("k8s.yaml", "deploy/k8s.yaml"):
        names |= set().union(*named_in_k8s(k8s_documents(files[rel])).values())
    for rel in ("docker-compose.yml", "deploy/docker-compose.yml"):
        names |= set(yaml.safe_load(files[rel].read_text())["services"]) - {"pull"}
    return names


def name_problems(files: dict[str, Path]) -> list[str]:
    """What is wrong with the names in the files published_files lists: each name an RFC 1035 label of at
    most 63 characters, the Service selecting the Deployment's pods, the ConfigMap used being in the file, and
    the PVC and Secrets referred to being the ones the header comment (and the README) tell to create."""
    problems = []
    for rel in ("k8s.yaml", "deploy/k8s.yaml"):
        names = named_in_k8s(k8s_documents(files[rel]))
        if not names["selector"] == names["app label"] == names["Deployment"]:
            problems.append(f"{rel}: selectors {names['selector']}, labels {names['app label']}")
        if names.get("ConfigMap used", set()) - names.get("ConfigMap", set()):
            problems.append(f"{rel}: uses ConfigMap {names['ConfigMap used']}, has {names.get('ConfigMap')}")
        header = files[rel].read_text().splitlines()[0]
        told = set(re.findall(r"(?:PVC|secret) ([^\s,)]+)", header))
        if missing := (names.get("PVC", set()) | names["Secret"]) - told:
            problems.append(f"{rel}: refers to {missing}, its header tells to create {told}")
    every = every_name(files)
    created = set(re.findall(r"kubectl create secret generic (\S+)", files["deploy/README.md"].read_text()))
    if not created or created - every:
        problems.append(f"deploy/README.md: creates secrets {created}, the files use {every}")
    invalid = sorted(n for n in every if len(n) > 63 or not DNS_1035.fullmatch(n))
    return problems + [f"{n!r}: not an RFC 1035 label of at most 63 characters" for n in invalid]


@pytest.mark.parametrize(
    "name",
    [
        "tiny-bf16",
        "7b-chat-bf16",  # a model folder starting with a digit
        f"{LONG}-bf16-a",  # 64 characters
        f"1{LONG}-fp8-dynamic",  # both
        "Qwen2.5-7B-Instruct-gptq-w4a16",  # capitals and a dot
        "x" * 54,  # the longest that takes every suffix as it is
        "x" * 55,
        "___-bf16",  # nothing left of the folder's name
    ],
)
def test_every_name_in_the_published_deployment_files_is_a_valid_kubernetes_name(tmp_path, name):
    files = published_files(tmp_path / name, name, tmp_path / "deploy")
    assert name_problems(files) == []


@pytest.mark.parametrize(
    "a, b",
    [
        (f"{LONG}-bf16-a", f"{LONG}-bf16-b"),  # differ only past the cut
        ("Qwen2.5-7B-bf16", "qwen2-5-7b-bf16"),  # differ only in what a name may not hold
        ("7b-bf16", "m-7b-bf16"),  # the letter put first does not make one the other
    ],
)
def test_two_variants_never_share_a_kubernetes_name(tmp_path, a, b):
    names_a = every_name(published_files(tmp_path / "a" / a, a, tmp_path / "deploy-a"))
    names_b = every_name(published_files(tmp_path / "b" / b, b, tmp_path / "deploy-b"))
    assert names_a and names_b and not names_a & names_b


def test_a_short_valid_name_is_kept_as_it_is(tmp_path):
    files = published_files(tmp_path / "tiny-bf16", "tiny-bf16", tmp_path / "deploy")
    assert every_name(files) == {"tiny-bf16", "tiny-bf16-api-key", "tiny-bf16-pull", "tiny-bf16-registry"}


def test_the_publish_stage_writes_valid_distinct_names_for_long_models_starting_with_a_digit(tmp_path, tiny_model):
    """The publish stage itself (publish()), for two 64-character model folders that start with a digit and
    differ only in their last character; then the pulling files made from each published folder."""
    pytest.importorskip("matplotlib")  # the report's plots
    from pipeline.publish.publishing import publish
    from pipeline.report.assemble import report

    from report_inputs import tiny_model_dir, write_policy

    names = []
    for last in "ab":
        model_dir = tiny_model_dir(tmp_path, tiny_model, model=f"7{'x' * 62}{last}")
        report(model_dir, write_policy(tmp_path, max_tpot=55, max_drop=0.0))  # bf16 qualifies
        dest = publish(model_dir, tmp_path / "published")
        deploy = write_deploy(dest, tmp_path / "deploy", URL, dest.name, VERSION)
        files = {rel: dest / rel for rel in ("k8s.yaml", "docker-compose.yml")}
        files |= {f"deploy/{rel}": deploy / rel for rel in ("k8s.yaml", "docker-compose.yml", "README.md")}
        assert name_problems(files) == []
        assert dest.name.endswith(f"{last}-bf16") and len(dest.name) == 69
        names.append(every_name(files))
    assert not names[0] & names[1]
