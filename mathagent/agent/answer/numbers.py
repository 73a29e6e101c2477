"""Exact values of numeric answers in the forms math-verify cannot read or reads loosely.

Integers (thousands separators, leading zeros), decimals, ``\\frac``/slash fractions, mixed
numbers, scientific notation (``1.5e3``, ``1.5 \\times 10^{3}``), repeating decimals
(``0.\\overline{3}``, ``0.1(6)``, ``0.\\dot{1}4\\dot{2}``, ``0.\\bar{3}``), decimals cut off with an
ellipsis (``0.333...``) and integers in a base (``1010_2``, ``FF_{16}``, ``321_{\\text{five}}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_INT = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)$")
_DEC = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d*)\.(\d*)$")
_SCI = re.compile(
    r"^([-+]?\d*\.?\d+)\s*(?:[eE]\s*([-+]?\d+)|(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)$"
)
_REPEAT = re.compile(
    r"^([-+]?)(\d*)\.(\d*)(?:\\(?:overline|bar)\{(\d+)\}|\\bar(\d)|\((\d+)\)|\\dot\{(\d)\}(?:(\d*)\\dot\{(\d)\})?)$"
)
_ELLIPSIS = re.compile(r"^([-+]?\d*\.(\d+))\s*(?:\.\.\.|\\ldots|\\cdots|\\dots|…)$")
_ARG = r"(?:\{\s*([-+]?\d+)\s*\}|(\d))"  # a \frac argument: {12} or a single digit
_FRAC = re.compile(rf"^([-+]?)\s*(\d+\s*)?\\[dt]?frac\s*{_ARG}\s*{_ARG}$")
_SLASH = re.compile(r"^([-+]?\d+)\s*/\s*([-+]?\d+)$")
_SPACED_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?: \d{3})+")
_BASE = re.compile(
    r"^\(?([0-9A-Za-z]+)\)?_\s*(?:\{\s*\(?\s*([^{}()]+?)\s*\)?\s*\}|\(\s*(\d+)\s*\)|(\d))$"
)
_BASE_WORDS = {
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "sixteen": 16,
}


@dataclass(frozen=True)
class Number:
    """An exact value; ``cut`` is the digits shown after the point when an ellipsis follows."""

    value: Fraction
    cut: int | None = None


def parse_number(text: str) -> Number | None:
    """The exact value of a plain numeric answer (already normalised); None for anything else."""
    text = text.strip()
    if _SPACED_THOUSANDS.fullmatch(text):
        text = text.replace(" ", "")
    if _INT.match(text):
        return Number(Fraction(text.replace(",", "")))
    if _DEC.match(text) and any(c.isdigit() for c in text):
        return Number(Fraction(text.replace(",", "").rstrip(".") or "0"))
    if sci := _SCI.match(text):
        exponent = int(sci.group(2) or sci.group(3))
        return Number(Fraction(sci.group(1)) * Fraction(10) ** exponent)
    if rep := _REPEAT.match(text):
        return Number(_repeating(rep))
    if cut := _ELLIPSIS.match(text):
        return Number(Fraction(cut.group(1)), cut=len(cut.group(2)))
    if frac := _FRAC.match(text):
        return _fraction(frac)
    if slash := _SLASH.match(text):
        den = int(slash.group(2))
        return None if den == 0 else Number(Fraction(int(slash.group(1)), den))
    return None


def _fraction(match: re.Match[str]) -> Number | None:
    """``\\frac{a}{b}``, ``\\dfrac12`` and the mixed number ``3\\frac{1}{2}`` (= 7/2)."""
    num, den = int(match.group(3) or match.group(4)), int(match.group(5) or match.group(6))
    if den == 0:
        return None
    value = Fraction(num, den)
    if match.group(2):
        if value < 0:
            return None  # "3\frac{-1}{2}" is no mixed number
        value += int(match.group(2))
    return Number(-value if match.group(1) == "-" else value)


def _repeating(match: re.Match[str]) -> Fraction:
    """``0.1\\overline{6}``, ``0.1(6)`` and ``0.\\dot{1}4\\dot{2}`` as exact fractions."""
    sign, whole, fixed = match.group(1), match.group(2) or "0", match.group(3)
    if match.group(7) is not None:  # \dot marks the first and last repeated digit
        cycle = match.group(7) + (match.group(8) + match.group(9) if match.group(9) else "")
    else:
        cycle = match.group(4) or match.group(5) or match.group(6)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(cycle), (10 ** len(cycle) - 1) * 10 ** len(fixed))
    return -value if sign == "-" else value


def numbers_equal(a: Number, b: Number) -> bool:
    """Exactly equal, or one is the other's expansion cut off where its ellipsis stands."""
    if a.value == b.value:
        return True
    for shown, other in ((a, b), (b, a)):
        if shown.cut is not None and other.cut is None:
            # "0.333..." is 1/3 cut at its last shown digit, "0.667..." 2/3 rounded there.
            step, gap = Fraction(1, 10**shown.cut), abs(other.value) - abs(shown.value)
            return (other.value < 0) == (shown.value < 0) and -step / 2 <= gap < step
    return False


@dataclass(frozen=True)
class BaseNumber:
    """Digits written in a base (``base`` None: bare digits, as a base answer without its tag)."""

    digits: str
    base: int | None


def parse_base(text: str) -> BaseNumber | None:
    """``1010_2``, ``(1010)_2``, ``FF_{16}``, ``321_{\\text{five}}``; None for anything else
    (a subscripted variable such as ``a_2`` has a digit its base lacks)."""
    match = _BASE.match(text.strip())
    if match is None:
        return None
    tag = (match.group(2) or match.group(3) or match.group(4)).strip()
    tag = re.sub(r"^\\(?:text|mathrm)\s*\{\s*(\w+)\s*\}$", r"\1", tag)
    base = int(tag) if tag.isdigit() else _BASE_WORDS.get(tag.lower())
    digits = match.group(1).upper().lstrip("0") or "0"
    if base is None or not 2 <= base <= 36 or any(int(d, 36) >= base for d in digits):
        return None
    return BaseNumber(digits, base)


def bare_digits(text: str) -> BaseNumber | None:
    """An answer of bare digits (compared with a base answer digit by digit)."""
    text = text.strip()
    return BaseNumber(text.lstrip("0") or "0", None) if re.fullmatch(r"\d+", text) else None
