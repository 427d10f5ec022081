"""The published folder to REGISTRY: an S3 store (registry.upload), then the deployment files that pull it
(pull_deploy.write_deploy), or a Hugging Face model repository (hub.upload_hub). What `make publish
REGISTRY=...` runs once the folder is written."""

from __future__ import annotations

from pathlib import Path

from pipeline.publish.pull_deploy import write_deploy
from pipeline.publish.registry import parse_registry, upload


def check_registry(url: str) -> None:
    """A wrong REGISTRY is one line before any work: s3://bucket/prefix or hf://org/name."""
    if url.startswith("hf://"):
        from pipeline.publish.hub import parse_hub

        parse_hub(url)
    else:
        parse_registry(url)


def upload_to(
    folder: Path, url: str, alias: str = "latest", multipart_mb: int = 64, repair: bool = False
) -> tuple[str, str, str]:
    """The published folder to REGISTRY: an S3 store (registry.upload; with repair, a damaged object of an
    existing version is uploaded again), or a Hub repository (hub.upload_hub); returns (name, version, where)."""
    if url.startswith("hf://"):
        from pipeline.publish.hub import upload_hub

        return upload_hub(folder, url)
    return upload(folder, url, alias, multipart_mb, repair=repair)


def publish_to_registry(
    folder: Path,
    url: str,
    deploy_out: Path | None = None,
    alias: str = "latest",
    multipart_mb: int = 64,
    repair: bool = False,
) -> Path | None:
    """Upload; for an S3 store then the deployment files that pull what was uploaded (the puller speaks S3:
    a Hub repository is pulled by the Hub's own clients, so none are written for hf://)."""
    name, version, where = upload_to(folder, url, alias, multipart_mb, repair)
    if not url.startswith("s3://"):
        print(f"{where}: revision {version}; no pulling deployment files for {url.split(':')[0]}://", flush=True)
        return None
    deploy = write_deploy(folder, deploy_out or folder.parent.parent / "deploy", url, name, version)
    print(f"version {version}; deployment files that pull it: {deploy}/ (k8s.yaml, docker-compose.yml)", flush=True)
    return deploy
