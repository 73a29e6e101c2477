"""The project's labelled pair set (grading_pairs.txt): the grader gives every label, and the
agent's vote puts a pair into one cluster exactly when the grader calls it equal.

Slow-ish (about a minute on 2 busy cores) because it grades the whole set, 915 pairs, most
through the math-verify child, three times: once for the labels and twice for the vote (both
sample orders). benchmarks/grading_bench.py measures math-verify alone and sympy on it too.
"""

from __future__ import annotations

import pytest

from mathagent.agent.solver import majority_vote
from mathagent.evals.grading import answers_match
from tests.evals.grading_pairs import CATEGORIES, Pair, load_pairs

PAIRS = load_pairs()
DECOY = "-7777777.77"  # an answer equal to none of the set's


def _of(category: str) -> list[Pair]:
    return [p for p in PAIRS if p.category == category]


def test_the_set_is_large_and_covers_every_category(tmp_path):
    assert len(PAIRS) >= 500
    assert {p.category for p in PAIRS} == set(CATEGORIES)
    assert all(len(_of(c)) >= 30 for c in CATEGORIES)
    assert len({(p.predicted, p.expected) for p in PAIRS}) == len(PAIRS), "a pair repeats"
    bad = tmp_path / "bad.txt"
    bad.write_text("## latex\nY ;; 1\n")
    with pytest.raises(ValueError):
        load_pairs(bad)


@pytest.mark.parametrize("category", CATEGORIES)
def test_the_grader_gives_every_label(category):
    wrong = [p for p in _of(category) if answers_match(p.predicted, p.expected) != p.equal]
    assert wrong == []


@pytest.mark.parametrize("category", CATEGORIES)
def test_the_vote_agrees_with_the_grader(category):
    disagree = []
    for p in _of(category):
        equal = answers_match(p.predicted, p.expected)
        gold_first = majority_vote([DECOY, p.expected, p.predicted]) == p.expected
        predicted_first = majority_vote([DECOY, p.predicted, p.expected]) == p.predicted
        if not gold_first == predicted_first == equal:
            disagree.append(p)
    assert disagree == []
