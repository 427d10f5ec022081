"""make eval (pipeline/evaluate/: generate, score, run): one engine call for every suite, no answer counted into
the eval report, the fidelity prompt in chat format, the fidelity arrays from vLLM's prompt log-probabilities,
a killed run cleaning up, data parallel, and a tiny model evaluated end to end in vLLM (that one runs where
vLLM is: .venv-serve)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from pipeline.data import load_items
from pipeline.evaluate.compare import compare, markdown_table
from pipeline.evaluate.options import EvalSettings
from pipeline.evaluate.plan import build_prompts, check_variant, settings_for
from pipeline.evaluate.run import evaluate
from pipeline.schema import ConfigError, EvalReport, load_suite
from pipeline.settings import ROOT
from pipeline.staging import remove_stale

from stage_files import eval_results, write_manifest


class FakeClient:
    """The completions client, answering each prompt with a fixed completion (text, finish_reason)."""

    def __init__(self, outputs):
        self.outputs = outputs

    def complete(self, requests):
        from pipeline.openai_client import Completion

        return [Completion(t, [0] * len(t.split()), f) for t, f in self.outputs]


class RecordingClient:
    """The completions client, recording each batch and answering request i with 'out <seed> <token id>'."""

    def __init__(self):
        self.calls = []

    def complete(self, requests):
        from pipeline.openai_client import Completion

        self.calls.append(requests)
        return [Completion(f"out {r.seed} {r.prompt[0]}", [0], "stop") for r in requests]


def test_every_suite_and_seed_goes_to_the_engine_in_one_call(monkeypatch, tmp_path):
    from pipeline.evaluate.generate import generate_all
    from pipeline.schema import Generation

    client = RecordingClient()
    jobs = {
        "math": ([[1], [2], [3]], Generation(temperature=0.6, seeds=[0, 1])),
        "rc": ([[7], [8]], Generation(max_tokens=9)),
    }
    outputs, wall = generate_all(client, jobs)
    assert len(client.calls) == 1 and len(client.calls[0]) == 3 * 2 + 2  # one batch: the engine stays full
    assert [r.seed for r in client.calls[0]] == [0, 0, 0, 1, 1, 1, 0, 0]  # each request its own seed
    # and every output goes back to its suite, seed and item
    assert [o.text for o in outputs["math"][1]] == ["out 1 1", "out 1 2", "out 1 3"]
    assert [o.text for o in outputs["rc"][0]] == ["out 0 7", "out 0 8"]
    assert client.calls[0][-1].max_tokens == 9 and wall >= 0


def test_no_answer_is_counted_per_suite_and_carried_into_the_eval_report(tmp_path, monkeypatch):
    pytest.importorskip("math_verify")  # the MATH metric compares answers with it
    from pipeline.evaluate.score import ScoredSuite, run_generation_suite

    path = tmp_path / "math.yaml"
    path.write_text(
        "description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{question}'\n"
        "metric: exact_match_math\n"
    )
    suite = load_suite(path)
    rows = [{"question": "Evaluate $(1+2i)6-3i$.", "answer": "6+9i"}] * 3
    cut_off = "To evaluate $(1+2i)6-3i$, we first distribute ... "  # no box: no answer
    outputs = [(cut_off, "length"), ("\\boxed{6+9i}", "stop"), ("It is $6+9i$.", "stop")]
    model_dir = tmp_path / "tiny"
    for variant in ("bf16", "int4"):
        (model_dir / variant / "eval").mkdir(parents=True)
        gen = settings_for(suite, False, EvalSettings())
        scored = ScoredSuite(suite, rows, ["q"] * 3, [[1]] * 3, gen, reasoning=False)
        r = run_generation_suite(FakeClient(outputs), scored, model_dir / variant / "eval/samples_math.jsonl")
        assert (r["truncated"], r["no_answer"], r["metrics"]["exact_match"]["mean"]) == (1, 2, pytest.approx(1 / 3))
        r.update(file=str(path), n_available=3, metric=suite.metric)
        (model_dir / variant / "eval/results.json").write_text(json.dumps(eval_results("m", variant, {"math": r})))
    records = [json.loads(l) for l in (model_dir / "int4/eval/samples_math.jsonl").read_text().splitlines()]
    assert [r["no_answer"] for r in records] == [True, False, True]
    assert [r["extracted"] for r in records] == [None, "6+9i", None]
    report = compare(model_dir, "bf16").model_dump(exclude_unset=True)
    assert report["variants"]["int4"]["math:exact_match"]["no_answer"] == 2
    written = json.loads((model_dir / "eval-report.json").read_text())
    assert written["variants"]["bf16"]["math:exact_match"]["no_answer"] == 2
    md = (model_dir / "eval-report.md").read_text()
    assert "| trunc | no answer |" in md and "| 3 | 1 | 2 | +0.000 |" in md
    report["variants"]["int4"]["math:exact_match"]["no_answer"] = None  # results that do not count it
    assert "| 3 | 1 | — | +0.000 |" in markdown_table(EvalReport.model_validate(report))


def test_fidelity_in_chat_format_scores_the_conversation_as_the_template_writes_it(embedded_source, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_source)
    suite = load_suite(ROOT / "eval/fidelity-synthetic-chat.yaml")
    rows = load_items(suite, None, "s", 2)
    plain = load_suite(ROOT / "eval/fidelity-synthetic.yaml")
    assert rows == load_items(plain, None, "s", 2)  # fidelity-synthetic's items, in another format
    texts, ids = build_prompts(suite, rows, tok, False, "s")
    turns = [{"role": "user", "content": rows[0]["question"]}, {"role": "assistant", "content": rows[0]["answer"]}]
    assert ids[0] == tok.apply_chat_template(turns, tokenize=True, return_dict=False)
    assert texts[0].endswith(rows[0]["answer"] + "<|im_end|>\n")
    path = tmp_path / "f.yaml"
    base = "description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: '{question}'\ngold_field: null\n"
    path.write_text(base + "metric: fidelity\n")  # chat_template defaults to true
    with pytest.raises(ConfigError, match=r"f.yaml: response: a fidelity suite in chat format needs"):
        load_suite(path)
    path.write_text(base.replace("gold_field: null\n", "") + "metric: exact_match_numeric\nresponse: '{answer}'\n")
    with pytest.raises(ConfigError, match=r"f.yaml: response: only a fidelity suite with chat_template: true"):
        load_suite(path)


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.evaluate", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_folder_that_is_not_a_checkpoint_fails_before_generation(tmp_path):
    (tmp_path / "v").mkdir()
    proc = run_cli("run", tmp_path / "v", "--suites", ROOT / "eval/synthetic-math.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'v'}: not a checkpoint (needs config.json and *.safetensors); "
        "point at a variant made by `make quantize`"
    ]


# ----------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="session")
def embedded_source():
    # The serve environment has no gguf reader: use the source `make source` built (make test does it first).
    built = ROOT / "artifacts/sources/smollm2-135m-instruct"
    if not (built / "manifest.json").is_file():
        pytest.skip("run `make source` first (the eval tests run in .venv-serve, which cannot read the GGUF)")
    return built


SUITES = {
    "math": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 6\nprompt: '{question}'\n"
    "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\ngeneration: {max_tokens: 12}\n",
    "math-sampled": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 4\nprompt: '{question}'\n"
    "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\n"
    "generation: {temperature: 0.6, top_p: 0.95, max_tokens: 8, seeds: [0, 1]}\n",
    "rc": "description: x\ngenerator: reading-passages\nnum_items: 6\nprompt: '{context} {question}'\n"
    "gold_field: answers\nmetric: squad\ngeneration: {max_tokens: 8}\n",
    "held-out": 'description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: "{question}\\n{answer}"\n'
    "chat_template: false\ngold_field: null\nmetric: fidelity\ntop_logprobs: 5\n",
}


@pytest.mark.e2e  # starts vLLM: minutes, not seconds
@pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (.venv-serve)")
def test_end_to_end_tiny_model_two_identical_variants(tiny_model, tmp_path):
    """The tiny random model scored twice, as bf16 and as an identical copy: every figure must agree,
    every delta be zero and not significant, KLD zero and top-1 agreement one."""
    model_dir = tmp_path / "artifacts/tiny"
    for name in ("bf16", "copy"):  # the source as two variants, each with the manifest make quantize writes
        shutil.copytree(tiny_model, model_dir / name, ignore=shutil.ignore_patterns("manifest.json"))
        write_manifest(model_dir / name, "tiny", name, random_weights=True)
    suites = []
    for name, text in SUITES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        suites.append(tmp_path / f"{name}.yaml")
    for name in ("bf16", "copy"):
        proc = run_cli("run", model_dir / name, "--suites", *suites, "--limit", 5)
        assert proc.returncode == 0, proc.stderr[-2000:]

    res = json.loads((model_dir / "copy/eval/results.json").read_text())
    assert {"results", "configs", "versions", "n-samples", "n-shot", "higher_is_better", "config"} <= set(res)
    assert res["n-samples"]["math"] == {"original": 6, "effective": 5}
    assert res["n-samples"]["math-sampled"] == {"original": 4, "effective": 4}
    assert set(res["results"]["rc"]) >= {"exact_match,none", "exact_match_stderr,none", "f1,none", "f1_stderr,none"}
    math = res["pipeline"]["suites"]["math"]
    records = [json.loads(l) for l in (model_dir / "copy/eval/samples_math.jsonl").read_text().splitlines()]
    assert len(records) == 5 and {"prompt", "output", "extracted", "gold", "exact_match", "truncated"} <= set(
        records[0]
    )
    assert "<|im_start|>user" in records[0]["prompt"]  # the model's chat template
    assert math["truncated"] == sum(r["finish_reason"] == "length" for r in records)
    assert all(r["output_tokens"] <= 12 for r in records)
    sampled = res["pipeline"]["suites"]["math-sampled"]
    assert sampled["seeds"] == [0, 1] and len(sampled["metrics"]["exact_match"]["per_seed"]) == 2
    assert len((model_dir / "copy/eval/samples_math-sampled.jsonl").read_text().splitlines()) == 8

    report = compare(model_dir, "bf16").model_dump(exclude_unset=True)
    assert (model_dir / "eval-report.md").is_file()
    copy = report["variants"]["copy"]
    for key in ("math:exact_match", "math-sampled:exact_match", "rc:exact_match", "rc:f1"):
        assert copy[key]["delta"] == 0 and copy[key]["delta_ci95"] == (0.0, 0.0) and not copy[key]["significant"]
    assert copy["math:exact_match"]["mcnemar"]["p_value"] == 1.0
    fid = copy["held-out"]
    assert fid["kld_mean"] == pytest.approx(0, abs=1e-6) and fid["top1_agreement"] == 1.0
    assert fid["perplexity"] == pytest.approx(fid["baseline_perplexity"]) and fid["positions"] > 50

    # The direction of a delta: the copy now gets right two items bf16 got wrong. compare() must say
    # +2/5 (variant minus baseline), 2 gained in McNemar's count; a sign error or a pairing by position
    # (the file is rewritten in reverse order) fails.
    path = model_dir / "copy/eval/samples_math.jsonl"
    base = {
        r["doc_id"]: r["exact_match"]
        for r in map(json.loads, (model_dir / "bf16/eval/samples_math.jsonl").read_text().splitlines())
    }
    flipped = [d for d, v in base.items() if v == 0][:2]
    assert len(flipped) == 2, "a random model got 4 of 5 MATH items right?"
    records = [json.loads(l) for l in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps(r | ({"exact_match": 1.0} if r["doc_id"] in flipped else {})) + "\n" for r in records[::-1])
    )
    better = compare(model_dir, "bf16").model_dump(exclude_unset=True)["variants"]["copy"]["math:exact_match"]
    assert better["delta"] == pytest.approx(2 / 5) and 0 <= better["delta_ci95"][0] < better["delta_ci95"][1]
    assert better["mcnemar"]["gained"] == 2 and better["mcnemar"]["lost"] == 0
    base_mean = sum(base.values()) / len(base)  # recovery: the variant's mean as a share of bf16's
    assert better["recovery"] == (pytest.approx((base_mean + 2 / 5) / base_mean) if base_mean else None)
    assert "| recovery |" in (model_dir / "eval-report.md").read_text()


# ------------------------------------------------------------------------- a killed run cleans up
KILLED_STAGE = """
import multiprocessing, pathlib, sys, time
from pipeline.serving import engine_children_die_with_parent
engine_children_die_with_parent()  # at import, as pipeline/evaluate/__init__.py does: a spawned child runs it too


