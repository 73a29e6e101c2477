"""Is one answer the other? The one equivalence of the grader, the vote and the report.

math-verify decides, on the answers' normal forms (:mod:`.normal`), gold first, in a child
process with a hard deadline (:mod:`.verifier`). A rule decides before it only where
math-verify is wrong or cannot read the form, each with a test that fails without it
(tests/agent/test_answer_rules.py): multiple-choice letters and the value written with a choice,
assignments against a tuple (:mod:`.assignments`), a brace set against a tuple, integers in a
base, AIMO's modulo, and the numeric forms of :mod:`.numbers` (repeating decimals, scientific
notation, ellipses, percentages against their fractions). Two exact numbers that differ are
unequal; a decimal or percentage the rules find unequal still goes to math-verify, so its float
rounding (``0.3333333 = 1/3``) stays. When math-verify finds the normal forms unequal it is
asked again about the answers as written, so the layer never loses an "equal" that math-verify
gives them.
"""

from __future__ import annotations

import re
from functools import lru_cache

from mathagent.agent.answer.assignments import assigned_values, tuple_elements
from mathagent.agent.answer.normal import Prepared, choice_letter, prepare, stated_choice
from mathagent.agent.answer.numbers import (
    Number,
    bare_digits,
    numbers_equal,
    parse_base,
    parse_number,
)
from mathagent.agent.answer.verifier import default_verifier

DEFAULT_TIMEOUT_S = 5.0

# Thousands separators inside an expression ("1,000 + 24"); lists and tuples keep theirs.
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_DECIMAL = re.compile(r"[-+]?[\d,]*\.\d+")
_INEXACT = re.compile(r"[.eE]|\\times|\\cdot|x")


