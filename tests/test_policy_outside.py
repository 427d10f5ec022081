"""A policy outside the repository (POLICY=/elsewhere/p.yaml) edited after make report is noticed by make
publish, naming the file (issue 42, held-out member of 'drift'): the report records such a policy by its name
alone, so the check looked for it in the repository, found nothing, and let a decision of another policy be
published."""

import os
import subprocess

import pytest

from pipeline.settings import ROOT

pytest.importorskip("matplotlib")

from report_inputs import make_variant, write_policy  # noqa: E402
from stage_files import eval_report, identity  # noqa: E402


def test_make_publish_refuses_a_policy_outside_the_repository_edited_since_the_report(tmp_path, tiny_model):
    import json

    from pipeline.report.assemble import report

    out = tmp_path / "out"
    model_dir = out / "tiny"
    make_variant(model_dir, "bf16", tiny_model, "bf16", 0.5, 50)
    figures = {"bf16": {"synthetic-rc:f1": {"mean": 0.3, "ci95": [0.25, 0.35]}}}
    built = {"bf16": identity(json.loads((model_dir / "bf16/manifest.json").read_text()))}
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report(model_dir.name, figures, identities=built)))
    (tmp_path / "elsewhere").mkdir()
    policy = write_policy(tmp_path / "elsewhere", max_tpot=100)
    report(model_dir, policy)
    assert write_policy(tmp_path / "elsewhere", max_tpot=100, max_drop=0.5) == policy  # edited since
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    argv = ["make", "--no-print-directory", "publish", f"MODEL=org/{model_dir.name}", f"OUT={out}", f"POLICY={policy}"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"publish: {policy}: accuracy.max_drop is 0.5, but "), lines
    assert lines[0].endswith(f"run `make report POLICY={policy}` again"), lines[0]
    assert not (out / "published").exists()
