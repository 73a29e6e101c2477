"""Each rule the answer module adds to math-verify, on a pair where math-verify alone is wrong.

A case checks both halves: the project's verdict is the right one, and math-verify alone (as its
README uses it, tests/evals/grading_pairs.py) gives the other. So each case fails without its
rule, and a rule that stops being needed (math-verify fixed upstream) shows up here.
"""

from __future__ import annotations

import pytest

from mathagent.agent.answer import answers_match
from tests.evals.grading_pairs import math_verify_alone

COLUMN = "\\begin{pmatrix}1\\\\2\\end{pmatrix}"
# (rule, predicted, expected, equal)
RULES = [
    ("choice letter with its value", "\\textbf{(B) }12", "B", True),
    ("the value of the reference's choice", "12", "(B) 12", True),
    ("the value of the predicted choice", "(C) 7", "7", True),
    ("assignments against a tuple: swapped values", "(3, 2)", "x = 2, y = 3", False),
    ("assignments in their variables' order", "y = 3, x = 2", "(2, 3)", True),
    ("a brace set is no tuple", "\\{1, 2\\}", "(1, 2)", False),
    ("base kept: same digits, other base", "12_3", "12_4", False),
    ("base in parentheses", "(1010)_2", "1010_2", True),
    ("base as a word", "321_5", "321_{\\text{six}}", False),
    ("repeating decimal", "0.\\overline{45}", "\\frac{5}{11}", True),
    ("decimal cut by an ellipsis", "0.333...", "\\frac{1}{3}", True),
    ("scientific notation with x", "7.5 x 10^2", "750", True),
    ("scientific notation with e", "1.5e3", "1500", True),
    ("a percentage against its number", "12.5\\%", "12.5", True),
    ("a percentage against a decimal of it", "45\\%", "45.0", True),
    ("the word percent", "8 \\text{ percent}", "0.08", True),
    ("unit words", "18 dollars", "18", True),
    ("nested text wrappers", "\\text{\\textbf{5}}", "5", True),
    ("row break with a length", "\\begin{pmatrix} 1 \\\\[2pt] 2 \\end{pmatrix}", COLUMN, True),
    ("spacing ~ in a matrix", "\\begin{pmatrix}~1~\\\\~2~\\end{pmatrix}", COLUMN, True),
    ("thousands separator inside an expression", "1{,}000 + 234", "1234", True),
    ("\\lbrace", "\\left\\lbrace 1, 2 \\right\\rbrace", "\\{1, 2\\}", True),
    ("degrees inside a trig function", "\\sin 30^\\circ", "\\frac{1}{2}", True),
    ("empty set spellings", "\\emptyset", "\\varnothing", True),
    ("an inequality against its interval", "x > 1", "(1, \\infty)", True),
    (
        "inequalities joined by or",
        "x < -1 \\text{ or } x > 1",
        "(-\\infty, -1) \\cup (1, \\infty)",
        True,
    ),
    ("the imaginary unit", "e^{i\\pi}", "-1", True),
]


@pytest.mark.parametrize(
    ("rule", "predicted", "expected", "equal"), RULES, ids=[r[0] for r in RULES]
)
def test_rule_is_right_where_math_verify_alone_is_wrong(rule, predicted, expected, equal):
    assert answers_match(predicted, expected) is equal, rule
    assert math_verify_alone(predicted, expected) is not equal, f"math-verify is right: {rule}"
