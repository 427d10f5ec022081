"""Where text comes from: a file under the DATA_DIR setting (offline), the Hugging Face hub (online),
or problems the project generates itself (so the embedded default runs with no data at all).

The reference data sets are never copied into this repository: they are read through DATA_DIR.
"""

from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

from pipeline.schema import ConfigError, Source, Suite, excerpt, excerpt_text


def load_records(source: Source, data_dir: str | None, what: str) -> tuple[list[dict], list[str]]:
    """Rows of a calibration set's or suite's data set, from DATA_DIR/local_file when DATA_DIR is set,
    else from the hub; and where each row is ("FILE: line N", or the hub's row number), for errors."""
    hub_id, local_file = source.hub_id, source.local_file
    if data_dir:
        if not local_file:
            raise ConfigError(
                f"{what}: no local_file for DATA_DIR={data_dir}; add local_file or unset DATA_DIR to use the hub "
                f"({hub_id})"
            )
        path = Path(data_dir) / local_file
        if not path.is_file():
            raise ConfigError(f"{what}: {path} not found; point DATA_DIR at the folder that holds {local_file}")
        rows, places = read_jsonl(path)
        if not rows:
            raise ConfigError(f"{what}: {path} has no records (an empty file); point DATA_DIR at a complete copy")
        return rows, places
    if not hub_id:
        raise ConfigError(f"{what}: has no hub_id; set DATA_DIR to the folder that holds {local_file}")
    try:
        import datasets

        rows = list(datasets.load_dataset(hub_id, source.hub_config, split=source.split))
    except Exception as e:  # offline, unknown id, gated: all end the same way for the user
        raise ConfigError(
            f"{what}: could not load {hub_id} from the hub ({type(e).__name__}); offline, set DATA_DIR to a local copy"
        ) from None
    if not rows:
        raise ConfigError(f"{what}: {hub_id} ({source.split}) has no rows; check hub_id, hub_config and split")
    return rows, [f"{hub_id} ({source.split}) row {i + 1}" for i in range(len(rows))]