def answers_match(
    predicted: str | None,
    expected: str,
    *,
    modulo: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> bool:
    """True when ``predicted`` is the ``expected`` answer.

    ``modulo`` (e.g. 1000 for AIMO 1/2) compares integer answers modulo that number, as the
    competition asked for the answer modulo it. ``timeout_s`` bounds each symbolic comparison;
    an overrun counts as no match. Safe to call from any thread.
    """
    if predicted is None or not str(predicted).strip():
        return False
    pred, gold = prepare(predicted), prepare(expected)
    if not pred.text:
        return False
    verdict = _rules(pred, gold, modulo, timeout_s)
    if verdict is not None:
        return verdict
    verifier = default_verifier()
    if verifier.equivalent(_for_verify(gold), _for_verify(pred), timeout_s):
        return True
    raw_gold, raw_pred = str(expected).strip(), str(predicted).strip()
    if (raw_gold, raw_pred) == (_for_verify(gold), _for_verify(pred)):
        return False
    return verifier.equivalent(raw_gold, raw_pred, timeout_s)


def _rules(pred: Prepared, gold: Prepared, modulo: int | None, timeout_s: float) -> bool | None:
    """The layer's verdict where it has one; None hands the pair to math-verify."""
    again = {"modulo": modulo, "timeout_s": timeout_s}  # for the parts compared on their own
    if (choice := stated_choice(gold)) is not None:
        letter, value = choice
        picked = choice_letter(pred)
        if picked is None and value:  # "12" for "(B) 12": the choice's value
            return answers_match(pred.text, value, **again)
        return picked == letter
    if (choice := stated_choice(pred)) is not None and choice[1]:
        # "(B) 12" for "12": the value of the choice it picks (as "12" for "(B) 12" above)
        return answers_match(choice[1], _written(gold), **again)
    if _set_against_tuple(pred.text, gold.text):
        return False
    if (named := _named_values(pred.text, gold.text, timeout_s)) is not None:
        return named
    base = _bases(pred.text, gold.text)
    if base is not None:
        return base
    pred_num, gold_num = parse_number(pred.text), parse_number(gold.text)
    if modulo and gold_num is not None and gold_num.value.denominator == 1 and not gold.percent:
        return (
            pred_num is not None
            and pred_num.value.denominator == 1
            and pred_num.value.numerator % modulo == gold_num.value.numerator % modulo
        )
    if pred_num is not None and gold_num is not None:
        if _numbers_match(pred_num, pred.percent, gold_num, gold.percent):
            return True
        # Two exact values (integers, fractions) differ for math-verify too; only a decimal
        # or a percentage leaves it something to round, so only those go on to it.
        return False if _exact(pred) and _exact(gold) else None
    if pred.text.replace(" ", "") == gold.text.replace(" ", "") and pred.percent == gold.percent:
        return True
    return None


def _exact(answer: Prepared) -> bool:
    """A number written without a decimal point, exponent or percent sign."""
    return not answer.percent and not _INEXACT.search(answer.text)


def _written(answer: Prepared) -> str:
    """A prepared answer as text again (its percent sign back)."""
    return f"{answer.text}\\%" if answer.percent else answer.text


def _set_against_tuple(pred: str, gold: str) -> bool:
    """A set in braces against a tuple or interval in parentheses: math-verify finds
    ``\\{1, 2\\}`` equal to ``(1, 2)``, though the one has no order and the other is ordered
    (or an interval)."""
    for left, right in ((pred, gold), (gold, pred)):
        plain_set = left.startswith("\\{") and left.endswith("\\}") and "(" not in left
        if plain_set and tuple_elements(right):
            return True
    return False


def _named_values(pred: str, gold: str, timeout_s: float) -> bool | None:
    """Assignments against a tuple (:mod:`.assignments`): the values in their variables' order,
    element by element; None where neither side is such a pair."""
    for named, other in ((pred, gold), (gold, pred)):
        values, elements = assigned_values(named), tuple_elements(other)
        if values is not None and elements is not None:
            return len(values) == len(elements) and all(
                answers_match(v, e, timeout_s=timeout_s)
                if named is pred
                else answers_match(e, v, timeout_s=timeout_s)
                for v, e in zip(values, elements, strict=True)
            )
    return None


def _bases(pred: str, gold: str) -> bool | None:
    """Digits and base compared where either side is written in a base (math-verify drops the
    base: it finds ``12_3`` equal to ``12_4``); a bare-digit side matches the same digits."""
    pred_base, gold_base = parse_base(pred), parse_base(gold)
    if pred_base is None and gold_base is None:
        return None
    pred_base = pred_base or bare_digits(pred)
    gold_base = gold_base or bare_digits(gold)
    if pred_base is None or gold_base is None:
        return None
    same_base = None in (pred_base.base, gold_base.base) or pred_base.base == gold_base.base
    return same_base and pred_base.digits == gold_base.digits


def _numbers_match(pred: Number, pred_pct: bool, gold: Number, gold_pct: bool) -> bool:
    """Equal values; a percentage also matches its number with or without the sign
    (``25\\%`` is ``25`` and ``0.25``)."""
    if numbers_equal(pred, gold):
        return True
    hundredth = Number(pred.value / 100, pred.cut)
    if pred_pct and numbers_equal(hundredth, gold):
        return True
    return gold_pct and numbers_equal(pred, Number(gold.value / 100, gold.cut))


def _for_verify(answer: Prepared) -> str:
    """What math-verify sees: exact values of the forms it cannot read, the rest as written
    (a decimal stays a decimal, so math-verify's float rounding applies to it)."""
    text, number = answer.text, parse_number(answer.text)
    if number is None:
        if not re.search(r"[()\[\]{}]", text):
            text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    elif _DECIMAL.fullmatch(text):
        text = text.replace(",", "")
    elif number.cut is None:
        value = number.value
        sign = "-" if value < 0 else ""
        text = (
            str(value.numerator)
            if value.denominator == 1
            else f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
        )
    return f"{text}\\%" if answer.percent else text


@lru_cache(maxsize=4096)
def same_answer(answer: str, representative: str) -> bool:
    """``answer`` is ``representative`` under :func:`answers_match` (memoised: a vote asks
    about the same pairs again as samples finish)."""
    return answers_match(answer, representative)


def cluster_answers(answers: list[str | None]) -> list[int | None]:
    """A cluster number per answer (None for no answer): each joins the first earlier
    cluster whose first answer it matches, in sample order."""
    representatives: list[str] = []
    labels: list[int | None] = []
    for answer in answers:
        if answer is None or not prepare(answer).text:
            labels.append(None)
            continue
        label = next((i for i, rep in enumerate(representatives) if same_answer(answer, rep)), None)
        if label is None:
            label = len(representatives)
            representatives.append(answer)
        labels.append(label)
    return labels
