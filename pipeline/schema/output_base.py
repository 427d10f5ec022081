"""The base classes of what the stages write (pipeline/schema/outputs.py, capacity.py, eval_outputs.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_serializer, model_validator


# The files one stage writes and another reads, typed as strictly as the inputs: every key named, so a
# key renamed in a writer fails its own tests, and a file from another version fails where it is read
# with one line naming the key, not later as a silent None. Checked before writing and after reading.
class Ordered(BaseModel):
    """Written in the order its keys were given (a file read and written again is the same text, and a
    writer's order is the file's), not in the order the model declares them."""

    _order: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data, handler):
        made = handler(data)
        if isinstance(data, dict) and made is not data:
            made._order = list(data)
        return made

    @model_serializer(mode="wrap")
    def _in_order(self, handler):
        out = handler(self)
        return {k: out[k] for k in self._order if k in out} | {k: v for k, v in out.items() if k not in self._order}


class Output(Ordered):
    model_config = ConfigDict(extra="forbid")


class Record(Ordered):
    """A record whose keys are another component's (a recipe's keys, a calibration set's, a machine's):
    the keys the pipeline reads are named, the rest kept as they were written."""

    model_config = ConfigDict(extra="allow")


class Spread(Output):
    median: float
    min: float
    max: float
    n: int
