"""Shared fixtures: the embedded model's tokenizer and a tiny random model built from it.

Both are made once per test session from the GGUF that `make setup` installs, so the tests need no
network and no data folder.
"""

import json
import shutil
from pathlib import Path

import pytest

from pipeline.settings import ROOT
from pipeline.source import build_random, convert_embedded

# Llama-shaped like SmolLM2 but tiny: head_dim 64 (a size vLLM's CPU attention supports), every
# projection a multiple of 64 so group size 64 works. Vocab stays 49152 (the real tokenizer's), which
# also keeps it above the 10000 token ids `vllm bench latency` draws from.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "dtype": "bfloat16",
}


@pytest.fixture(scope="session")
def embedded_source(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as a bf16 checkpoint (the README's default source)."""
    built = ROOT / "artifacts/sources/smollm2-135m-instruct"
    if (built / "manifest.json").is_file():
        return built  # made by `make source` already: same function, same bytes
    out = tmp_path_factory.mktemp("sources") / "smollm2-135m-instruct"
    convert_embedded(out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, embedded_source) -> Path:
    """A 2-layer random-init Llama with SmolLM2's tokenizer and chat template."""
    config_dir = tmp_path_factory.mktemp("tiny-config")
    (config_dir / "config.json").write_text(json.dumps(TINY_CONFIG))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(embedded_source / name, config_dir / name)
    out = tmp_path_factory.mktemp("sources") / "tiny-llama"
    build_random(config_dir, out)
    return out


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory, tiny_model):
    """The tiny model in one real vLLM server for the session (tests/served.py): for the tests that need a
    served model and do not measure its speed, so that they share one start instead of paying one each."""
    pytest.importorskip("vllm")
    from served import serve_as_bench_does

    with serve_as_bench_does(tiny_model, tmp_path_factory.mktemp("tiny-server") / "server.log") as server:
        yield server