def engine(ready):
    pathlib.Path(ready).touch()  # the main module is imported by now: the child asked to die with us
    time.sleep(120)


if __name__ == "__main__":
    ready = pathlib.Path(sys.argv[2])
    child = multiprocessing.get_context(sys.argv[1]).Process(target=engine, args=(str(ready),))
    child.start()
    while not ready.exists():
        time.sleep(0.05)
    print(child.pid, flush=True)
    time.sleep(120)
"""


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_engine_children_die_when_the_stage_is_killed(tmp_path, method):
    """What vLLM's EngineCore gets from pipeline/evaluate/__init__.py's import-time call: a `kill -9` of the stage
    takes its multiprocessing children with it (spawned ones re-import the main module and call it)."""
    script = tmp_path / "stage.py"
    script.write_text(KILLED_STAGE)
    stage = subprocess.Popen(
        [sys.executable, str(script), method, str(tmp_path / "ready")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = None
    try:
        child = int(stage.stdout.readline())
        assert not _gone(child)
        stage.send_signal(signal.SIGKILL)
        stage.wait(10)
        deadline = time.time() + 10
        while not _gone(child) and time.time() < deadline:
            time.sleep(0.1)
        assert _gone(child), f"{method} child {child} outlived its SIGKILLed parent"
    finally:
        stage.kill()
        stage.wait()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)


SLOW_ENGINE_SERVER = """
import os, signal, sys, time

