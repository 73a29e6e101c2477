"""Metrics against hand-computed values, ties and the unbiased pass@k included."""

from __future__ import annotations

import pytest

from mathagent.evals.metrics import (
    busy_seconds,
    k_values,
    majority_score,
    pass_at_k,
    speed_metrics,
    summarize,
)


def _rows(pid: str, answers: list[tuple[str | None, bool]]) -> list[dict]:
    return [
        {"id": pid, "sample": i, "predicted_answer": a, "is_correct": ok}
        for i, (a, ok) in enumerate(answers)
    ]


RECORDS = [
    *_rows("p1", [("5", True), ("005", True), ("7", False), (None, False)]),
    *_rows("p2", [("3", False), ("4", True), ("3", False), ("4", True)]),
    *_rows("p3", [(None, False), ("", False), ("9", False), (None, False)]),
]


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 0, 3) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: always a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_majority_ties_share_credit_and_no_answers_do_not_vote():
    assert majority_score([("1", True), ("2", False), ("3", False)]) == pytest.approx(1 / 3)
    assert majority_score([("3", False), ("4", True)]) == 0.5
    assert majority_score([(None, False), (None, False), ("4", True)]) == 1.0
    assert majority_score([(None, False)]) == 0.0
    assert majority_score([("2", False), ("2", False), ("4", True)]) == 0.0


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(4) == [1, 2, 4]
    assert k_values(6) == [1, 2, 4, 6]


def test_summary_accuracy_hand_computed():
    s = summarize(RECORDS)
    assert s["num_entries"] == 3 and s["num_samples"] == 12
    assert s["pass@1[avg-of-4]"] == pytest.approx(100 / 3)
    assert s["majority@1"] == pytest.approx(100 / 3)
    assert s["majority@2"] == pytest.approx(50.0)  # p1: 5 wins; p2: 3-4 tie, half credit
    assert s["majority@4"] == pytest.approx(50.0)  # "5" and "005" vote together
    assert s["pass@1"] == pytest.approx(100 / 3)
    assert s["pass@2"] == pytest.approx(100 * 5 / 9)
    assert s["pass@4"] == pytest.approx(200 / 3)
    assert s["no_answer"] == pytest.approx(100 * 4 / 12)
    assert "acceptance_length" not in s
    assert summarize(RECORDS, acceptance_length=2.5)["acceptance_length"] == 2.5


def test_speed_metrics_hand_computed():
    def rec(tokens: int, latency: float, calls: int, start: float) -> dict:
        return {
            "num_generated_tokens": tokens,
            "latency_s": latency,
            "tool_calls": [{}] * calls,
            "started_at": start,
            "finished_at": start + latency,
        }

    s = speed_metrics([rec(100, 2.0, 1, 0), rec(60, 2.0, 0, 1), rec(40, 1.0, 2, 5)])
    assert s["avg_tokens"] == pytest.approx(200 / 3)
    assert s["tool_calls_per_solution"] == 1.0
    assert s["gen_seconds"] == 4.0  # [0,3] and [5,6]: the gap of a resumed run is not counted
    assert s["tokens_per_s"] == 50.0
    assert s["per_request_tokens_per_s"] == pytest.approx((50 + 30 + 40) / 3)
    assert s["latency_p50_s"] == 2.0
    assert s["latency_p90_s"] == pytest.approx(2.0)


def test_busy_seconds_merges_overlaps():
    assert busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy_seconds([(0, 10), (2, 3)]) == 10
    assert busy_seconds([]) == 0


def test_majority_clusters_answers_by_the_graders_equivalence():
    # Three spellings of one value outvote two threes, as the agent's vote counts them.
    answers = [("\\sqrt{8}", True), ("2\\sqrt{2}", True), ("\\sqrt{2} \\cdot 2", True)]
    rows = _rows("p", [*answers, ("3", False), ("3", False)])
    assert summarize(rows)["majority@5"] == 100.0
    assert summarize(rows)["majority@2"] == 100.0
