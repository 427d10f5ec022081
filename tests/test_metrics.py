"""pipeline/metrics.py: answer extraction and equivalence (numbers, MATH by value with math-verify, think
blocks), and SQuAD scoring (runs where math-verify is installed: .venv-serve)."""

import pytest

pytest.importorskip("math_verify")

from pipeline.metrics import (
    extract_numeric,
    final_answer_marked,
    last_boxed,
    score,
    squad_normalise,
    squad_scores,
    strip_thinking,
)


# --------------------------------------------------------------------------- extraction, equivalence
@pytest.mark.parametrize(
    "text, expected",
    [
        ("The total is $1,000.", "1000"),
        ("#### 1,234", "1234"),
        ("so she pays 5.50 dollars\n#### $5.50", "5.5"),
        ("The answer is 42 apples.", "42"),
        ("It costs 3.00", "3"),
        ("Final: \\boxed{\\$1{,}000}", "1000"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("-7 degrees", "-7"),
        ("I am not sure.", None),
    ],
)
def test_numeric_extraction_normalises_commas_units_and_trailing_zeros(text, expected):
    assert extract_numeric(text) == expected


def test_numeric_exact_match_compares_normalised_numbers():
    assert score("exact_match_numeric", "This many: $1,000.00 in total", "1000", False)[1]["exact_match"] == 1.0
    assert score("exact_match_numeric", "#### 18", "18", False) == ("18", {"exact_match": 1.0})
    assert score("exact_match_numeric", "#### 180", "18", False)[1]["exact_match"] == 0.0


@pytest.mark.parametrize(
    "output, gold",
    [
        ("so the result is \\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("the probability is \\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("Hence $x = \\boxed{2\\sqrt{2}}$.", "\\sqrt{8}"),
    ],
)
def test_math_answers_are_compared_by_value_not_string(output, gold):
    assert score("exact_match_math", output, gold, False)[1]["exact_match"] == 1.0


def test_math_wrong_or_missing_answers_score_zero():
    assert score("exact_match_math", "\\boxed{\\frac{2}{3}}", "0.5", False)[1]["exact_match"] == 0.0
    assert score("exact_match_math", "I do not know", "\\frac{1}{2}", False) == (None, {"exact_match": 0.0})


# Scientific notation: math-verify reads "4.5e33" as 4.5 x e x 33 and "4.5 x 10^33" as a product with a variable
# x, so a gold in one form scored a right answer in another 0 (issue 42). Each pair is tried both ways round.
SAME_NUMBER = [
    ("4.5e33", "4.5 \\times 10^{33}"),
    ("4.5E+33", "4.5\\cdot 10^{33}"),
    ("4.5e33", "4.5 x 10^33"),
    ("4.5e33", "45 \\times 10^{32}"),
    ("1e-5", "10^{-5}"),
    ("1e-5", "0.00001"),
    ("-2.1e3", "-2100"),
    ("-2.1e3", "-2.1 x 10^{3}"),
    ("2.5e-3", "\\frac{1}{400}"),
    ("5e-1", "\\frac{1}{2}"),
    ("1.5e3", "1,500"),
]


@pytest.mark.parametrize("gold, answer", SAME_NUMBER + [(b, a) for a, b in SAME_NUMBER])
def test_math_scientific_notation_equals_the_same_number_in_any_form(gold, answer):
    assert score("exact_match_math", f"so it is \\boxed{{{answer}}}", gold, False)[1]["exact_match"] == 1.0


# a data set's gold as a JSON number: str() writes it 4.5e+33, 1e-05
@pytest.mark.parametrize(
    "gold, answer", [(4.5e33, "4.5 \\times 10^{33}"), (1e-05, "0.00001"), (2.5e-3, "\\frac{1}{400}")]
)
def test_a_gold_stored_as_a_json_number_in_e_notation_is_that_number(gold, answer):
    assert score("exact_match_math", f"\\boxed{{{answer}}}", gold, False)[1]["exact_match"] == 1.0
    assert score("exact_match_numeric", f"\\boxed{{{answer}}}", gold, False)[1]["exact_match"] == 1.0


@pytest.mark.parametrize(
    "gold, answer, correct",
    [
        ("4.5e33", "4.5e32", False),  # the exponent counts
        ("1e-5", "1e-6", False),
        ("4.5e33", "4.5 \\times 33", False),  # no 10^: a product, not a power of ten
        ("2e", "2e", True),  # Euler's number, no exponent: as math-verify reads it
        ("2e", "2", False),
        ("2e", "e \\cdot 2", True),
        ("e^{2}", "e^2", True),
        ("e+1", "1+e", True),
        ("2e - 1", "-1 + 2e", True),  # spaces around the minus: an expression in e, not 2 x 10^-1
        ("1,000", "1000", True),
        ("10x", "10 x", True),  # a variable x after a number, with no 10^ after it
        ("\\frac{3}{4}", "0.75", True),
    ],
)
def test_math_answers_without_scientific_notation_are_read_as_before(gold, answer, correct):
    assert score("exact_match_math", f"\\boxed{{{answer}}}", gold, False)[1]["exact_match"] == float(correct)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{4.5 \\times 10^{3}}", "4500"),
        ("#### 4.5e3", "4500"),
        ("The answer is 4.5E+3 grams.", "4500"),
        ("Answer: 1e-5", "0.00001"),
        ("#### -2.1e3", "-2100"),
        ("so about 4.5 x 10^3 people", "4500"),
        ("\\boxed{4.5\\cdot10^{33}}", "4500000000000000000000000000000000"),
        ("That is 2 eggs each, 3e of them", "3"),  # no digits after the e: no exponent
        ("#### 1e100000", "1E+100000"),  # a huge exponent stays short
        ("#### 1e999999999", None),  # past what a Decimal holds: no number
    ],
)
def test_numeric_extraction_reads_scientific_notation_as_one_number(text, expected):
    assert extract_numeric(text) == expected


