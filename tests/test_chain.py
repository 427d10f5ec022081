"""The whole chain through make, as a user runs it: quantize, measure (eval and bench on one server per
variant, as make all runs them), report, publish and verify-published, in a temporary OUT, on a tiny
random model. The stages meet only through the files they write, so this is where report and publish
read what quantize, eval and bench really wrote.

- CPU (`make test`, its own suite: `make test-chain`): a 2-layer Llama with SmolLM2's tokenizer
  (tests/conftest.py), bf16 and gptq-w4a16, bench/cpu-test.yaml (its capacity search included), publish to
  and verify-published from a real S3 registry (SeaweedFS, tests/s3_store.py); then `make review` over
  what the chain wrote, driven in headless Chromium. Runs in the serve environment's pytest (make calls both
  interpreters itself).
- GPU (`make test-gpu`): a 2-layer Qwen2 with R1-Distill-Qwen-1.5B's tokenizer and chat template (so the
  reasoning path is taken), quantized on the GPU by both backends (llm-compressor: compressed-tensors;
  GPTQModel: classic gptq), evaluated with CUDA graphs, bench/gpu-test.yaml. Skipped where no GPU is
  visible. Needs R1_CONFIG (default ../shared/models/deepseek-r1-distill-qwen-1.5b) for the config and
  tokenizer; interpreters from QUANT_PY / SERVE_PY as for make itself.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from s3_store import seaweedfs, url_for

from pipeline.bench.capacity.grid import journal_path
from pipeline.checkpoint_files import file_hashes
from pipeline.publish.puller.version_files import folder_version
from pipeline.serving import served_dense
from pipeline.settings import ROOT

from stage_files import identity

pytestmark = pytest.mark.e2e

FORMATS = {
    "bf16": "unquantized",
    "fp8-dynamic": "compressed-tensors",
    "gptq-w4a16": "compressed-tensors",
    "gptq-w4a16-classic": "gptq",
}
# Qwen2 like R1-Distill-Qwen-1.5B but 2 layers of width 256: head_dim 128 (FlashAttention's), every
# projection a multiple of 128 so the INT4 Marlin and FP8 kernels take it; R1's vocabulary and context.
TINY_QWEN2 = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_window_layers": 2,
}
# A rehearsal (random weights may be published; no accuracy rule, their accuracy means nothing):
# anything that runs qualifies. The test is that a variant is published and served, not which.
POLICY = """description: "the chain test: publish the smallest variant that runs."
baseline: bf16
device: {device}
rehearsal: true
limits:
  chat.c{level}.p90_tpot_ms: {{max: 10000}}
objective:
  - minimize: weights_gib
