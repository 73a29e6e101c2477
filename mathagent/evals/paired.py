"""Two runs on the same problems: the paired accuracy difference and its uncertainty.

Each problem scores the mean correctness of its samples (pass@1 averaged over samples, as
``pass@1[avg-of-N]``). Over the problems both runs hold, the difference B − A is the mean of
the per-problem differences; its standard error is their standard deviation over √n (the
paired, McNemar-style SE: with one sample per problem it is √(b + c − (b − c)²/n) / √(n(n − 1))
for b, c discordant problems), and the 95% interval is a paired bootstrap over problems
(fixed seed, so a report is reproducible). Pairing removes the problem-difficulty variance that
two independent accuracies would carry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import sqrt
from typing import Any

import numpy as np

from mathagent.evals.metrics import group_by_problem

RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedDifference:
    """B − A over the shared problems, in percentage points; per-problem wins and losses."""

    n: int
    accuracy_a: float
    accuracy_b: float
    difference: float
    se: float
    ci_low: float
    ci_high: float
    b_better: int
    a_better: int
    ties: int
    resamples: int = RESAMPLES


def problem_scores(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per problem id: the share of its samples graded correct (0..1)."""
    return {
        pid: sum(bool(r["is_correct"]) for r in rows) / len(rows)
        for pid, rows in group_by_problem(records).items()
    }


def paired_difference(
    a: Mapping[str, float], b: Mapping[str, float], resamples: int = RESAMPLES, seed: int = 0
) -> PairedDifference:
    """Compare per-problem scores of two runs over the problems both have."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two runs share no problem: nothing to compare")
    xa = np.array([a[p] for p in shared])
    xb = np.array([b[p] for p in shared])
    d = 100 * (xb - xa)
    n = len(shared)
    se = float(d.std(ddof=1) / sqrt(n)) if n > 1 else 0.0
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    low, high = np.percentile(d[draws].mean(axis=1), [2.5, 97.5])
    return PairedDifference(
        n=n,
        accuracy_a=float(100 * xa.mean()),
        accuracy_b=float(100 * xb.mean()),
        difference=float(d.mean()),
        se=se,
        ci_low=float(low),
        ci_high=float(high),
        b_better=int((d > 0).sum()),
        a_better=int((d < 0).sum()),
        ties=int((d == 0).sum()),
        resamples=resamples,
    )
