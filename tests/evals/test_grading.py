"""Every normalisation rule of answers_match, with negatives, and the off-main-thread deadline."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from mathagent.agent.answer import cluster_answers, extract_answer, normalize_answer
from mathagent.agent.answer.numbers import parse_number
from mathagent.agent.answer.verifier import Verifier
from mathagent.evals.grading import answers_match

MATCH = [
    ("leading zeros", "025", "25"),
    ("leading zeros, gold", "7", "007"),
    ("thousands separators", "1,234,567", "1234567"),
    ("thousands in LaTeX", "1{,}234", "1234"),
    ("thin-space thousands", "1\\,234", "1234"),
    ("trailing zeros", "18.00", "18"),
    ("trailing units", "18 dollars", "18"),
    ("units in \\text", "12\\text{ inches}", "12"),
    ("currency", "\\$18", "18"),
    ("degrees ^\\circ", "30^\\circ", "30"),
    ("degrees ^{\\circ}", "30^{\\circ}", "30"),
    ("degree sign", "45°", "45"),
    ("percent", "25\\%", "25"),
    ("plain percent", "25%", "25"),
    ("\\text wrapper", "\\text{42}", "42"),
    ("\\textbf wrapper", "\\textbf{42}", "42"),
    ("boxed", "\\boxed{42}", "42"),
    ("dollar math", "$42$", "42"),
    ("assignment", "x = 5", "5"),
    ("choice in parentheses", "(B)", "B"),
    ("choice bare vs gold in parentheses", "B", "(B)"),
    ("choice with value", "\\textbf{(C) }17", "C"),
    ("scientific e", "1.5e3", "1500"),
    ("scientific \\times", "1.5 \\times 10^{3}", "1500"),
    ("scientific \\cdot negative exponent", "2.5\\cdot10^{-2}", "0.025"),
    ("repeating overline", "0.\\overline{3}", "\\frac{1}{3}"),
    ("repeating overline with fixed part", "0.1\\overline{6}", "1/6"),
    ("repeating parentheses", "0.(142857)", "\\frac{1}{7}"),
    ("repeating dots", "0.\\dot{1}4\\dot{2}", "142/999"),
    ("fraction vs decimal", "0.5", "\\frac{1}{2}"),
    ("dfrac short form", "\\dfrac12", "0.5"),
    ("negative fraction", "-\\frac{3}{4}", "-0.75"),
    ("symbolic via math-verify", "\\sqrt{8}", "2\\sqrt{2}"),
    ("tuple via math-verify", "(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
]

NO_MATCH = [
    ("different integers", "24", "25"),
    ("leading zeros keep value", "0250", "25"),
    ("tuple is not thousands", "(1, 234)", "1234"),
    ("wrong choice", "(A)", "B"),
    ("number for a choice", "42", "B"),
    ("wrong scientific", "1.5e2", "1500"),
    ("wrong repeating", "0.\\overline{6}", "\\frac{1}{3}"),
    ("truncated repeating", "0.333", "\\frac{1}{3}"),
    ("wrong percent", "26\\%", "25"),
    ("empty prediction", "", "5"),
    ("no prediction", None, "5"),
    ("variable is not a unit", "5x", "5"),
    ("wrong symbolic", "\\sqrt{7}", "2\\sqrt{2}"),
]


@pytest.mark.parametrize(("rule", "predicted", "expected"), MATCH, ids=[m[0] for m in MATCH])
def test_rule_matches(rule: str, predicted: str, expected: str):
    assert answers_match(predicted, expected), rule


@pytest.mark.parametrize(("rule", "predicted", "expected"), NO_MATCH, ids=[m[0] for m in NO_MATCH])
def test_rule_rejects(rule: str, predicted: str | None, expected: str):
    assert not answers_match(predicted, expected), rule


def test_modulo_compares_integers_modulo_the_base():
    assert answers_match("2024", "24", modulo=1000)
    assert answers_match("-1", "999", modulo=1000)
    assert answers_match("1,024", "24", modulo=1000)
    assert not answers_match("2024", "24")
    assert not answers_match("2025", "24", modulo=1000)
    assert not answers_match("24.5", "24", modulo=1000)
    assert not answers_match("\\frac{48}{2}", "25", modulo=1000)


def test_parse_number_exact_values():
    values = {
        "1,000": Fraction(1000),
        "-0.125": Fraction(-1, 8),
        "3E-2": Fraction(3, 100),
        "1.2\\overline{3}": Fraction(37, 30),
        "3\\frac{1}{2}": Fraction(7, 2),
    }
    for text, value in values.items():
        number = parse_number(text)
        assert number is not None and number.value == value, text
    assert parse_number("x+1") is None
    assert parse_number("1/0") is None


def test_extraction_takes_the_last_balanced_box():
    assert extract_answer("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert extract_answer("no box here") is None
    assert extract_answer("\\boxed{unclosed") is None
    assert normalize_answer("The answer is \\boxed{\\text{(B)}}") == "(B)"


def test_clusters_group_equal_numbers():
    labels = cluster_answers(["025", "25.0", "\\boxed{25}", "26", None, "  "])
    assert labels == [0, 0, 0, 1, None, None]


def test_grading_works_off_the_main_thread():
    verdicts: list[bool] = []
    worker = threading.Thread(
        target=lambda: verdicts.append(answers_match("\\sqrt{8}", "2\\sqrt{2}"))
    )
    worker.start()
    worker.join(120)
    assert verdicts == [True]


def test_a_slow_comparison_is_cut_at_the_deadline_and_the_worker_recovers():
    verifier = Verifier()
    try:
        # A huge power tower: sympy would take far longer than the deadline to settle it.
        assert not verifier.equivalent("2", "9^{9^{9^{9^{9}}}} - 9^{9^{9^{9^{9}}}} + 2", 0.5)
        assert verifier.timeouts == 1
        assert verifier.equivalent("\\frac{1}{2}", "0.5", 60)
    finally:
        verifier.close()
