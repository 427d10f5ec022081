"""The stage files make report and make publish read, for their tests: three variants of the tiny model
with made-up figures (a test of the rules, not a measurement), and a policy over them."""

import json
import shutil
from pathlib import Path

import yaml

from pipeline.checkpoint_files import file_hashes, size_on_disk
from pipeline.identity import tree_hash

from stage_files import bench_record, eval_report, identity, variant_manifest


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
        recipe={
            "file": f"recipes/{name}.yaml",
            "description": f"{name} for the test",
            "method": "bf16",
            "backend": "transformers",
        },
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


def tiny_model_dir(tmp_path: Path, tiny_model: Path, model: str = "tiny") -> Path:
    """Three variants of the tiny model (bf16, small, slow) with a bench.json each and an eval-report, in
    artifacts/<model>/."""
    model_dir = tmp_path / "artifacts" / model
    make_variant(model_dir, "bf16", tiny_model, "reasoning", 0.5, 50)
    make_variant(model_dir, "small", tiny_model, "bf16", 0.2, 60, shift=0.25)
    make_variant(model_dir, "slow", tiny_model, "bf16", 0.1, 500, shift=0.5)
    metric = "synthetic-rc:f1"
    (model_dir / "eval-report.json").write_text(
        json.dumps(
            eval_report(
                model,
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
