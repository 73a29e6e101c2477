"""The paired difference of two runs: mean, McNemar's SE for one sample, bootstrap interval."""

from __future__ import annotations

from math import sqrt

import pytest

from mathagent.evals.paired import paired_difference, problem_scores


def test_one_sample_per_problem_gives_mcnemar_standard_error():
    # 10 shared problems: B alone right on 3, A alone right on 1, both right on 4, both wrong 2.
    a = {f"p{i}": float(i in {0, 3, 4, 5, 6}) for i in range(10)}
    b = {f"p{i}": float(i in {1, 2, 7, 3, 4, 5, 6}) for i in range(10)}
    result = paired_difference(a, b)
    assert (result.b_better, result.a_better, result.ties) == (3, 1, 6)
    assert result.accuracy_a == pytest.approx(50) and result.accuracy_b == pytest.approx(70)
    assert result.difference == pytest.approx(20)
    n, nb, nc = 10, 3, 1
    mcnemar = 100 * sqrt(nb + nc - (nb - nc) ** 2 / n) / sqrt(n * (n - 1))
    assert result.se == pytest.approx(mcnemar)
    assert result.ci_low < result.difference < result.ci_high
    # The bootstrap interval is about ±1.96 SE wide (it uses the n, not n − 1, variance).
    assert result.ci_high - result.ci_low == pytest.approx(2 * 1.96 * result.se, rel=0.25)


def test_only_shared_problems_count_and_samples_average():
    records_a = [
        {"id": "x", "sample": 0, "is_correct": True},
        {"id": "x", "sample": 1, "is_correct": False},
        {"id": "only-a", "sample": 0, "is_correct": True},
    ]
    records_b = [{"id": "x", "sample": 0, "is_correct": True}]
    result = paired_difference(problem_scores(records_a), problem_scores(records_b))
    assert result.n == 1 and result.difference == pytest.approx(50) and result.se == 0
    assert (result.b_better, result.a_better) == (1, 0)


def test_disjoint_runs_are_refused():
    with pytest.raises(ValueError, match="share no problem"):
        paired_difference({"a": 1.0}, {"b": 1.0})
