"""What llm-compressor has no option for, as small subclasses of its modifiers, checked against the one
version they were read from (check_version fails loudly on any other, when this module is imported):

- AWQ's grid subsampling (recipe grid_subsample: N): each candidate scale is scored on every Nth
  calibration batch, while the activation statistics the candidates are made from still come from every
  batch. AWQ keeps each parent module's inputs, one entry a batch, in an IntermediatesCache that its
  grid search replays; ParentArgsCache keeps every Nth entry only, and the loss masks AWQ pairs with the
  replayed batches by position are subsampled to match while it smooths.
- Pinned memory on a host without an accelerator: AWQ pins its cached inputs for host-to-device copies,
  and torch cannot pin where there is no device. ParentArgsCache pins only where there is one.
- GPTQ over padded batches (calib_batch_size > 1): its Hessians count padding positions as tokens.
  GPTQ.calibrate_module passes only the real tokens (the loss mask) and counts one sample a sample.
- Distributed over CPU ranks: a barrier after each layer's compression (GPTQ.compress_modules).
"""

from __future__ import annotations

import llmcompressor
import torch
from llmcompressor.core import active_session
from llmcompressor.modifiers.quantization import GPTQModifier
from llmcompressor.modifiers.transform.awq import AWQModifier
from llmcompressor.pipelines.cache import IntermediatesCache
from pydantic import Field

WRITTEN_FOR = "0.14.0.1"  # the llm-compressor whose AWQModifier and GPTQModifier these subclasses were read from


def check_version(found: str | None = None) -> None:
    found = found or llmcompressor.__version__
    if found != WRITTEN_FOR:
        raise RuntimeError(
            f"llm-compressor {found}: pipeline/quantize/llmcompressor_shims.py was written for {WRITTEN_FOR}; "
            "check AWQ's parent-args cache and loss masks and GPTQ's calibrate_module against it, then update "
            "WRITTEN_FOR (tests/test_quantize_shims.py proves what they change)"
        )


check_version()


class ParentArgsCache(IntermediatesCache):
    """An AWQ parent module's cached inputs: every `stride`-th batch appended to it, pinned only where
    there is an accelerator to copy them to."""

    def __init__(self, stride: int, offload_device):
        super().__init__(None, offload_device)
        self.stride, self.appended = stride, 0

    def append(self, values: dict) -> None:
        if self.appended % self.stride == 0:
            super().append(values)
        self.appended += 1

    def pin_memory(self, batch_index: int, input_names: list[str] | None = None) -> None:
        if torch.accelerator.is_available():
            super().pin_memory(batch_index, input_names)


class AWQ(AWQModifier):
    """AWQModifier whose grid search scores each candidate on every grid_subsample-th batch."""

    # not written into the checkpoint's recipe.yaml, whose AWQ entry then holds llm-compressor's own
    # fields only; manifest.json records the setting with the rest of the recipe
    grid_subsample: int = Field(default=1, ge=1, exclude=True)

    def on_calibration_start(self, state, event, **kwargs):
        super().on_calibration_start(state, event, **kwargs)
        # the caches are empty here; the forward-pre hooks look them up by module at each batch
        for parent in self._parent_args_cache:
            self._parent_args_cache[parent] = ParentArgsCache(self.grid_subsample, self.offload_device)

    def on_sequential_epoch_end(self, state, event, **kwargs):
        masks = state.loss_masks  # one a batch, paired with the cached batches by position
        state.loss_masks = masks[:: self.grid_subsample] if masks else masks
        try:
            super().on_sequential_epoch_end(state, event, **kwargs)
        finally:
            state.loss_masks = masks


class GPTQ(GPTQModifier):
    """GPTQModifier, its Hessians summed over real tokens only. With calib_batch_size > 1 the batches are
    right-padded, and a padding position's activations would enter H = sum 2 x x^T; dropping them leaves
    the sum over the same tokens as one sample a pass, and the sample count is kept as one sample a pass
    counts it: that Hessian from calib_batch_size times fewer forward passes, up to how batched bf16
    passes round (enough to move GPTQ's result: docs/recipes.md)."""

    def calibrate_module(self, module, args, _output):
        state = active_session().state
        if state.loss_masks is None:  # one sample a pass: nothing padded
            return super().calibrate_module(module, args, _output)
        inp = args[0]
        real = state.loss_masks[state.current_batch_idx].to(inp.device).bool()
        super().calibrate_module(module, (inp[real].unsqueeze(0), *args[1:]), _output)
        self._num_samples[module] += inp.shape[0] - 1  # one per sample, as without batching

    def compress_modules(self):
        super().compress_modules()
        # Distributed over CPU ranks, the offloaded weights sit in shared memory and llm-compressor
        # broadcasts nothing (its GPU ranks wait on a broadcast from each layer's owner): without this
        # barrier rank 0 can propagate, and save, a layer that another rank is still writing.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
