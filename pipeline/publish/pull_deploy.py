"""The deployment files that pull what `make publish REGISTRY=...` uploaded, written to <OUT>/deploy/<name>/ rather
than into the published folder (a file cannot hold the hash of the folder it is part of): k8s.yaml with an
initContainer that runs the puller (pipeline/publish/puller/) into the pod's model volume before vLLM starts,
docker-compose.yml with a one-shot pull service the server waits for. Credentials come from a Secret / the
environment, never from a file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from pipeline.publish import puller
from pipeline.publish.deploy_files import API_KEY_SECRET, PULL_CONFIG_MAP, REGISTRY_SECRET
from pipeline.staging import staging_dir

PULLER_FOLDER = "puller"  # beside the deployment files, and at /pull in a pod or container
PULL_MOUNT = "/model-store"  # where the pull step sees the model volume; vLLM sees one version of it at /model


def shipped_puller() -> dict[str, str]:
    """The puller's modules a deployment carries, by file name."""
    return {p.name: p.read_text() for p in sorted(puller.FOLDER.glob("*.py")) if p.name != "__init__.py"}


def pull_command(url: str, name: str, version: str) -> list[str]:
    return ["python3", "/pull", url, "--name", name, "--version", version, "--into", f"{PULL_MOUNT}/{version}"]


def k8s_with_pull(objects: list[dict], url: str, name: str, version: str, size_bytes: int) -> list[dict]:
    """The published k8s objects with the model volume filled by an initContainer that pulls and verifies
    the version (vLLM starts only after it exits 0); the puller's modules from a ConfigMap, credentials from a
    Secret."""
    objects = json.loads(json.dumps(objects))
    deployment = next(o for o in objects if o.get("kind") == "Deployment")
    app = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    for mount in vllm["volumeMounts"]:
        if mount["name"] == "model":
            mount["subPath"] = version  # vLLM sees exactly the pulled version at /model
    limit = f"{math.ceil(size_bytes * 1.1 / 2**30) + 1}Gi"  # the version, and room for the pull's temporary folder
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "model"] + [
        {"name": "model", "emptyDir": {"sizeLimit": limit}},
        {"name": "puller", "configMap": {"name": app + PULL_CONFIG_MAP}},
    ]
    pod["initContainers"] = [
        {
            "name": "pull",
            "image": vllm["image"],  # has python3; the puller needs nothing else
            "command": pull_command(url, name, version),
            # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, where needed, AWS_ENDPOINT_URL, AWS_REGION
            "envFrom": [{"secretRef": {"name": app + REGISTRY_SECRET}}],
            "volumeMounts": [
                {"name": "model", "mountPath": PULL_MOUNT},
                {"name": "puller", "mountPath": "/pull", "readOnly": True},
            ],
        }
    ]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": app + PULL_CONFIG_MAP, "labels": {"app": app}},
        "data": shipped_puller(),
    }
    return [config_map, *objects]


def compose_with_pull(compose: dict, url: str, name: str, version: str) -> dict:
    """The published compose file with a one-shot pull service into a named volume; the server starts after
    it completes successfully and serves that version read-only."""
    compose = json.loads(json.dumps(compose))
    (service,) = compose["services"]  # the one server the published file has
    server = compose["services"][service]
    server["volumes"] = [v for v in server["volumes"] if not v.endswith(":/model:ro")] + ["model:/model:ro"]
    server["working_dir"] = f"/model/{version}"
    server["command"] = [f"/model/{version}/serve.yaml" if a == "/model/serve.yaml" else a for a in server["command"]]
    server["depends_on"] = {"pull": {"condition": "service_completed_successfully"}}
    env = {k: f"${{{k}:?set {k}}}" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env |= {k: f"${{{k}:-}}" for k in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION")}
    pull = {
        "image": server["image"],
        "entrypoint": pull_command(url, name, version)[:2],
        "command": pull_command(url, name, version)[2:],
        "volumes": [f"./{PULLER_FOLDER}:/pull:ro", f"model:{PULL_MOUNT}"],
        "environment": env,
        "restart": "no",
    }
    return {**compose, "services": {"pull": pull, **compose["services"]}, "volumes": {"model": {}}}


def write_deploy(folder: Path, out: Path, url: str, name: str, version: str) -> Path:
    """<out>/<name>/: k8s.yaml, docker-compose.yml, the puller's folder and a README, made from the published folder's
    own deployment files; replaced whole on every publish (they follow the version, which is immutable)."""
    dest = out / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    objects = [o for o in yaml.safe_load_all((folder / "k8s.yaml").read_text()) if o]
    compose = yaml.safe_load((folder / "docker-compose.yml").read_text())
    app = next(o for o in objects if o.get("kind") == "Deployment")["metadata"]["name"]
    with staging_dir(dest) as tmp:
        (tmp / "k8s.yaml").write_text(
            f"# {name}, version {version} from {url}: kubectl apply -f k8s.yaml (registry credentials in secret "
            f"{app + REGISTRY_SECRET}, API key in secret {app + API_KEY_SECRET})\n"
            + yaml.safe_dump_all(k8s_with_pull(objects, url, name, version, size), sort_keys=False)
        )
        (tmp / "docker-compose.yml").write_text(
            f"# {name}, version {version} from {url}: `docker compose up` from this folder, with "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a store other than AWS) set\n"
            + yaml.safe_dump(compose_with_pull(compose, url, name, version), sort_keys=False)
        )
        (tmp / PULLER_FOLDER).mkdir()
        for module, text in shipped_puller().items():
            (tmp / PULLER_FOLDER / module).write_text(text)
        (tmp / "README.md").write_text(
            f"# {name} from {url}, version {version}\n\n"
            "Deployment files that pull the published version and verify every file (SHA256SUMS, manifest.json)\n"
            "before vLLM starts; a tampered or missing object stops the pull and nothing is served.\n\n"
            "```bash\n"
            f"kubectl create secret generic {app + REGISTRY_SECRET} --from-literal=AWS_ACCESS_KEY_ID=... \\\n"
            "  --from-literal=AWS_SECRET_ACCESS_KEY=... [--from-literal=AWS_ENDPOINT_URL=...]\n"
            f"kubectl create secret generic {app + API_KEY_SECRET} --from-literal=api-key=$VLLM_API_KEY\n"
            "kubectl apply -f k8s.yaml\n"
            "docker compose up                    # AWS_* and VLLM_API_KEY in the environment\n"
            f"python3 {PULLER_FOLDER} {url} --name {name} --version {version} --into DIR   # by hand\n"
            "```\n"
        )
    return dest
