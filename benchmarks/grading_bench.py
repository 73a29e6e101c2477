"""Grading benchmark: accuracy per category of the project's grader, math-verify alone and plain
sympy on the project's labelled pairs (tests/evals/grading_pairs.txt), in one run.

Also lists the pairs where math-verify is right and the project wrong (goal: none) and checks
that the vote agrees with the grader on every pair, in both orders: ``majority_vote([decoy,
gold, predicted])`` returns the gold, and ``majority_vote([decoy, predicted, gold])`` the
prediction, exactly when the grader calls the pair equal. Times are milliseconds per pair, each
grader warmed up first (the project's math-verify child started, sympy imported). Prints one
JSON object.

    python benchmarks/grading_bench.py [--pairs PATH]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mathagent.agent.answer.verifier import default_verifier  # noqa: E402
from mathagent.agent.solver import majority_vote  # noqa: E402
from mathagent.evals.grading import answers_match  # noqa: E402
from tests.evals.grading_pairs import (  # noqa: E402
    PAIRS_FILE,
    Pair,
    load_pairs,
    math_verify_alone,
    plain_sympy,
)

DECOY = "-7777777.77"  # an answer equal to none of the set's
PAIR_LIMIT_S = 10  # a baseline stuck on one pair counts it wrong rather than stall the run


def _bounded(judge: Callable[[str, str], bool], pair: Pair) -> bool:
    def stop(signum: int, frame: object) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(PAIR_LIMIT_S)
    try:
        return judge(pair.predicted, pair.expected)
    except TimeoutError:
        return not pair.equal
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _vote_agrees(pair: Pair, equal: bool) -> bool:
    """The vote joins the pair into one cluster, in either sample order, exactly when ``equal``."""
    first = majority_vote([DECOY, pair.expected, pair.predicted]) == pair.expected
    second = majority_vote([DECOY, pair.predicted, pair.expected]) == pair.predicted
    return first == second == equal


def run(pairs: list[Pair]) -> dict:
    graders = {
        "project": lambda p, g: answers_match(p, g),
        "math_verify": math_verify_alone,
        "sympy": plain_sympy,
    }
    default_verifier().equivalent("x", "x", 120)  # start the child before timing
    for judge in graders.values():
        judge("\\frac{1}{2}", "0.5")
    right: dict[str, dict[str, int]] = {name: defaultdict(int) for name in graders}
    seconds = dict.fromkeys(graders, 0.0)
    totals: dict[str, int] = defaultdict(int)
    lost, disagreements = [], []
    for pair in pairs:
        totals[pair.category] += 1
        verdicts = {}
        for name, judge in graders.items():
            started = time.perf_counter()
            verdicts[name] = _bounded(judge, pair)
            seconds[name] += time.perf_counter() - started
            right[name][pair.category] += verdicts[name] == pair.equal
        if verdicts["math_verify"] == pair.equal != verdicts["project"]:
            lost.append([pair.category, pair.predicted, pair.expected])
        if not _vote_agrees(pair, verdicts["project"]):
            disagreements.append([pair.category, pair.predicted, pair.expected])
    categories = {
        cat: {name: f"{right[name][cat]}/{n}" for name in graders} for cat, n in totals.items()
    }
    overall = {name: sum(right[name].values()) for name in graders}
    return {
        "pairs": len(pairs),
        "accuracy": {name: round(100 * overall[name] / len(pairs), 2) for name in graders},
        "correct": overall,
        "categories": categories,
        "math_verify_right_project_wrong": lost,
        "vote_grader_disagreements": disagreements,
        "ms_per_pair": {name: round(1000 * s / len(pairs), 2) for name, s in seconds.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, default=PAIRS_FILE)
    args = parser.parse_args()
    print(json.dumps(run(load_pairs(args.pairs)), indent=2))


if __name__ == "__main__":
    main()
