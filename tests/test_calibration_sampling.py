"""Calibration rows read from a data file are a sample drawn by the calibration set's seed
(pipeline/quantize/calibration_samples.py: calibration_texts): the same seed the same rows, another seed other rows, and
neither is simply the first num_samples rows. No quantizer needed: both environments."""

import json

from pipeline.quantize.calibration_samples import calibration_texts
from pipeline.schema import CalibSet

ROWS = 200
SAMPLES = 10


def picked(tmp_path, seed: int) -> list[int]:
    """The row numbers calibration_texts picks from a file whose row i has question q<i>."""
    data = tmp_path / "set/train.jsonl"
    if not data.is_file():
        data.parent.mkdir()
        data.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(ROWS)))
    calib = CalibSet(description="t", local_file="set/train.jsonl", num_samples=SAMPLES, max_seq_len=64, seed=seed)
    pairs, _ = calibration_texts(calib, str(tmp_path), "calib/t.yaml")
    rows = [int(question[1:]) for question, _ in pairs]
    assert [answer for _, answer in pairs] == [f"a{i}" for i in rows]  # each answer stays with its question
    return rows


def test_the_seed_decides_which_rows_calibrate(tmp_path):
    first = picked(tmp_path, seed=0)
    assert len(set(first)) == SAMPLES and first == sorted(first)  # distinct rows, in the file's order
    assert first != list(range(SAMPLES))  # a sample, not the head of the file
    assert picked(tmp_path, seed=0) == first
    assert picked(tmp_path, seed=1) != first
    assert picked(tmp_path, seed=1) == picked(tmp_path, seed=1)
