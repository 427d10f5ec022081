"""HF transformers generate() on the bench shapes: the baseline vLLM is compared with (bf16 only)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pipeline.schema import Profile


# ------------------------------------------------------------------------------ HF baseline
def hf_generate_baseline(model_dir: Path, profile: Profile) -> list[dict]:
    """HF transformers generate() on the same shapes: what serving through vLLM buys."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
        .to(device)
        .eval()
    )
    gen = torch.Generator().manual_seed(0)
    out = []
    for shape in profile.shapes:
        for batch in profile.hf_baseline_concurrency:
            ids = torch.randint(0, 10_000, (batch, shape.input_len), generator=gen).to(device)
            kwargs = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))

            def timed(n_new):
                if device == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.inference_mode():
                    model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, **kwargs)  # noqa: B023 (this iteration's)
                if device == "cuda":
                    torch.cuda.synchronize()
                return time.perf_counter() - t

            timed(2)  # warm-up
            e2e = [timed(shape.output_len) for _ in range(profile.hf_baseline_repeats)]
            ttft = [timed(1) for _ in range(profile.hf_baseline_repeats)]
            e2e_s = statistics.median(e2e)
            out.append(
                {
                    "shape": shape.name,
                    "input_len": shape.input_len,
                    "output_len": shape.output_len,
                    "batch": batch,
                    "e2e_s": e2e_s,
                    "e2e_s_runs": e2e,
                    "ttft_s": statistics.median(ttft),
                    "output_throughput": batch * shape.output_len / e2e_s,
                }
            )
    return out
