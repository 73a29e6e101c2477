"""Answers that name their values: ``x = 2, y = 3`` against the tuple ``(2, 3)``.

math-verify reads a list of assignments as a set of equations and a tuple as a set of values, so
it finds ``x = 2, y = 3`` equal to ``(3, 2)`` (swapped values) and ``y = 3, x = 2`` unequal to
``(2, 3)``. Read here, the assignments' values are put in the order of their variables (``x``
before ``y``, ``a`` before ``b``, ``x_1`` before ``x_2``) and the tuple's elements are compared
with them one by one.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^([A-Za-z])(?:_\{?([A-Za-z0-9]+)\}?)?$")
_AND = re.compile(r"\s+and\s+")


def split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at each ``sep`` outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _closes_at_end(text: str) -> bool:
    """The bracket opening ``text`` closes at its last character."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0:
            return i == len(text) - 1
    return False


def assigned_values(text: str) -> list[str] | None:
    """The values of ``x = 2, y = 3`` (or ``x = 2 and y = 3``) in the order of their variables;
    None unless it is two or more assignments to distinct plain variables."""
    items = split_top(_AND.sub(", ", text))
    if len(items) < 2:
        return None
    named: dict[tuple[str, int, str], str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        match = _NAME.match(name.strip())
        if not eq or "=" in value or not value.strip() or match is None:
            return None
        letter, sub = match.group(1), match.group(2) or ""
        key = (letter, int(sub) if sub.isdigit() else -1, sub)
        if key in named:
            return None
        named[key] = value.strip()
    return [named[key] for key in sorted(named)]


def tuple_elements(text: str) -> list[str] | None:
    """The elements of a parenthesised tuple ``(2, 3)``; None for anything else."""
    if not (text.startswith("(") and text.endswith(")")) or "=" in text:
        return None
    if not _closes_at_end(text):
        return None  # "(1, 2) \cup (3, 4)": the first parenthesis closes before the end
    elements = split_top(text[1:-1])
    return elements if len(elements) >= 2 and all(elements) else None
