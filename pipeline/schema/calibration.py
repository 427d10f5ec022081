"""What a calibration set (calib/*.yaml) may say: where its text comes from and how it becomes token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.schema.common import Source, _validate


class CalibSet(Source):
    """A calibration set: where the text comes from and how it becomes token ids."""

    generator: Literal["arithmetic-word-problems"] | None = None
    prompt_field: str = "question"
    response_field: str | None = "answer"
    chat_template: bool = True
    num_samples: int = Field(gt=0, le=100_000)
    max_seq_len: int = Field(ge=16, le=32_768)
    # responses: each sample's answer is the data's response_field ("data"), or the source model's own
    # answer to the prompt ("model": generated with vLLM, greedy, or DeepSeek's sampling for R1-style
    # models, think block included; cached under OUT/<model>/calibration/ by its inputs' hash), as Liu et
    # al. 2025 calibrate on the model's reasoning traces. max_new_tokens: the length cap of those answers.
    responses: Literal["data", "model"] = "data"
    max_new_tokens: int = Field(512, ge=1, le=32_768)

    @model_validator(mode="after")
    def _responses_settings(self):
        if self.responses == "model" and "response_field" in self.model_fields_set:
            raise ValueError("response_field: unused with responses: model (the model writes the answers); remove it")
        if self.responses == "data" and "max_new_tokens" in self.model_fields_set:
            raise ValueError("max_new_tokens: used only with responses: model; remove it or set responses: model")
        if self.local_file and not self.local_file.endswith(".jsonl"):
            raise ValueError(
                "local_file: calibration data is read as JSON Lines (.jsonl, one object a line); convert it"
            )
        return self


def load_calib(path: str | Path) -> CalibSet:
    return _validate(CalibSet, Path(path))
