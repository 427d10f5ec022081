"""make report of variants not yet benched (make eval, then make report, as the README's quicker runs do) is
quiet: matplotlib's "No artists with labels found to put in legend" was two lines of noise on stderr (issue 42,
held-out member of 'noise')."""

import json
import warnings

import pytest

pytest.importorskip("matplotlib")

from pipeline.report.assemble import report  # noqa: E402

from report_inputs import make_variant, write_policy  # noqa: E402
from stage_files import eval_report, identity  # noqa: E402


def test_a_report_of_a_variant_without_bench_json_warns_nothing(tmp_path, tiny_model):
    model_dir = tmp_path / "artifacts/tiny"
    make_variant(model_dir, "bf16", tiny_model, "bf16", 0.5, 50)
    (model_dir / "bf16/bench.json").unlink()  # evaluated, not benched
    figures = {"bf16": {"synthetic-rc:f1": {"mean": 0.3, "ci95": [0.25, 0.35]}}}
    built = {"bf16": identity(json.loads((model_dir / "bf16/manifest.json").read_text()))}
    (model_dir / "eval-report.json").write_text(json.dumps(eval_report(model_dir.name, figures, identities=built)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        report(model_dir, write_policy(tmp_path, max_tpot=100))
    assert (model_dir / "report.md").is_file() and (model_dir / "plots").is_dir()
