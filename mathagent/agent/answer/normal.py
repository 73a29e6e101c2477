"""The normal form of a stated answer: what is left once its wrapping is taken off.

Lossless steps only, so math-verify still sees the mathematics: the box, ``\\text``-style
wrappers, ``\\left``/``\\right``, math delimiters, currency signs, degree marks, spacing commands
(never the ``\\\\`` of a matrix row), an "Answer:" prefix and the final period; the percent sign
and trailing units are taken off and remembered (``Prepared.percent``) or dropped (units).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mathagent.agent.answer.assignments import split_top
from mathagent.agent.answer.extract import braced, last_boxed
from mathagent.agent.answer.numbers import parse_number

_WRAPPERS = ("boxed", "fbox", "text", "textbf", "textrm", "textit", "mathrm", "mathbf", "mbox")
_WRAPPER = re.compile(r"\\(" + "|".join(_WRAPPERS) + r")\s*\{")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\\circ")
_PERCENT = re.compile(r"\s*(?:\\%|%|\bpercent)\s*$")
# Matched left to right, so a row break `\\` (with its optional `[2pt]`) is taken whole and a
# spacing command after it (`\\\ `) is still seen: rows keep their break, spacing becomes a space.
_SPACES = re.compile(r"(\\\\)(?:\[[^\]]*\])?|\\[,;:! ]|~|\\q?quad\b")
_PREFIX = re.compile(r"^(?i:(?:the\s+)?(?:final\s+)?answer(?:\s+is)?)\s*[:=]?\s*")
# Trailing units: words (a single letter only where it is a unit, never a variable like x or n),
# each with an optional power, joined by spaces or "/": "18 cm^2", "5 km/h", "3 in."
_UNIT = r"(?:[A-Za-z]{2,}|[mgshlLKJNWV])\.?(?:\^\{?-?\d\}?)?"
_UNITS = re.compile(rf"^([-+]?[\d,]*\.?\d+)\s+{_UNIT}(?:(?:\s*/\s*|\s+){_UNIT})*$")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)\b")
_DEGREE_VALUE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)")
# A reference choice: "B", "(B)", or a letter with its value: "(B) 12", "B. 12", "B) 12", "B: 12".
_CHOICE_GOLD = re.compile(r"^\(?([A-E])\)?$|^(?:\(([A-Ea-e])\)|([A-E])[.:)])\s*(\S.*)$")
_CHOICE = re.compile(r"^\(\s*([A-Ea-e])\s*\)(?:\s*.*)?$|^([A-Ea-e])(?:[.:)](?:\s*.*)?)?$")
# "2 and 3", "x = 3 \\text{ or } x = -3": a list, as math-verify reads "2, 3"
_CONJUNCTION = re.compile(r"\s*(?:\\text\s*\{\s*(?:and|or)\s*\}|\s(?:and|or)\s)\s*")
# Inline math delimiters; never the "\\(" of a row break followed by "(", never a currency "\\$".
_INLINE_MATH = re.compile(r"(?<!\\)\\[()]|(?<!\\)\$")
_BRACES = {"\\lbrace": "\\{", "\\rbrace": "\\}"}
_EMPTY_SET = re.compile(r"\\varnothing|^\\\{\s*\\\}$")


@dataclass(frozen=True)
class Prepared:
    """An answer in normal form; ``percent`` when it ended in a percent sign (or "percent")."""

    text: str
    percent: bool = False


def _unwrap(text: str) -> str:
    """Replace ``\\text{X}``-style wrappers (and ``\\boxed{X}``) by X."""
    while match := _WRAPPER.search(text):
        content = braced(text, match.end() - 1)
        if content is None:
            break
        text = text[: match.start()] + content + text[match.end() + len(content) + 1 :]
    return text


def _strip_math(text: str) -> str:
    """Without its math delimiters: around the whole (``\\[ 7 \\]``), or around each piece
    (``$1$, $2$``), and a sentence's period after them (``$42$.``)."""
    if text.endswith(("$.", "\\].", "\\).")):
        text = text[:-1]
    if text.startswith("\\[") and text.endswith("\\]"):
        text = text[2:-2]
    return _INLINE_MATH.sub("", text).strip()


def _single_member(text: str) -> str:
    """A set of one answer is that answer (``\\{(1, 2)\\}``); set-builder notation stays."""
    if not (text.startswith("\\{") and text.endswith("\\}")) or re.search(r"\\mid|[|:]", text):
        return text
    inner = text[2:-2].strip()
    return inner if inner and len(split_top(inner)) == 1 else text


def _degrees(text: str) -> str:
    """Degree marks dropped ("30^\\circ" is the answer 30), except inside a trig function,
    where they turn into radians ("\\sin 30^\\circ" is sin(30 pi/180), not sin 30)."""
    if _TRIG.search(text):
        text = _DEGREE_VALUE.sub(r"(\1\\pi/180)", text)
    return _DEGREES.sub("", text).strip()


def prepare(answer: str) -> Prepared:
    """The normal form of ``answer`` (a stated answer, or a text whose last box holds one)."""
    text = str(answer).strip()
    if (boxed := last_boxed(text)) is not None:
        text = boxed
    text = (
        _unwrap(_CONJUNCTION.sub(", ", text))
        .replace("\\left", "")
        .replace("\\right", "")
        .replace("{,}", ",")
    )
    text = text.replace("\\displaystyle", "").replace("−", "-")
    text = _SPACES.sub(lambda m: m.group(1) or " ", text).strip()
    text = _strip_math(text)
    text = _PREFIX.sub("", text).removeprefix("\\$").removeprefix("$").strip()
    text = _degrees(text)
    for brace, plain in _BRACES.items():
        text = text.replace(brace, plain)
    text = _EMPTY_SET.sub(r"\\emptyset", text)
    text = _single_member(text)
    if not text.endswith(".."):
        text = text.rstrip(".").strip()
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text) if percent else text
    if parse_number(text) is None and (units := _UNITS.match(text)):
        text = units.group(1)
    return Prepared(re.sub(r"\s+", " ", text).strip(), percent)


def normalize_answer(answer: str) -> str:
    """The answer's normal form as text (the percent sign dropped), e.g. for display."""
    return prepare(answer).text


def stated_choice(answer: Prepared) -> tuple[str, str] | None:
    """The letter of an answer written as a choice (``B``, ``(B)``, ``(B) 12``, ``B. 12``) and
    the value written with it ("" when none); None for anything else."""
    match = _CHOICE_GOLD.match(answer.text)
    if match is None:
        return None
    letter = match.group(1) or match.group(2) or match.group(3)
    return letter.upper(), (match.group(4) or "").strip()


def choice_letter(answer: Prepared) -> str | None:
    """The letter an answer picks: ``B``, ``(b)``, ``B)``, ``B. 12``, ``(B) 12``; None for
    anything else ("C and D", "A, B", "BC")."""
    match = _CHOICE.match(answer.text)
    return (match.group(1) or match.group(2)).upper() if match else None
