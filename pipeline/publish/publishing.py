"""make publish: the variant report.json chose, checked against its manifest and against what the report
measured, written as one folder (checkpoint, serve.yaml, compose, k8s, model card, SHA256SUMS, manifest)
in a staging folder and renamed into place. Publishing is immutable: the same content again is a no-op,
other content is refused unless forced."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from pipeline.artifacts import (
    RANDOM_WEIGHTS_BANNER,
    read_bench,
    read_eval_run,
    read_manifest,
    read_report,
    read_variant_manifest,
)
from pipeline.checkpoint_files import file_hashes, sha256_file
from pipeline.drift import check_unchanged, figure_inputs, report_inputs
from pipeline.identity import RERUN, stale_figures, tree_hash, variant_identity
from pipeline.policy import policy_file_label
from pipeline.publish.deploy_files import (
    API_KEY_SECRET,
    VLLM_IMAGE,
    compose_file,
    dns_name,
    k8s_objects,
    serving_image,
)
from pipeline.publish.load_test import stated_capacity
from pipeline.publish.model_card import model_card
from pipeline.publish.serve_yaml import (
    MeasuredCapacity,
    capacity_sentence,
    measured_capacity,
    replica_count,
    serve_config,
)
from pipeline.publish.verify import file_problems
from pipeline.schema import Bench, ConfigError, Identity, Policy, Report, VariantManifest
from pipeline.staging import staging_dir, write_json
from pipeline.vllm_plugins import stock_vllm_problem


class _Unchanged(Exception):
    pass


def check_figures(model_dir: Path, report: Report, variant: str, identity: Identity) -> None:
    """Every figure the report used for `variant` (and, under an accuracy rule, the baseline's figures its
    deltas are against) was measured on the checkpoint now on disk; a one-line ConfigError naming the
    stage to run again where one was not."""
    path = model_dir / "report.json"
    names = [variant]
    if report.policy.accuracy and report.policy.baseline != variant:
        names.append(report.policy.baseline)
    for name in names:
        reported = report.variants.get(name)  # a baseline the report did not collect
        if reported is None or reported.measured_on is None:
            raise ConfigError(
                f"{path}: does not record which checkpoint of {name} its figures were measured on (written before "
                "it did); run `make report` again"
            )
        current = identity if name == variant else variant_identity_of(model_dir / name)
        for source, measured in reported.measured_on.items():
            if problem := stale_figures(
                f"{source} (as {path.name} used it)", measured, model_dir / name, current, RERUN[source].format(name)
            ):
                raise ConfigError(problem)


def variant_identity_of(folder: Path) -> Identity | None:
    manifest = read_variant_manifest(folder)
    return None if manifest is None else variant_identity(manifest)


def checked_variant(model_dir: Path, report: Report, variant: str) -> tuple[VariantManifest, Bench | None]:
    """(manifest, bench.json) of the chosen variant, after every check that it is what the report measured:
    files hashed against the manifest, the same checkpoint, figures and bench.json of these files, not
    random weights (unless the policy rehearses)."""
    folder = model_dir / variant
    # every file hashed against the manifest: a changed byte is never published (files added beside the
    # checkpoint later, bench.json and eval/, are not part of it)
    manifest = read_variant_manifest(folder, verify="hashes")
    if manifest is None:
        raise ConfigError(f"{folder}: gone since the report was made; run `make report` again")
    identity = variant_identity(manifest)
    eval_run, bench = read_eval_run(folder), read_bench(folder)[0]
    # what serve.yaml, the model card and the decision rest on, as the files they were made from say now
    check_unchanged(figure_inputs(folder, manifest, eval_run, bench))
    if identity.checkpoint_sha256 != report.variants[variant].checkpoint_sha256:
        raise ConfigError(f"{folder}: rebuilt since {model_dir / 'report.json'} was made; run `make report` again")
    check_figures(model_dir, report, variant, identity)
    if manifest.random_weights and not report.policy.rehearsal:
        raise ConfigError(
            f"{folder}: {RANDOM_WEIGHTS_BANNER}; refusing to publish it (a policy with `rehearsal: true` "
            "publishes random weights to try the serving files)"
        )
    if problem := stock_vllm_problem(folder):
        raise ConfigError(
            f"{folder}: {problem}; the {VLLM_IMAGE} image docker-compose.yml and k8s.yaml run has no such plugin "
            "and would not start it: publish another variant (POLICY), or serve this one from this repository "
            "(PYTHONPATH=<repo> vllm serve)"
        )
    # serve.yaml's settings are sized from bench.json: it must be of these files
    if bench is not None and (
        problem := stale_figures("bench.json", bench.identity, folder, identity, RERUN["bench.json"].format(variant))
    ):
        raise ConfigError(problem)
    return manifest, bench


def deployment_files(
    name: str, variant: str, policy: Policy, cfg: dict, measured: MeasuredCapacity | None, image: tuple[str, str]
) -> dict:
    """docker-compose.yml and k8s.yaml's text, each saying where its replica count and image came from."""
    d = policy.deployment
    replicas, replicas_why = replica_count(measured, d, variant)
    tp = cfg["tensor-parallel-size"]
    why = f"# replicas {replicas}: {replicas_why}\n# image {image[0]}: {image[1]}\n"
    compose = yaml.safe_dump(compose_file(name, d, tp, replicas, image[0]), sort_keys=False)
    k8s = yaml.safe_dump_all(k8s_objects(name, d, tp, replicas, image[0]), sort_keys=False)
    return {
        "docker-compose.yml": f"# {name}: `docker compose up` from this folder, VLLM_API_KEY set.\n{why}{compose}",
        "k8s.yaml": f"# {name}: kubectl apply -f k8s.yaml (model files in PVC {dns_name(name)}, "
        f"API key in secret {dns_name(name) + API_KEY_SECRET})\n{why}{k8s}",
    }