def read_text(path: Path) -> str:
    """A data file's text; bytes that are not UTF-8 are an error naming the file, the line and the byte."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not part of the first row
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{path}: line {line} (byte {e.start:,}): not UTF-8 text ({e.reason}); convert the file to UTF-8"
        ) from None


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """One JSON object per line, and where each is ("FILE: line N"); a line that is not one is an error
    naming the file and the line."""
    rows, places = [], []
    for number, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise ConfigError(f"{path}: line {number}: nested too deeply to read; fix or remove that line") from None
        except ValueError as e:
            raise ConfigError(f"{path}: line {number}: not valid JSON ({e.msg}); fix or remove that line") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
        places.append(f"{path}: line {number}")
    return rows, places


def text_fields(rows: list[dict], places: list[str], fields: list[str], what: str) -> None:
    """Every row has each field as a non-empty string: a field missing, null or a list in one row out
    of thousands is named with its file and line here, not found as a tokenizer's TypeError later."""
    for row, place in zip(rows, places):
        for field in fields:
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                got = (
                    "missing"
                    if field not in row
                    else "null"
                    if value is None
                    else "empty"
                    if isinstance(value, str)
                    else f"a {type(value).__name__}"
                )
                raise ConfigError(
                    f"{what}: {place}: field {excerpt(field)} is {got}, not text; fix the data or choose another field"
                )


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
            q = (
                f"{name} has {a} {item}. {name} gets {b} more and then gives {c} away. How many {item} does {name} "
                "have now?"
            )
            s = (
                f"After getting more, {name} has {a} + {b} = {a + b} {item}.\nAfter giving some away, {name} has "
                f"{a + b} - {c} = {a + b - c} {item}."
            )
            ans = a + b - c
        elif kind == 1:
            k, p = rng.randint(2, 12), rng.randint(2, 15)
            bill = ((k * p) // 10 + 1) * 10
            q = f"{name} buys {k} {item} at ${p} each and pays with a ${bill} bill. How much change does {name} get?"
            s = f"The {item} cost {k} * {p} = ${k * p}.\nThe change is {bill} - {k * p} = ${bill - k * p}."
            ans = bill - k * p
        elif kind == 2:
            r, h, d = rng.randint(3, 25), rng.randint(2, 8), rng.randint(2, 6)
            q = (
                f"A machine packs {r} boxes of {item} per hour. It runs {h} hours a day for {d} days. How many boxes "
                "does it pack?"
            )
            s = f"Each day it packs {r} * {h} = {r * h} boxes.\nIn {d} days it packs {r * h} * {d} = {r * h * d} boxes."
            ans = r * h * d
        elif kind == 3:
            k, each, keep = rng.randint(2, 9), rng.randint(3, 20), rng.randint(1, 15)
            total = k * each + keep
            q = (
                f"{name} has {total} {item}, keeps {keep} and shares the rest equally among {k} friends. How many "
                f"{item} does each friend get?"
            )
            s = (
                f"{name} shares {total} - {keep} = {total - keep} {item}.\nEach friend gets {total - keep} / {k} = "
                f"{each} {item}."
            )
            ans = each
        else:
            price, pct = rng.randint(1, 20) * 20, rng.choice([10, 20, 25, 50])  # price*pct/100 stays whole
            off = price * pct // 100
            q = f"A coat costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?"
            s = f"The discount is {pct}/100 * {price} = ${off}.\nThe sale price is {price} - {off} = ${price - off}."
            ans = price - off
        out.append({"question": q, "answer": f"{s}\n#### {ans}"})
    return out


# ------------------------------------------------------------------ eval suites' rows (eval/*.yaml)
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Tallinn", "Porto", "Accra", "Kyoto"]
JOBS = ["baker", "nurse", "pilot", "carpenter", "librarian", "chemist", "gardener", "teacher"]
ANIMALS = ["cat", "parrot", "dog", "tortoise", "rabbit", "goldfish"]
PETS = ["Pepper", "Biscuit", "Mango", "Orbit", "Pickle", "Nimbus", "Toffee", "Juniper"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
COLOURS = ["red", "green", "yellow", "blue", "orange", "purple"]


def reading_passages(n: int, seed: int) -> list[dict]:
    """`n` short passages, each with one extractive question whose answer is a span of the passage.

    Exact by construction (SQuAD's shape: context, question, answers), deterministic in `seed`.
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, friend = rng.sample(NAMES, 2)
        city, job, animal, pet = rng.choice(CITIES), rng.choice(JOBS), rng.choice(ANIMALS), rng.choice(PETS)
        day, colour, years = rng.choice(DAYS), rng.choice(COLOURS), rng.randint(2, 30)
        context = (
            f"{name} lives in {city} and has worked as a {job} for {years} years. "
            f"{name} has a {animal} named {pet}. Every {day}, {name} rides a {colour} bicycle "
            f"to visit {friend}, an old friend from school."
        )
        question, answers = rng.choice(
            [
                (f"In which city does {name} live?", [city]),
                (f"What is the name of {name}'s {animal}?", [pet]),
                (f"What does {name} work as?", [f"a {job}", job]),
                (f"Who does {name} visit every {day}?", [friend]),
                (f"What colour is {name}'s bicycle?", [colour]),
                (f"For how many years has {name} worked as a {job}?", [f"{years} years", str(years)]),
                (f"On which day does {name} visit {friend}?", [day, f"every {day}"]),
            ]
        )
        out.append({"context": context, "question": question, "answers": answers})
    return out


def squad_json_records(path: Path) -> tuple[list[dict], list[str]]:
    """SQuAD v1.1 JSON (data > paragraphs > qas) as flat rows, in file order, and where each question is
    in the file; a file in another shape is one error naming the file and the place."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; expected SQuAD v1.1 JSON") from None
    except ValueError as e:
        where = f"line {e.lineno} column {e.colno}: " if isinstance(e, json.JSONDecodeError) else ""
        raise ConfigError(f"{path}: {where}not valid JSON ({getattr(e, 'msg', e)}); expected SQuAD v1.1 JSON") from None
    rows, places = [], []
    place = "data"
    try:
        for i, article in enumerate(doc["data"]):
            place = f"data[{i}]"
            for j, para in enumerate(article["paragraphs"]):
                place = f"data[{i}].paragraphs[{j}]"
                for k, qa in enumerate(para["qas"]):
                    place = f"data[{i}].paragraphs[{j}].qas[{k}]"
                    rows.append(
                        {
                            "id": qa["id"],
                            "title": article.get("title", ""),
                            "context": para["context"],
                            "question": qa["question"],
                            "answers": [a["text"] for a in qa["answers"]],
                        }
                    )
                    places.append(f"{path}: {place} (id {excerpt(qa['id'])})")
    except KeyError as e:
        raise ConfigError(
            f"{path}: {place}: no {excerpt(e.args[0])}; expected SQuAD v1.1 JSON (data > paragraphs > qas)"
        ) from None
    except (TypeError, AttributeError):
        raise ConfigError(
            f"{path}: {place}: not the shape of SQuAD v1.1 JSON (data > paragraphs > qas, each a list of objects)"
        ) from None
    if not rows:
        raise ConfigError(f"{path}: no questions (data > paragraphs > qas is empty); point DATA_DIR at a complete copy")
    return rows, places


def prompt_fields(template: str) -> set[str]:
    """The row fields a format string such as the suite's prompt uses ("{question}", "{answers[0]}")."""
    return {re.match(r"\w*", name).group() for _, name, _, _ in string.Formatter().parse(template) if name}


def load_items(suite: Suite, data_dir: str | None, what: str, limit: int | None) -> list[dict]:
    """The suite's items in a fixed order (file order, or generation order), the first `limit`; every one
    has the fields the suite uses (a row without one is named by its file and line)."""
    if suite.generator == "arithmetic-word-problems":
        rows = word_problems(suite.num_items, suite.seed)
    elif suite.generator == "reading-passages":
        rows = reading_passages(suite.num_items, suite.seed)
    elif data_dir and suite.local_file and suite.local_file.endswith(".json"):
        path = Path(data_dir) / suite.local_file
        if not path.is_file():
            raise ConfigError(f"{what}: {path} not found; point DATA_DIR at the folder that holds {suite.local_file}")
        rows, places = squad_json_records(path)
    else:
        rows, places = load_records(suite, data_dir, what)
    if suite.generator:
        places = [f"{suite.generator} item {i + 1}" for i in range(len(rows))]
    if suite.num_items and not suite.generator:
        rows = rows[: suite.num_items]
    rows = rows[:limit] if limit else rows
    if not rows:
        raise ConfigError(f"{what}: no items to score")
    needed = prompt_fields(suite.prompt) | prompt_fields(suite.response or "")
    needed |= {suite.gold_field} if suite.gold_field else set()
    if missing := sorted(needed - set(rows[0])):
        has = excerpt_text(", ".join(sorted(rows[0])))
        raise ConfigError(f"{what}: field {excerpt(missing[0])} is not in the data (it has {has})")
    for row, place in zip(rows, places):
        for field in sorted(needed):
            if row.get(field) is None:
                got = "missing" if field not in row else "null"
                raise ConfigError(
                    f"{what}: {place}: field {excerpt(field)} is {got} (the suite uses it); fix or remove that row"
                )
    return rows


def gold_of(suite: Suite, row: dict):
    gold = row[suite.gold_field]
    if isinstance(gold, dict) and "text" in gold:  # the hub's SQuAD: {"text": [...], "answer_start": [...]}
        gold = list(gold["text"])
    if suite.gold_after and isinstance(gold, str):
        gold = gold.rsplit(suite.gold_after, 1)[-1].strip()
    return gold