if os.fork() == 0:  # the engine: like vLLM's, still shutting down after the server process has exited
    def shut_down_slowly(*_):
        time.sleep(3)
        os._exit(0)

    signal.signal(signal.SIGTERM, shut_down_slowly)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        time.sleep(1)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    time.sleep(1)
"""


def test_a_server_is_stopped_with_every_process_under_it(tmp_path):
    """Leaving `with Server(...)` waits for the engine under the server, not only the server: on a loaded
    CI machine a vLLM worker outlived `make review`, whose server had exited on SIGTERM."""
    from pipeline.serving import Server, free_port

    script, engine_pid = tmp_path / "server.py", tmp_path / "engine.pid"
    script.write_text(SLOW_ENGINE_SERVER)
    engine = None
    try:
        with Server([sys.executable, str(script), str(engine_pid)], free_port(), tmp_path / "server.log", 30):
            deadline = time.time() + 30
            while not engine_pid.exists():
                assert time.time() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.05)
            engine = int(engine_pid.read_text())
        assert _gone(engine), "the engine outlived its server's `with` block"
    finally:
        if engine is not None and not _gone(engine):
            os.kill(engine, signal.SIGKILL)


def dead_pid() -> int:
    """The process id of a process that has exited."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_remove_stale_removes_folders_of_dead_runs_only(tmp_path):
    stale, live = tmp_path / f".tmp-eval-{dead_pid()}-abc", tmp_path / f".tmp-eval-{os.getpid()}-def"
    for folder in (stale, live):
        (folder / "sub").mkdir(parents=True)
    assert remove_stale(tmp_path) == [stale]
    assert not stale.exists() and live.is_dir()


