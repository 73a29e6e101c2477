"""The project's labelled answer pairs (grading_pairs.txt) and the two graders it is measured
against: math-verify alone and plain sympy. Shared by the pair-set test and
benchmarks/grading_bench.py, so both judge the baselines the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

PAIRS_FILE = Path(__file__).with_name("grading_pairs.txt")
CATEGORIES = (
    "latex",
    "fractions",
    "matrices",
    "intervals",
    "sets_tuples",
    "equations",
    "units",
    "percentages",
    "bases",
    "multiple_choice",
    "leading_zeros",
    "scientific",
    "repeating",
    "expressions",
    "near_misses",
)


@dataclass(frozen=True)
class Pair:
    category: str
    predicted: str
    expected: str
    equal: bool  # what a grader should say


def load_pairs(path: Path = PAIRS_FILE) -> list[Pair]:
    """Every pair of the file, in order; a malformed line is an error, not a skip."""
    pairs, category = [], None
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            category = line[3:].strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(" ;; ")
        if len(fields) != 3 or fields[0] not in ("Y", "N") or category not in CATEGORIES:
            raise ValueError(f"{path}:{lineno}: want 'Y|N ;; predicted ;; expected': {line!r}")
        pairs.append(Pair(category, fields[1], fields[2], fields[0] == "Y"))
    return pairs


def math_verify_alone(predicted: str, expected: str) -> bool:
    """math-verify as its README uses it: both answers as inline math, gold first.

    Called on the main thread only (its time limits use signals); ``$...$`` reads more of the
    set right than ``\\boxed{...}``, so the baseline is the stronger of the two.
    """
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        return bool(verify(parse(f"${expected}$"), parse(f"${predicted}$")))
    except Exception:
        return False


def plain_sympy(predicted: str, expected: str) -> bool:
    """sympy alone: its own LaTeX parser (the Lark backend), then ``simplify(a - b) == 0``;
    text that does not parse counts equal only when the strings are."""
    import sympy
    from sympy.parsing.latex import parse_latex

    a_text, b_text = (t.strip().strip("$").strip() for t in (predicted, expected))
    try:
        a, b = parse_latex(a_text, backend="lark"), parse_latex(b_text, backend="lark")
        if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
            return bool(sympy.simplify(a - b) == 0)
        return bool(a == b)
    except Exception:
        return a_text.replace(" ", "") == b_text.replace(" ", "")