@pytest.mark.parametrize("gold, output", [("4.5e3", "#### 4,500"), ("4500", "\\boxed{4.5 \\times 10^{3}}")])
def test_numeric_exact_match_compares_scientific_notation_by_value(gold, output):
    assert score("exact_match_numeric", output, gold, False)[1]["exact_match"] == 1.0
    assert score("exact_match_numeric", output.replace("4", "5", 1), gold, False)[1]["exact_match"] == 0.0


# MATH-500 "Evaluate $(1+2i)6-3i$." (gold 6+9i): a bf16 output cut at 1,024 tokens, no box, was parsed
# whole by math-verify, which found the restated question and scored it equal to the gold.
CUT_OFF = "To evaluate $(1+2i)6-3i$, we first distribute ... "


def test_why_math_needs_a_box_math_verify_finds_the_question_in_a_cut_off_output():
    from math_verify import parse, verify

    assert verify(parse("$6+9i$"), parse(CUT_OFF))  # the false positive that the box rule removes


@pytest.mark.parametrize(
    "output, extracted, correct",
    [
        (CUT_OFF, None, False),  # cut off, no box: no answer
        ("We get $6+12i-3i$, so the result is $6+9i$.", None, False),  # unboxed answer: no answer either
        ("To evaluate $(1+2i)6-3i$, we get $6+12i-3i = \\boxed{6+9i}$.", "6+9i", True),
        ("\\fbox{6+9i}", "6+9i", True),
        ("The result is \\boxed{6+12i}", "6+12i", False),
        ("so it is \\boxed{6+9", None, False),  # cut off inside the box
        ("so it is \\boxed{}", None, False),
    ],
)
def test_math_answer_is_the_last_box_and_no_box_is_no_answer(output, extracted, correct):
    answer, scores = score("exact_match_math", output, "6+9i", False)
    assert scores == {"exact_match": float(correct)}
    assert answer == extracted
    assert final_answer_marked("exact_match_math", output, False) == (extracted is not None)


@pytest.mark.parametrize(
    "output, marked, extracted",
    [
        ("#### 18", True, "18"),
        ("so the answer is 18.", True, "18"),
        ("Answer: 18", True, "18"),
        ("total \\boxed{18} apples", True, "18"),
        (
            "3 apples and 15 more make 18",
            False,
            "18",
        ),  # lm-eval's flexible-extract fallback: scored, counted as unmarked
        ("I am not sure.", False, None),
    ],
)
def test_numeric_keeps_the_last_number_fallback_and_says_when_it_was_used(output, marked, extracted):
    answer, scores = score("exact_match_numeric", output, "18", False)
    assert answer == extracted and scores == {"exact_match": float(extracted == "18")}
    assert final_answer_marked("exact_match_numeric", output, False) is marked


def test_no_answer_after_an_unclosed_think_block_or_an_empty_span():
    assert not final_answer_marked("exact_match_numeric", "Let me think: #### 12", reasoning=True)
    assert final_answer_marked("exact_match_math", "<think>12?</think> \\boxed{12}", reasoning=True)
    assert final_answer_marked("squad", "Lisbon", False) and not final_answer_marked("squad", " \n ", False)


def test_boxed_with_nested_braces_and_a_box_cut_off():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}} end") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{\\frac{1}{2") is None


def test_only_text_after_the_think_block_is_scored():
    think = "<think>\n" + "Let me try 17. No, 99 is wrong. " * 200 + "\n</think>\n"
    assert score("exact_match_numeric", think + "The answer is \\boxed{12}.", "12", True) == (
        "12",
        {"exact_match": 1.0},
    )
    # the right number inside the thoughts does not count
    assert score("exact_match_numeric", "Maybe 12?\n</think>\nThe answer is 13.", "12", True)[1]["exact_match"] == 0.0
    # a reasoning model still thinking when cut off has no answer (R1's template opens <think> itself)
    assert strip_thinking("Let me think: 12 ... 12 ...", reasoning=True) is None
    assert score("exact_match_numeric", "Let me think: 12 ... 12", "12", True) == (None, {"exact_match": 0.0})
    assert strip_thinking("<think>unfinished 12", reasoning=False) is None
    assert strip_thinking("plain answer 12", reasoning=False) == "plain answer 12"


# ------------------------------------------------------------------------------------------ SQuAD
def test_squad_normalisation_drops_case_punctuation_articles_and_spaces():
    assert squad_normalise("The  Cat, sat!  ") == "cat sat"
    assert squad_normalise("An apple a day") == "apple day"
    assert squad_normalise("theatre") == "theatre"  # articles only as whole words


def test_squad_f1_and_exact_match_take_the_best_gold():
    assert squad_scores("the cat", ["Cat", "dog"]) == {"exact_match": 1.0, "f1": 1.0}
    s = squad_scores("a black cat sat", ["black dog", "the cat sat down"])
    # vs "cat sat down": pred {black, cat, sat}, overlap 2 -> P 2/3, R 2/3, F1 2/3
    assert s["exact_match"] == 0.0 and s["f1"] == pytest.approx(2 / 3)
    assert squad_scores("nothing", ["cat"]) == {"exact_match": 0.0, "f1": 0.0}
    assert score("squad", "Answer: Lisbon.\nMore text", ["Lisbon"], False) == (
        "Lisbon.",
        {"exact_match": 1.0, "f1": 1.0},
    )