def test_eval_removes_what_a_killed_run_left_even_when_it_then_fails(tmp_path):
    """`kill -9` of an eval leaves .tmp-eval-<pid>-*; the next run clears it first, whatever happens next."""
    variant = tmp_path / "v"
    (variant / f".tmp-eval-{dead_pid()}-xyz").mkdir(parents=True)
    with pytest.raises(ConfigError, match="not a checkpoint"):
        evaluate(variant, EvalSettings([ROOT / "eval/synthetic-math.yaml"], dtype="auto"))
    assert not any(variant.iterdir())


def truncated_variant(folder: Path) -> Path:
    """A variant folder whose model.safetensors lost its tail (a copy or download cut short)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    weights = folder / "model.safetensors"
    save_file({"w": torch.zeros(64, 64)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:-100])
    return weights


def test_truncated_weights_are_one_line_before_the_model_loads(tmp_path):
    truncated_variant(tmp_path / "v")
    with pytest.raises(
        ConfigError,
        match=r"model\.safetensors is \d+ bytes, its header says \d+ \(truncated or "
        r"damaged\)",
    ) as e:
        check_variant(tmp_path / "v")
    assert str(e.value).startswith(f"{tmp_path / 'v'}: ") and "\n" not in str(e.value)
    proc = run_cli("run", tmp_path / "v", "--suites", ROOT / "eval/synthetic-math.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {e.value}"]


# ------------------------------------------------------------------------------ fidelity arrays
def test_fidelity_arrays_rank_the_top_k_by_rank_not_by_the_order_vllm_lists_them(tmp_path, monkeypatch):
    """vLLM lists the prompt's own token first at each position, whatever its rank (tests/fake_engine.py
    does the same): the top-k columns, and so top-1 agreement, must come from the ranks."""
    from fake_engine import ArithmeticClient, top_token

    from pipeline.evaluate.generate import run_fidelity_suite
    from pipeline.evaluate.stats import fidelity_stats

    (tmp_path / "f.yaml").write_text(SUITES["held-out"])
    suite = load_suite(tmp_path / "f.yaml")
    k = suite.top_logprobs
    prompt = [9, 0, 2, 6, 13]  # after the first: the prompt token ranks 1, 3, k + 2 (beyond the top k), k + 2
    ranks = [1 + t % (k + 2) for t in prompt[1:]]
    assert ranks == [1, 3, k + 2, k + 2]
    run_fidelity_suite(ArithmeticClient(), suite, [prompt], tmp_path / "fidelity.npz")
    got = dict(np.load(tmp_path / "fidelity.npz"))
    expected_top = [
        [t if r == rank else top_token(t, r) for r in range(1, k + 1)] for t, rank in zip(prompt[1:], ranks)
    ]
    assert got["top_ids"].tolist() == expected_top
    assert got["top_logprobs"].tolist() == [[-float(r) for r in range(1, k + 1)]] * 4
    assert got["token_ids"].tolist() == prompt[1:] and got["logprob"].tolist() == [-float(r) for r in ranks]
    # the same model's rank-1 tokens, written independently: top-1 agreement is exactly 1
    reference = {**got, "top_ids": np.array(expected_top)}
    assert fidelity_stats(reference, got)["top1_agreement"] == 1.0


def test_parallel_settings_beyond_the_visible_gpus_are_one_line_errors(monkeypatch):
    from pipeline import serving

    monkeypatch.setattr(serving, "visible_gpus", lambda: ["0", "1"])
    assert serving.parallel_plan(None, 1) == 2  # unset: every visible GPU a data-parallel rank
    assert serving.parallel_plan(None, 2) == 1
    assert serving.parallel_plan(1, 1) == 1
    with pytest.raises(ConfigError, match=r"DP=2 TP=2: needs 4 GPUs, 2 visible \(0,1\); lower DP or TP"):
        serving.parallel_plan(2, 2)
    with pytest.raises(ConfigError, match="DP=0 TP=1: both must be at least 1"):
        serving.parallel_plan(0, 1)
    monkeypatch.setattr(serving, "visible_gpus", lambda: [])
    assert serving.parallel_plan(None, 1) == 1
    with pytest.raises(ConfigError, match="TP=2: tensor parallelism needs GPUs"):
        serving.parallel_plan(None, 2)
