"""Final-answer extraction and the majority vote."""

from __future__ import annotations

import pytest

from mathagent.agent.answer import extract_answer, normalize
from mathagent.agent.solver import majority_vote


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{396}.", "396"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{a^{2}+b^{2}}} done", "\\sqrt{a^{2}+b^{2}}"),
        ("\\boxed{5} and an unclosed \\boxed{6", "5"),
        ("\\fbox{7}", "7"),
        ("The final answer is 42.", "42"),
        ("The final answer is: $3\\pi$\nThanks", "3\\pi"),
        ("no answer here", None),
        ("\\boxed{}", None),
        ("", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_normalize():
    assert normalize(" $42$. ") == "42"
    assert normalize("\\text{yes}") == "yes"


def test_majority_vote():
    assert majority_vote(["3", "4", "4", None]) == "4"
    assert majority_vote(["4 ", "3", "$4$"]) == "4 "
    assert majority_vote(["1", "2"]) == "1"  # tie: the earliest sample wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None
