"""Final-answer extraction and the majority vote, read the same way by the agent and evals."""

from __future__ import annotations

import pytest

from mathagent.agent.answer import extract_answer, normalize_answer
from mathagent.agent.solver import majority_vote

HARMONY_FINAL = (
    "<|channel|>analysis<|message|>maybe \\boxed{3}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>So \\boxed{4}.<|return|>"
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{396}.", "396"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{a^{2}+b^{2}}} done", "\\sqrt{a^{2}+b^{2}}"),
        # Cut inside its last box: the model was still writing it (NeMo-Skills' search_boxed).
        ("\\boxed{5} and an unclosed \\boxed{6", None),
        ("the answer is $\\boxed 5$.", "5"),
        ("\\boxed 42\nmore text", "42"),
        ("\\fbox{7}", "7"),
        ("The final answer is 42.", "42"),
        ("The final answer is: $3\\pi$\nThanks", "3\\pi"),
        ("Final Answer: The final answer is $5$. I hope it is correct.", "5"),
        ("The final answer is 3.5.", "3.5"),
        ("The final answer is \\(\\frac{1}{2}\\).", "\\frac{1}{2}"),
        ("Comparing the options, the answer is (B).", "B"),
        ("Answer: C", "C"),
        ("the answer is a prime", None),
        ("<think>\\boxed{1}</think>so \\boxed{2}", "2"),
        ("<think>still thinking \\boxed{1}", None),
        (HARMONY_FINAL, "4"),
        ("<|channel|>analysis<|message|>\\boxed{3}<|end|>", None),
        ("no answer here", None),
        ("\\boxed{}", None),
        ("", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_normalize_answer():
    assert normalize_answer(" $42$. ") == "42"
    assert normalize_answer("\\text{yes}") == "yes"
    assert normalize_answer("\\boxed 5") == "5"


def test_majority_vote():
    assert majority_vote(["3", "4", "4", None]) == "4"
    assert majority_vote(["4 ", "3", "$4$"]) == "4 "
    assert majority_vote(["1", "2"]) == "1"  # tie: the earliest sample wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_majority_vote_clusters_by_the_graders_equivalence():
    assert majority_vote(["1/2", "\\frac{1}{2}", "0.5", "3", "3"]) == "1/2"
    assert majority_vote(["3", "\\frac{1}{2}", "0.5", "3", "1/2"]) == "\\frac{1}{2}"
    assert majority_vote(["x = 2", "2", "y = 3"]) == "x = 2"