deployment: {{gpu_memory_gib: 24, max_gpu_memory_utilization: 0.9, max_model_len: 1024, max_num_seqs: 16, replicas: 1}}
"""


def gpu_visible() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and "GPU" in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout


def run_chain(
    tmp_path: Path,
    model: Path,
    recipes: list[str],
    device: str,
    settings: list[str],
    registry: dict | None = None,
) -> dict:
    """make quantize ... verify-published with these settings; returns what each stage wrote, and make's
    settings and environment as the chain ran them ("make").
    registry (tests/s3_store.py's seaweedfs), if given: publish uploads to it and verify-published pulls
    the version back from it (REGISTRY=...) before serving it."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(device=device, level=4 if device == "cpu" else 8))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    # A user's key, as the model card says to export: verify-published serves with it; the servers bench
    # and review start for themselves take keys of their own, and must work all the same.
    env["VLLM_API_KEY"] = "the-users-key"
    url = url_for("chain") if registry else None
    if registry:
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")} | registry["env"]
        settings = [*settings, f"REGISTRY={url}"]
    settings = [
        f"OUT={out}",
        f"MODEL={model}",
        f"RECIPES={' '.join(recipes)}",
        "CALIB=synthetic-math-chat",
        "DATA_DIR=",
        "SUITES=synthetic-math synthetic-rc fidelity-synthetic",
        f"POLICY={policy}",
        "BASE_MODEL=",
        "LICENSE=",
        *settings,
        *(f"{k}={os.environ[k]}" for k in ("QUANT_PY", "SERVE_PY") if os.environ.get(k)),
    ]
    times = {}

    def step(target):
        t0 = time.time()
        proc = subprocess.run(
            ["make", "--no-print-directory", target, *settings], cwd=ROOT, env=env, capture_output=True, text=True
        )
        times[target] = time.time() - t0
        (logs / f"{target}.log").write_text(proc.stdout + proc.stderr)
        print(f"chain: {target:<17} {times[target]:6.1f} s  rc {proc.returncode}", flush=True)
        assert proc.returncode == 0, f"{target} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        return proc.stdout

    variants = out / model.name
    step("quantize")
    manifests = {r: json.loads((variants / r / "manifest.json").read_text()) for r in recipes}
    for recipe, manifest in manifests.items():
        assert manifest["format"] == FORMATS[recipe], recipe
        assert manifest["smoke"]["loaded"] and manifest["smoke"]["tokens"] == 8, recipe
        assert manifest["smoke"]["text"].strip(), f"{recipe}: vLLM generated nothing"
        assert manifest["files"] == file_hashes(variants / recipe), recipe  # exactly what is there
        assert manifest["random_weights"] and manifest["banner"] == "random weights — not for accuracy"
        if recipe in ("bf16", "fp8-dynamic"):  # data-free methods
            assert manifest["calibration"] is None
        else:
            assert len(manifest["calibration"]["token_ids_sha256"]) == 64, recipe
    assert not list(variants.glob(".tmp-*"))

    # eval and bench as make all runs them: one server per variant where their settings agree
    measured = step("measure")
    results = {r: json.loads((variants / r / "eval/results.json").read_text())["pipeline"] for r in recipes}
    # every figure says which checkpoint it measured: the variant as quantize built it
    built = {r: identity(manifest) for r, manifest in manifests.items()}
    for recipe, meta in results.items():
        assert meta["generated_tokens"] > 0, recipe
        assert meta["identity"] == built[recipe], recipe
    eval_report = json.loads((variants / "eval-report.json").read_text())
    compared = eval_report["variants"]
    assert set(compared) == set(recipes) and eval_report["identities"] == built
    for recipe in recipes:
        if recipe != "bf16":  # every accuracy figure paired with bf16's on the same items
            accuracy = [e for e in compared[recipe].values() if "mean" in e]
            assert accuracy and all("delta_ci95" in e for e in accuracy), recipe

    # BENCH_RECIPES' default leaves out weights served dequantized (INT4 on a CPU without AVX-512): evaluated only
    benched = [
        r for r in recipes if not served_dense(json.loads((variants / r / "manifest.json").read_text())["recipe"])
    ]
    assert not [r for r in recipes if r not in benched and (variants / r / "bench.json").exists()]
    benches = {r: json.loads((variants / r / "bench.json").read_text()) for r in benched}
    for recipe, bench in benches.items():
        assert bench["device"] == device and bench["levels"], recipe
        assert bench["server_shared_with_eval"], f"{recipe}: two servers:\n{measured[-2000:]}"
        assert f"{recipe}: one server for eval and bench" in measured, recipe
        assert bench["identity"] == built[recipe], recipe
        if device == "cpu":  # bench/cpu-test.yaml measures a capacity at its SLO, which publish then writes
            assert_capacity_measured(bench, recipe, measured)
            # the journal a stopped bench resumes from is done with once bench.json is written
            assert not journal_path(variants / recipe).exists(), recipe

    step("report")
    reported = json.loads((variants / "report.json").read_text())
    chosen = reported["decision"]["chosen"]
    assert chosen in recipes, "the policy chose nothing: see report.md"
    assert reported["variants"][chosen]["measured_on"] == {
        "eval-report.json": built[chosen],
        "bench.json": built[chosen],
    }

    uploaded = step("publish")
    published = out / "published" / f"{model.name}-{chosen}"
    assert (published / "serve.yaml").is_file() and (published / "manifest.json").is_file()
    version = folder_version(published)
    if registry:
        assert f"uploaded {url}/{published.name}/{version}/" in uploaded
        assert (out / "deploy" / published.name / "k8s.yaml").is_file()
    if device == "cpu":  # serve.yaml from the chosen config's capacity where one held, else memory arithmetic
        held = benches[chosen]["capacity"]["runs"][0]["capacity_rps"] is not None
        serve_text, card = (published / "serve.yaml").read_text(), (published / "README.md").read_text()
        assert ("Serving settings measured, not derived" in serve_text) == held, serve_text
        assert ("Capacity: holds " if held else "Capacity: not measured") in card
    served = step("verify-published")
    assert "/health: 200" in served and "without the API key: 401" in served and "server stopped" in served
    assert "with VLLM_API_KEY empty: refused to start" in served
    if registry:  # what was served is the version pulled back from the registry, every file verified
        assert f"pulled {url}/{published.name}/{version}" in served
        assert "verified: refused to start with an empty key, served from serve.yaml" in served
    print("chain: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f"; published {chosen}", flush=True)
    return {
        "manifests": manifests,
        "results": results,
        "benches": benches,
        "chosen": chosen,
        "model_dir": variants,
        "make": (settings, env),
    }


def assert_capacity_measured(bench: dict, recipe: str, stdout: str) -> None:
    """bench/cpu-test.yaml's capacity search on the server the levels used, as plumbing: its one config
    (the profile's own settings) chosen, a saturation run (the fresh server's warm-up), then sustained
    Poisson points and, where one held, its confirm run (confirm_repeats 1), the files written and the
    search's line printed.
    Not whether the SLO held on 2 busy cores: a capacity, or none with the points that say why."""
    section = bench["capacity"]
    (run,) = section["runs"]
    assert section["chosen"]["chat"]["config"] == "profile" and run["config"] == "profile", (recipe, section["chosen"])
    assert section["chosen"]["chat"]["reference"] == "profile" and section["chosen"]["chat"]["why"], recipe
    assert run["error"] is None, (recipe, run["error"])
    kinds = [p["kind"] for p in run["points"]]
    confirms = kinds.count("confirm")
    searched = kinds[1 : len(kinds) - confirms]
    assert kinds[:1] == ["saturation"] and searched and set(searched) == {"search"}, (recipe, kinds)
    assert set(kinds[len(kinds) - confirms :]) <= {"confirm"}, (recipe, kinds)
    assert run["saturation_rps"] > 0, recipe
    if run["confirmed"]:  # a search rate held: run once more (confirm_repeats 1), a fallback step below where it broke
        assert confirms == len(run["confirmed"]), (recipe, kinds)
        assert run["confirmed"][0]["runs"] == 2, (recipe, run["confirmed"])  # the search's point and one confirm
    else:  # nothing held in the search: nothing to confirm
        assert confirms == 0 and run["capacity_rps"] is None, (recipe, kinds)
    if run["capacity_rps"] is not None:  # above the saturation burst's throughput where sustained load holds more
        held = [p["request_rate"] for p in run["points"] if p["kind"] == "search" and not p["slo_broken"]]
        assert 0 < run["capacity_rps"] <= max(held), (recipe, run["confirmed"])
    else:  # none held: each point that broke says which target, by how much
        assert any(p["slo_broken"] for p in run["points"][1:]), (recipe, run["points"])
    assert section["vllm_version"] and section["device_name"], recipe
    # each point measured here carries this machine (choice.py compares configs on one machine only)
    assert bench["machine"]["instance"] and {p["machine"] for p in run["points"]} == {bench["machine"]["instance"]}
    line = next((ln for ln in stdout.splitlines() if f"{recipe} profile chat: capacity " in ln), None)
    assert line and " req/s at its SLO" in line and ", saturation " in line, (recipe, stdout[-2000:])
    assert ("capacity none req/s" in line) == (run["capacity_rps"] is None), (recipe, line)
    if run["confirmed"]:
        assert " window in " in line or " held in " in line, (recipe, line)


# Where a GPU is visible every stage runs on it: `make test-gpu` runs the chain there, with its assertions.
NOT_ON_A_GPU = pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: make test-gpu runs the chain on it")
# bf16 (transformers) and an llm-compressor INT4 variant, which vLLM serves on any x86 CPU (dequantized, and
# then not benchmarked, where its CPU build has no INT4 kernel: pipeline/vllm_plugins.py)
CPU_RECIPES = ["bf16", "gptq-w4a16"]


def find_browser() -> tuple[object | None, str | None]:
    """(Playwright's sync API, Chromium's path), or (None, why not)."""
    try:
        from playwright import sync_api
    except ImportError:
        return None, "playwright is not installed (requirements/serve.lock has it)"
    chromium = shutil.which("chromium")
    if not chromium:
        return None, "no Chromium: `apt-get install chromium` (Debian's package; .ci/run installs it)"
    return sync_api, chromium


def start_review(settings: list[str], env: dict, folder: Path) -> dict:
    """make review in the background (its own process group); the test below drives and stops it."""
    from pipeline.serving import free_port

    port = free_port()
    log_path = folder / "review.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "review", *settings, f"REVIEW_PORT={port}"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return {"proc": proc, "url": f"http://127.0.0.1:{port}/", "log": log_path}


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=90)


@pytest.fixture(scope="module")
def cpu_chain(tmp_path_factory, tiny_model):
    """The chain on the CPU, once for the tests below; then make review over what it wrote, started in the
    background (its two vLLM servers load while the page test drives the other tabs). Not earlier: beside
    verify-published, their start shared the 2 cores with the load test that replays the stated capacity,
    which the capacity search had not measured beside them."""
    pytest.importorskip("vllm")  # once, from the serve environment: make itself calls both
    pytest.importorskip("boto3")  # the registry's S3 server: the serve environment has it (serve.lock)
    settings = ["LIMIT=8", "MAX_TOKENS=32", "BENCH_PROFILE=cpu-test"]
    folder = tmp_path_factory.mktemp("chain")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as registry:
        chain = run_chain(folder, tiny_model, CPU_RECIPES, "cpu", settings, registry=registry)
        review = start_review(*chain["make"], folder) if find_browser()[0] else None
        yield chain | {"review": review}
    if review:
        stop(review["proc"])


@NOT_ON_A_GPU
def test_the_chain_on_the_cpu(cpu_chain):
    for recipe in CPU_RECIPES:
        # the smoke test's offline engine ran in its own process (pipeline/serving.py: engine_in_this_process);
        # eval ran on a vLLM OpenAI server, its command and version recorded
        assert cpu_chain["manifests"][recipe]["smoke"]["engine_in_process"] is True, recipe
        meta = cpu_chain["results"][recipe]
        assert meta["enforce_eager"] is True and meta["engine_in_process"] is False, recipe
        assert "--enforce-eager" in meta["serving"]["command"] and meta["serving"]["vllm_version"], recipe
        assert meta["reasoning_model"] is False  # SmolLM2's template has no think block
        if recipe in cpu_chain["benches"]:  # INT4 served dequantized is not benchmarked
            levels = cpu_chain["benches"][recipe]["levels"]
            assert [(lv["concurrency"], len(lv["runs"])) for lv in levels] == [(1, 1), (4, 1)], recipe
    assert cpu_chain["benches"]["bf16"]["hf_baseline"][0]["e2e_s"] > 0


# Headless Chromium as this machine's probe runs it: without the background-networking flags it tries
# Google's hosts at every start, and the closed network refuses them.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def differing_items(model_dir: Path, suite: str, variant: str, figure: str) -> tuple[int, int]:
    """(items that bf16 and the variant score differently, items), straight from the samples files."""
    means = []
    for name in ("bf16", variant):
        per_item: dict[int, list[float]] = {}
        for line in (model_dir / name / "eval" / f"samples_{suite}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            per_item.setdefault(rec["doc_id"], []).append(rec[figure])
        means.append({i: sum(v) / len(v) for i, v in per_item.items()})
    return sum(means[0][i] != means[1][i] for i in means[0]), len(means[0])


@NOT_ON_A_GPU
def test_the_review_page_in_a_browser(cpu_chain, tmp_path):
    """make review over what the chain wrote, driven in headless Chromium: each tab, the disagreement
    count against the samples files, one prompt answered by both variants, an empty prompt refused; a
    screenshot per tab in tmp_path; the page and its vLLM servers gone after SIGTERM."""
    sync_api, chromium = find_browser()
    if sync_api is None:
        pytest.skip(chromium)
    import psutil

    review = cpu_chain["review"]
    proc, url, log_path = review["proc"], review["url"], review["log"]
    model_dir, chosen = cpu_chain["model_dir"], cpu_chain["chosen"]
    try:
        deadline = time.time() + 180
        while f"review: {url}" not in log_path.read_text():
            assert proc.poll() is None, f"make review exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            assert time.time() < deadline, f"make review not up after 180 s:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            expect = sync_api.expect
            expect(page.locator("#report-decision")).to_contain_text(f"Publish {chosen}")
            plots = page.locator(".report-plot img")  # the plots of make report, loaded and drawn
            expect(plots).to_have_count(len(list((model_dir / "plots").glob("*.png"))))
            for i in range(plots.count()):
                plots.nth(i).scroll_into_view_if_needed()
                # decode() waits for the (lazy-loaded) image and rejects if it cannot be drawn
                assert plots.nth(i).evaluate("img => img.decode().then(() => img.naturalWidth)") > 0, f"plot {i}"
            page.screenshot(path=tmp_path / "report.png", full_page=True)

            page.get_by_role("tab", name="Disagreements").click()
            counts = page.locator("#disagreement-counts")
            expect(counts).to_contain_text("items of synthetic-math score differently on exact_match")
            differ, items = differing_items(model_dir, "synthetic-math", CPU_RECIPES[1], "exact_match")
            expect(counts).to_contain_text(f"{differ} of {items} items of synthetic-math")
            expect(page.locator("#disagreement-items .item")).to_have_count(differ)
            page.get_by_label("suite").click()  # SQuAD-style suite: two figures, the second picked
            page.get_by_role("option", name="synthetic-rc").click()
            expect(counts).to_contain_text("items of synthetic-rc score differently on exact_match")
            page.get_by_label("figure").click()
            page.get_by_role("option", name="f1").click()
            differ, items = differing_items(model_dir, "synthetic-rc", CPU_RECIPES[1], "f1")
            expect(counts).to_contain_text(f"{differ} of {items} items of synthetic-rc score differently on f1")
            page.screenshot(path=tmp_path / "disagreements.png", full_page=True)

            page.get_by_role("tab", name="Chat").click()
            page.locator("#chat-prompt textarea").fill("What is 2 + 2?")
            page.locator("#chat-send").click()
            for i, name in enumerate(("bf16", chosen if chosen != "bf16" else CPU_RECIPES[1])):
                expect(page.locator(f"#chat-status-{i}")).to_contain_text(f"{name}: served by vLLM", timeout=300_000)
                stats = page.locator(f"#chat-stats-{i}")
                expect(stats).to_contain_text("completion tokens", timeout=300_000)
                assert "time to first token" in stats.inner_text()
                assert page.locator(f"#chat-answer-{i} pre").inner_text().strip(), f"{name}: no answer shown"
            page.screenshot(path=tmp_path / "chat.png", full_page=True)
            (review,) = [p for p in psutil.Process(proc.pid).children(True) if "pipeline.review" in p.cmdline()]
            servers = [p for p in review.children() if "pipeline.vllm_server" in p.cmdline()]
            assert len(servers) == 2, f"{len(servers)} vLLM servers running, not the Chat tab's two"
            servers += [child for server in servers for child in server.children(recursive=True)]
            page.locator("#chat-prompt textarea").fill("   ")
            page.locator("#chat-send").click()
            expect(page.locator("#chat-answer-0")).to_contain_text("the prompt is empty")
            browser.close()
    finally:
        stop(proc)
    assert "review: stopped, and its vLLM servers" in log_path.read_text()
    assert not [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert all((tmp_path / f"{tab}.png").stat().st_size > 10_000 for tab in ("report", "disagreements", "chat"))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_visible(), reason="no NVIDIA GPU visible (nvidia-smi -L)")
def test_the_chain_on_a_gpu(tmp_path):
    r1 = Path(os.environ.get("R1_CONFIG", ROOT / "../shared/models/deepseek-r1-distill-qwen-1.5b"))
    if not (r1 / "config.json").is_file():
        pytest.fail(f"R1_CONFIG={r1}: no config.json; point it at R1-Distill-Qwen-1.5B's config and tokenizer")
    config_dir = tmp_path / "tiny-config"
    config_dir.mkdir()
    (config_dir / "config.json").write_text(json.dumps(json.loads((r1 / "config.json").read_text()) | TINY_QWEN2))
    for f in r1.iterdir():
        if f.name != "config.json" and f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, config_dir / f.name)
    model = tmp_path / "out" / "sources" / "tiny-r1-random"
    quant_py = os.environ.get("QUANT_PY", str(ROOT / ".venv-quant/bin/python"))
    subprocess.run([quant_py, "-m", "pipeline.source", "random", str(config_dir), str(model)], cwd=ROOT, check=True)
    # One variant per kernel path vLLM takes on a GPU: bf16, FP8 (CUTLASS), compressed-tensors INT4
    # (Machete/Marlin, made by llm-compressor) and classic GPTQ (gptq_marlin, made by GPTQModel).
    recipes = ["bf16", "fp8-dynamic", "gptq-w4a16", "gptq-w4a16-classic"]
    chain = run_chain(tmp_path, model, recipes, "cuda", ["LIMIT=64", "MAX_TOKENS=512", "BENCH_PROFILE=gpu-test"])
    for recipe in recipes:
        if recipe != "bf16":  # bf16 is a copy: nothing to run
            assert chain["manifests"][recipe]["quantize"]["device"] != "cpu", f"{recipe} was quantized on the CPU"
        meta = chain["results"][recipe]
        assert meta["enforce_eager"] is False, f"{recipe} was evaluated in eager mode on a GPU"
        assert meta["reasoning_model"] is True  # R1's chat template: the reasoning protocol
        assert chain["benches"][recipe]["machine"].get("gpu"), recipe
