"""Grading: is a predicted answer the expected one?

Contest answers are normalised first (wrappers, units, degrees, percent, thousands separators,
leading zeros, multiple-choice letters, scientific notation, repeating decimals, AIMO's
"modulo 1000"); what is still undecided goes to math-verify, gold first, under a hard deadline
enforced by :mod:`mathagent.evals.verifier`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from mathagent.evals.verifier import default_verifier

DEFAULT_TIMEOUT_S = 5.0

_WRAPPERS = ("boxed", "fbox", "text", "textbf", "textrm", "textit", "mathrm", "mathbf", "mbox")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\\circ")
_PERCENT = re.compile(r"\\?%")
_SPACES = re.compile(r"\\[,;:! ]|~")
_CHOICE = re.compile(r"^\(?\s*([A-Ea-e])\s*\)?[.:]?(?:\s+.*)?$")
_ASSIGN = re.compile(r"^[A-Za-z]\w*\s*=\s*(?=[-+\d.\\])")
_UNITS = re.compile(r"^([-+]?[\d,]*\.?\d+)\s+[A-Za-z][A-Za-z0-9\s./^{}-]*$")
_INT = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)$")
_DEC = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d*)\.\d*$")
_SCI = re.compile(
    r"^([-+]?\d*\.?\d+)\s*(?:[eE]\s*([-+]?\d+)|(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)$"
)
_REPEAT = re.compile(
    r"^([-+]?)(\d*)\.(\d*)(?:\\overline\{(\d+)\}|\((\d+)\)|\\dot\{(\d)\}(?:(\d*)\\dot\{(\d)\})?)$"
)
_FRAC = re.compile(r"^([-+]?)\\[dt]?frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))$")
_SLASH = re.compile(r"^([-+]?\d+)\s*/\s*(\d+)$")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        tail = text[start:].split(None, 1)  # "\boxed 5" form
        return tail[1].split("$")[0].strip() if len(tail) > 1 else None
    content = _braced(text, brace)
    return None if content is None else content.strip()


def _braced(text: str, brace: int) -> str | None:
    """The text inside the brace group opening at ``text[brace]``; None when unbalanced."""
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def _unwrap(text: str) -> str:
    """Replace ``\\text{X}``-style wrappers (and ``\\boxed{X}``) by X."""
    pattern = re.compile(r"\\(" + "|".join(_WRAPPERS) + r")\s*\{")
    while match := pattern.search(text):
        content = _braced(text, match.end() - 1)
        if content is None:
            break
        text = text[: match.start()] + content + text[match.end() + len(content) + 1 :]
    return text


def normalize_answer(text: str) -> str:
    """Contest-answer normal form: wrappers, $, units, degrees and percent removed."""
    text = str(text).strip()
    if (boxed := extract_boxed(text)) is not None:
        text = boxed
    text = _unwrap(text).replace("\\left", "").replace("\\right", "").replace("{,}", ",")
    text = _SPACES.sub(" ", text).strip()
    for a, b in (("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if text.startswith(a) and text.endswith(b) and len(text) >= len(a) + len(b):
            text = text[len(a) : len(text) - len(b)].strip()
    text = text.removeprefix("\\$").removeprefix("$").strip()
    text = _PERCENT.sub("", _DEGREES.sub("", text)).strip()
    text = _ASSIGN.sub("", text)
    if units := _UNITS.match(text):
        text = units.group(1)
    return text.rstrip(".").strip() if not text.endswith("..") else text


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter A-E of an answer like ``B``, ``(B)`` or ``(B) 42``."""
    match = _CHOICE.match(normalize_answer(text))
    return match.group(1).upper() if match else None


def parse_number(text: str) -> Fraction | None:
    """An exact value for plain numeric answers (already normalised); None for anything else."""
    text = text.replace(" ", "") if re.fullmatch(r"[-+]?\d{1,3}( \d{3})+", text) else text
    if _INT.match(text) or (_DEC.match(text) and any(c.isdigit() for c in text)):
        return Fraction(text.replace(",", "").rstrip(".") or "0")
    if sci := _SCI.match(text):
        exponent = int(sci.group(2) or sci.group(3))
        return Fraction(sci.group(1)) * Fraction(10) ** exponent
    if rep := _REPEAT.match(text):
        return _repeating(rep)
    if frac := _FRAC.match(text):
        num, den = int(frac.group(2) or frac.group(3)), int(frac.group(4) or frac.group(5))
        return None if den == 0 else Fraction(-num if frac.group(1) == "-" else num, den)
    if slash := _SLASH.match(text):
        den = int(slash.group(2))
        return None if den == 0 else Fraction(int(slash.group(1)), den)
    return None


def _repeating(match: re.Match[str]) -> Fraction:
    """``0.1\\overline{6}``, ``0.1(6)`` and ``0.\\dot{1}4\\dot{2}`` as exact fractions."""
    sign, whole, fixed = match.group(1), match.group(2) or "0", match.group(3)
    if match.group(6) is not None:  # \dot marks the first and last repeated digit
        cycle = match.group(6) + (match.group(7) + match.group(8) if match.group(8) else "")
    else:
        cycle = match.group(4) or match.group(5)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(cycle), (10 ** len(cycle) - 1) * 10 ** len(fixed))
    return -value if sign == "-" else value


def _as_latex(text: str, number: Fraction | None) -> str:
    """What math-verify sees: exact numbers as fractions, everything else as normalised."""
    if number is None:
        return text
    if number.denominator == 1:
        return str(number.numerator)
    sign = "-" if number < 0 else ""
    return f"{sign}\\frac{{{abs(number.numerator)}}}{{{number.denominator}}}"


def answers_match(
    predicted: str | None,
    expected: str,
    *,
    modulo: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> bool:
    """True when ``predicted`` is the ``expected`` answer.

    ``modulo`` (e.g. 1000 for AIMO 1/2) compares integer answers modulo that number, as the
    competition asked for the answer modulo it. ``timeout_s`` bounds the symbolic comparison;
    an overrun counts as no match. Safe to call from any thread.
    """
    if predicted is None or not str(predicted).strip():
        return False
    pred, gold = normalize_answer(predicted), normalize_answer(expected)
    if not pred:
        return False
    if gold.strip("() .:") in {"A", "B", "C", "D", "E"}:
        gold_letter = gold.strip("() .:")
        return choice_letter(pred) == gold_letter
    pred_num, gold_num = parse_number(pred), parse_number(gold)
    if modulo and gold_num is not None and gold_num.denominator == 1:
        return (
            pred_num is not None
            and pred_num.denominator == 1
            and pred_num.numerator % modulo == gold_num.numerator % modulo
        )
    if pred_num is not None and gold_num is not None:
        return pred_num == gold_num
    if pred == gold:
        return True
    return default_verifier().equivalent(
        _as_latex(gold, gold_num), _as_latex(pred, pred_num), timeout_s
    )


def canonical_answer(answer: str | None) -> str | None:
    """A key that equal simple answers share (for majority voting); None for no answer."""
    if answer is None or not str(answer).strip():
        return None
    text = normalize_answer(answer)
    if (number := parse_number(text)) is not None:
        return str(number)
    return re.sub(r"\s+", "", text) or None
