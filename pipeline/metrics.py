"""How an output is scored: the answer extracted from it and the figures that answer earns.

One entry a metric in METRICS (a suite's `metric:` names one); a new metric is one function pair and
one entry. Every scorer sees only what follows a reasoning model's </think>.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, DecimalException


def strip_thinking(text: str, reasoning: bool, think_end: str = "</think>") -> str | None:
    """The part of an output that is scored: what follows the last </think> (a suite's think_end_token).

    A reasoning model that never closed its think block gave no answer (None), even if numbers
    appear in its thoughts; so does any output that opened <think> and did not close it.
    """
    if think_end in text:
        return text.rsplit(think_end, 1)[1]
    if reasoning or "<think>" in text:
        return None
    return text


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # cut off inside the box


# A number, optionally in scientific notation: 4.5e33, 4.5E+33, 1e-5, 4.5 \times 10^{33}, 4.5\cdot10^{33},
# 4.5 x 10^33. The e-notation takes no space around the e, so "2e - 1" (Euler's number) stays an expression.
TIMES = r"(?:\\times|\\cdot|[x×·*])"  # what writes "times" between a mantissa and 10^n
EXPONENT = (
    r"(?:[eE](?P<e>[+-]?\d+)(?![\w.])"
    rf"|\s*{TIMES}\s*10\s*\^\s*(?:\{{\s*(?P<braced>[+-]?\d+)\s*\}}|(?P<bare>[+-]?\d+)))"
)
NUMBER = re.compile(rf"(?P<mantissa>-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+){EXPONENT}?")
# The places math-verify misreads: "4.5e33" as 4.5 x e x 33, "4.5 x 10^33" as 4.5 x (a variable x) x 10^33.
E_NOTATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
TIMES_TEN = re.compile(rf"(?<=\d)\s*{TIMES}\s*(?=10\s*\^)")
# beyond this many decimal places a number is written in e-notation: "1e100000" is not 100,001 digits
MAX_FIXED_DIGITS = 100


def number_value(match: re.Match) -> Decimal:
    """The value of one NUMBER match: its mantissa (commas, currency and spaces dropped) times 10^exponent."""
    mantissa = Decimal(re.sub(r"[\s$,]", "", match["mantissa"]))
    exponent = match["e"] or match["braced"] or match["bare"]
    return mantissa.scaleb(int(exponent)) if exponent else mantissa


def canonical_number(value: Decimal) -> str:
    """One string for each value: '1000' for 1E+3 and 1000.00, '-0' as '0'."""
    value = value.normalize()
    out = format(value, "f") if abs(value.adjusted()) <= MAX_FIXED_DIGITS else str(value)
    return "0" if out in ("-0", "") else out


def normalise_number(text: str) -> str | None:
    """A number written the GSM8K way -> canonical string: '$1,000.00' -> '1000', '-3.50' -> '-3.5',
    '4.5e3' and '4.5 \\times 10^{3}' -> '4500'.

    Commas, currency, units and trailing zeros go; a fraction a/b becomes its decimal when exact.
    """
    text = text.replace("\\$", "$").replace("\\!", "").replace("{,}", ",")
    frac = re.fullmatch(r"\s*\\d?frac\{(-?\d+)\}\{(\d+)\}\s*", text) or re.fullmatch(r"\s*(-?\d+)\s*/\s*(\d+)\s*", text)
    try:
        if frac and int(frac.group(2)):
            value = Decimal(frac.group(1)) / Decimal(frac.group(2))
        else:
            found = list(NUMBER.finditer(text))
            if not found:
                return None
            value = number_value(found[-1])
        return canonical_number(value)
    except (DecimalException, ValueError):  # an exponent past Decimal's range, or of more digits than int() reads
        return None


def scientific_as_latex(text: str) -> str:
    """Scientific notation as math-verify reads it: '4.5e33' and '4.5 x 10^{33}' -> '4.5 \\times 10^{33}'.
    Anything else is left as it is: '2e', 'e^{2}', 'x10' (no 10^ after the x)."""
    text = E_NOTATION.sub(lambda m: f"{m[1]} \\times 10^{{{m[2]}}}", text)
    return TIMES_TEN.sub(r" \\times ", text)


NUMERIC_MARKERS = ("####", "answer is", "Answer:")  # after \\boxed{}, in this order


def extract_numeric(text: str) -> str | None:
    """GSM8K-style final answer: \\boxed{} if present, else after '####', else after 'answer is',
    else the last number in the text (lm-eval's gsm8k "flexible-extract" falls back the same way;
    `final_answer_marked` tells the outputs that needed the fallback apart)."""
    if (boxed := last_boxed(text)) is not None:
        return normalise_number(boxed)
    for marker in NUMERIC_MARKERS:
        if marker in text:
            return normalise_number(text.rsplit(marker, 1)[1].split("\n")[0] or text)
    return normalise_number(text)


def math_equal(gold: str, predicted_text: str) -> tuple[str | None, bool]:
    """MATH-style: the content of the last \\boxed{} (or \\fbox{}) parsed and compared by math-verify,
    so \\frac{1}{2} equals 0.5 and \\dfrac{3}{4} equals 3/4; string equality would miss both.

    An output without a box gave no answer (None, False). It is not parsed whole: math-verify then
    picks any expression in it, and an output cut off while restating "Evaluate $(1+2i)6-3i$" was
    scored equal to the gold 6+9i from the question's own expression."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    boxed = last_boxed(predicted_text)
    if boxed is None:
        return None, False
    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    pred = parse(f"${scientific_as_latex(boxed)}$", extraction_config=configs)
    if not pred:
        return None, False
    gold = scientific_as_latex(gold)
    gold_parsed = parse(gold if "$" in gold or "\\boxed" in gold else f"${gold}$", extraction_config=configs)
    return str(pred[-1]), bool(gold_parsed) and verify(gold_parsed, pred)


# SQuAD v1.1's official normalisation and token F1 (evaluate-v1.1.py), unchanged in behaviour.
def squad_normalise(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_f1(prediction: str, gold: str) -> float:
    pred, ref = squad_normalise(prediction).split(), squad_normalise(gold).split()
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, golds: list[str]) -> dict[str, float]:
    """Exact match and F1, each the max over the gold answers (as SQuAD scores them)."""
    return {
        "exact_match": max(float(squad_normalise(prediction) == squad_normalise(g)) for g in golds),
        "f1": max(squad_f1(prediction, g) for g in golds),
    }


def extract_span(text: str) -> str:
    """A short extractive answer: the first non-empty line, without an 'Answer:' prefix."""
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    return re.sub(r"^(the answer is|answer)\s*:?\s*", "", line, flags=re.I).strip()


def marked_numeric(text: str) -> bool:
    """\\boxed{}, '####', 'answer is' or 'Answer:'; the extraction still falls back to the last
    number, so an unmarked output can score: the count tells how many needed that fallback."""
    return bool((last_boxed(text) or "").strip()) or any(m in text for m in NUMERIC_MARKERS)


def marked_boxed(text: str) -> bool:
    return bool((last_boxed(text) or "").strip())  # an empty \\boxed{} marks nothing


def score_numeric(text: str, gold) -> tuple[str | None, dict[str, float]]:
    answer = extract_numeric(text)
    return answer, {"exact_match": float(answer is not None and answer == normalise_number(str(gold)))}


def score_math(text: str, gold) -> tuple[str | None, dict[str, float]]:
    answer, ok = math_equal(str(gold), text)
    return answer, {"exact_match": float(ok)}


def score_squad(text: str, gold) -> tuple[str | None, dict[str, float]]:
    span = extract_span(text)
    return span, squad_scores(span, gold if isinstance(gold, list) else [gold])


@dataclass(frozen=True)
class Metric:
    figures: tuple[str, ...]  # what it writes per item, all 0..1
    score: Callable[[str, object], tuple[str | None, dict[str, float]]]  # (answer, figures) of a text
    marked: Callable[[str], bool]  # whether the text marks a final answer
    # the packages (PyPI names) its scorer imports when it runs: eval checks them before the generation
    # whose outputs they score, since a scorer meets its first answer only after the minutes of generation
    requires: tuple[str, ...] = ()


METRICS = {
    "exact_match_numeric": Metric(("exact_match",), score_numeric, marked_numeric),  # GSM8K
    "exact_match_math": Metric(("exact_match",), score_math, marked_boxed, ("math-verify",)),  # MATH: no box, no answer
    "squad": Metric(("exact_match", "f1"), score_squad, lambda text: bool(extract_span(text))),
}


def score(
    metric: str, output: str, gold, reasoning: bool, think_end: str = "</think>"
) -> tuple[str | None, dict[str, float]]:
    """(extracted answer, {figure: score}) for one output; a reasoning model's unclosed think block
    scores 0 on every figure."""
    text = strip_thinking(output, reasoning, think_end)
    if text is None:
        return None, dict.fromkeys(METRICS[metric].figures, 0.0)
    return METRICS[metric].score(text, gold)


def final_answer_marked(metric: str, output: str, reasoning: bool, think_end: str = "</think>") -> bool:
    """Whether the output marks a final answer the way its metric looks for one (counted per suite
    as `no_answer`); a reasoning model's output counts only after its </think>."""
    text = strip_thinking(output, reasoning, think_end)
    return text is not None and METRICS[metric].marked(text)
