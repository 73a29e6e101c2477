"""The normal form of a stated answer: what is left once its wrapping is taken off.

Lossless steps only, so math-verify still sees the mathematics: the box, ``\\text``-style
wrappers, ``\\left``/``\\right``, math delimiters, currency signs, degree marks, spacing commands
(never the ``\\\\`` of a matrix row), an "Answer:" prefix and the final period; the percent sign
and trailing units are taken off and remembered (``Prepared.percent``) or dropped (units).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mathagent.agent.answer.extract import braced, last_boxed
from mathagent.agent.answer.numbers import parse_number

_WRAPPERS = ("boxed", "fbox", "text", "textbf", "textrm", "textit", "mathrm", "mathbf", "mbox")
_WRAPPER = re.compile(r"\\(" + "|".join(_WRAPPERS) + r")\s*\{")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\\circ")
_PERCENT = re.compile(r"\s*(?:\\%|%|\bpercent)\s*$")
# A spacing command is one backslash before , ; : ! or a space, never the second of a `\\`.
_SPACES = re.compile(r"(?<!\\)\\[,;:! ]|~|\\q?quad\b")
_PREFIX = re.compile(r"^(?i:(?:the\s+)?(?:final\s+)?answer(?:\s+is)?)\s*[:=]?\s*")
_UNITS = re.compile(r"^([-+]?[\d,]*\.?\d+)\s+[A-Za-z][A-Za-z0-9\s./^{}-]*$")
_CHOICE_GOLD = re.compile(r"^\(?([A-E])\)?$|^\(([A-Ea-e])\)\s*\S.*$")
_CHOICE = re.compile(r"^\(\s*([A-Ea-e])\s*\)(?:\s*.*)?$|^([A-Ea-e])(?:[.:)](?:\s*.*)?)?$")
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
    """Without its math delimiters (and a sentence's period after them: ``$42$.``)."""
    if text.endswith(("$.", "\\].", "\\).")):
        text = text[:-1]
    for a, b in (("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if text.startswith(a) and text.endswith(b) and len(text) >= len(a) + len(b):
            text = text[len(a) : len(text) - len(b)].strip()
    return text


def prepare(answer: str) -> Prepared:
    """The normal form of ``answer`` (a stated answer, or a text whose last box holds one)."""
    text = str(answer).strip()
    if (boxed := last_boxed(text)) is not None:
        text = boxed
    text = _unwrap(text).replace("\\left", "").replace("\\right", "").replace("{,}", ",")
    text = text.replace("\\displaystyle", "").replace("−", "-")
    text = _SPACES.sub(" ", text).strip()
    text = _strip_math(text)
    text = _PREFIX.sub("", text).removeprefix("\\$").removeprefix("$").strip()
    text = _DEGREES.sub("", text).strip()
    text = _EMPTY_SET.sub(r"\\emptyset", text)
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


def gold_choice(gold: Prepared) -> str | None:
    """The letter of a multiple-choice reference: ``B``, ``(B)`` or ``(B) 12``."""
    match = _CHOICE_GOLD.match(gold.text)
    return (match.group(1) or match.group(2)).upper() if match else None


def choice_letter(answer: Prepared) -> str | None:
    """The letter an answer picks: ``B``, ``(b)``, ``B)``, ``B. 12``, ``(B) 12``; None for
    anything else ("C and D", "A, B", "BC")."""
    match = _CHOICE.match(answer.text)
    return (match.group(1) or match.group(2)).upper() if match else None
