"""Which dtype vLLM runs in on a CPU (pipeline/serving.py: cpu_dtype), by the instruction sets /proc/cpuinfo
lists: bf16 where the CPU computes in it, else float32. float16 on a CPU without half-precision arithmetic
was 3.9x slower than float32 on an AVX2 EPYC (docs/environments.md), and the bf16 attention kernel dies with
SIGILL where the CPU has no bf16 instructions."""

import pytest

from pipeline import serving


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ("fpu sse avx2 fma", "float32"),  # AVX2 only: the EPYC this was measured on
        ("avx2 avx512f avx512bw avx512vl", "float32"),  # AVX-512 without its bf16 extension
        ("avx2 avx512f avx512_bf16", "bfloat16"),
        ("avx2 amx_bf16 amx_tile", "bfloat16"),
        ("", "float32"),  # no /proc/cpuinfo
    ],
)
def test_a_cpu_without_bf16_instructions_serves_in_float32(monkeypatch, flags, dtype):
    monkeypatch.setattr(serving, "cpu_flags", lambda: flags)
    assert serving.cpu_dtype() == dtype