def write_folder(tmp: Path, folder: Path, manifest: VariantManifest, texts: dict[str, str], about: dict) -> dict:
    """The checkpoint, build-manifest.json, `texts` (file -> content), SHA256SUMS and manifest.json in
    `tmp`; returns manifest.json's `files`."""
    for rel in manifest.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        # not the mode: safetensors writes 0600, a container user must read it
        shutil.copyfile(folder / rel, tmp / rel)
    shutil.copyfile(folder / "manifest.json", tmp / "build-manifest.json")
    for rel, text in texts.items():
        (tmp / rel).write_text(text)
    sums = file_hashes(tmp)
    (tmp / "SHA256SUMS").write_text("".join(f"{h}  {rel}\n" for rel, h in sums.items()))
    files = dict(sorted({**sums, "SHA256SUMS": sha256_file(tmp / "SHA256SUMS")}.items()))
    write_json(tmp / "manifest.json", {**about, "sha256": tree_hash(files), "files": files})
    return files


def compare_with_published(dest: Path, staged: Path, files: dict, force: bool) -> None:
    """Raises _Unchanged where `dest` holds what publish just wrote in `staged` (checked on disk, not only
    its manifest), a ConfigError where it holds something else (unless force)."""
    old = read_manifest(dest)
    if old is not None and old.get("files") == files:
        # Same file list: the folder on disk decides. A flipped byte in a published checkpoint leaves
        # manifest.json as it was, a symlink to the right bytes is not the bytes (a copy of the folder
        # gets a dangling link), and what manifest.json states besides the hashes (its sha256, the
        # decision, the stated capacity) is in no hash.
        damaged = [p.removeprefix(f"{dest}/") for p in file_problems(dest, files)]
        if (dest / "manifest.json").read_bytes() != (staged / "manifest.json").read_bytes():
            damaged.append("manifest.json: not the one these files publish (edited?)")
        if not damaged:
            raise _Unchanged()
        if not force:
            raise ConfigError(
                f"{dest}: already published with the same content, but the folder on disk is not what was "
                f"published ({'; '.join(damaged)}); FORCE_PUBLISH=1 (--force) rewrites the folder"
            )
    elif dest.exists() and not force:
        changed = sorted(set(old.get("files", {}).items()) ^ set(files.items())) if old else []
        raise ConfigError(
            f"{dest}: already published with other content "
            f"({', '.join(sorted({k for k, _ in changed})) or 'unreadable manifest'}); "
            "published folders are immutable: FORCE_PUBLISH=1 (--force) replaces it"
        )


def publish(
    model_dir: Path, out: Path, force: bool = False, base_model: str | None = None, license_: str | None = None
) -> Path | None:
    """The published folder of the variant report.json chose; None where nothing qualified."""
    report = read_report(model_dir)
    check_unchanged(report_inputs(model_dir, report))  # a policy edited since would choose anew
    decision = report.decision
    if decision.chosen is None:
        return None
    variant = decision.chosen
    folder, name = model_dir / variant, f"{model_dir.name}-{variant}"
    manifest, bench = checked_variant(model_dir, report, variant)
    policy = report.policy
    eval_run = read_eval_run(folder)
    image = serving_image(
        policy.deployment,
        [
            (f"{variant}/bench.json", bench and bench.packages),
            (f"{variant}/eval/results.json", eval_run and eval_run.packages),
        ],
        f"{model_dir}/",
    )
    cfg, header = serve_config(folder, name, manifest, bench, policy.deployment)
    measured = measured_capacity(bench, policy.deployment, folder)
    card = model_card(name, variant, manifest, report, cfg, base_model, license_, capacity_sentence(measured))
    texts = {"serve.yaml": header + yaml.safe_dump(cfg, sort_keys=False)}
    texts |= deployment_files(name, variant, policy, cfg, measured, image) | {"README.md": card}
    about = {
        "name": name,
        "model": model_dir.name,
        "variant": variant,
        "checkpoint_sha256": manifest.sha256,
        "policy": policy_file_label(report.policy.file),
        "decision": decision.summary,
        "stated_capacity": stated_capacity(measured),  # what verify-published loads the server at
    }
    dest = out / name
    try:
        with staging_dir(dest, needs=manifest.size_bytes) as tmp:  # the checkpoint; the other files are small
            compare_with_published(dest, tmp, write_folder(tmp, folder, manifest, texts, about), force)
        print(f"published {dest}")
    except _Unchanged:
        print(f"{dest}: already published with the same content; nothing to do")
    return dest
