"""Where text comes from: a file under the DATA_DIR setting (offline), the Hugging Face hub (online),
or problems the project generates itself (so the embedded default runs with no data at all).

The reference data sets are never copied into this repository: they are read through DATA_DIR.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from pipeline.schema import ConfigError


def load_records(*, hub_id: str | None, hub_config: str | None, split: str, local_file: str | None,
                 data_dir: str | None, what: str) -> list[dict]:
    """Rows of a data set: from DATA_DIR/local_file when DATA_DIR is set, else from the hub."""
    if data_dir:
        if not local_file:
            raise ConfigError(f"{what}: no local_file for DATA_DIR={data_dir}; add local_file or unset DATA_DIR to use the hub ({hub_id})")
        path = Path(data_dir) / local_file
        if not path.is_file():
            raise ConfigError(f"{what}: {path} not found; point DATA_DIR at the folder that holds {local_file}")
        return read_jsonl(path)
    if not hub_id:
        raise ConfigError(f"{what}: has no hub_id; set DATA_DIR to the folder that holds {local_file}")
    try:
        import datasets
        return list(datasets.load_dataset(hub_id, hub_config, split=split))
    except Exception as e:  # offline, unknown id, gated: all end the same way for the user
        raise ConfigError(f"{what}: could not load {hub_id} from the hub ({type(e).__name__}); offline, set DATA_DIR to a local copy") from None


def read_jsonl(path: Path) -> list[dict]:
    """One JSON object per line; a line that is not one is an error naming the file and the line."""
    rows = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{path}: line {number}: not valid JSON ({e.msg}); fix or remove that line") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}: line {number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def text_fields(rows: list[dict], fields: list[str], what: str, where: str) -> None:
    """Every row has each field as a non-empty string: a field missing, null or a list in one row out
    of thousands is named with its row here, not found as a tokenizer's TypeError later."""
    for i, row in enumerate(rows):
        for field in fields:
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                got = ("missing" if field not in row else "null" if value is None else
                       "empty" if isinstance(value, str) else f"a {type(value).__name__}")
                raise ConfigError(f"{what}: record {i + 1} of {where}: field {field!r} is {got}, not text; "
                                  "fix the data or choose another field")


NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam"]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "stamps", "shells"]


def word_problems(n: int, seed: int) -> list[dict]:
    """`n` arithmetic word problems with worked solutions in GSM8K's shape (final answer after '####').

    Exact by construction, deterministic in `seed`; text the project makes itself, not copied data.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        kind = rng.randrange(5)
        if kind == 0:
            a, b = rng.randint(5, 90), rng.randint(2, 40)
            c = rng.randint(1, a + b - 1)
            q = f"{name} has {a} {item}. {name} gets {b} more and then gives {c} away. How many {item} does {name} have now?"
            s = f"After getting more, {name} has {a} + {b} = {a + b} {item}.\nAfter giving some away, {name} has {a + b} - {c} = {a + b - c} {item}."
            ans = a + b - c
        elif kind == 1:
            k, p = rng.randint(2, 12), rng.randint(2, 15)
            bill = ((k * p) // 10 + 1) * 10
            q = f"{name} buys {k} {item} at ${p} each and pays with a ${bill} bill. How much change does {name} get?"
            s = f"The {item} cost {k} * {p} = ${k * p}.\nThe change is {bill} - {k * p} = ${bill - k * p}."
            ans = bill - k * p
        elif kind == 2:
            r, h, d = rng.randint(3, 25), rng.randint(2, 8), rng.randint(2, 6)
            q = f"A machine packs {r} boxes of {item} per hour. It runs {h} hours a day for {d} days. How many boxes does it pack?"
            s = f"Each day it packs {r} * {h} = {r * h} boxes.\nIn {d} days it packs {r * h} * {d} = {r * h * d} boxes."
            ans = r * h * d
        elif kind == 3:
            k, each, keep = rng.randint(2, 9), rng.randint(3, 20), rng.randint(1, 15)
            total = k * each + keep
            q = f"{name} has {total} {item}, keeps {keep} and shares the rest equally among {k} friends. How many {item} does each friend get?"
            s = f"{name} shares {total} - {keep} = {total - keep} {item}.\nEach friend gets {total - keep} / {k} = {each} {item}."
            ans = each
        else:
            price, pct = rng.randint(1, 20) * 20, rng.choice([10, 20, 25, 50])  # price*pct/100 stays whole
            off = price * pct // 100
            q = f"A coat costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?"
            s = f"The discount is {pct}/100 * {price} = ${off}.\nThe sale price is {price} - {off} = ${price - off}."
            ans = price - off
        out.append({"question": q, "answer": f"{s}\n#### {ans}"})
    return out
