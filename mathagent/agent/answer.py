"""Final-answer extraction: the last ``\\boxed{...}`` (nested braces), else "The final answer is".

Thinking models state their answer after the thinking block: :func:`after_thinking` gives the
part of a generation that may hold it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOXED = ("\\boxed", "\\fbox")
_FINAL = re.compile(r"final answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s*)?(?:\n|$)", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` in ``text``; None when there is none."""
    starts = [text.rfind(tag) for tag in _BOXED]
    start = max(starts)
    while start >= 0:
        content = _braced(text, start)
        if content is not None:
            return content.strip()
        # An unclosed last box: fall back to the one before it.
        start = max(text.rfind(tag, 0, start) for tag in _BOXED)
    return None


def _braced(text: str, start: int) -> str | None:
    """The balanced ``{...}`` content following the command at ``start``."""
    open_at = text.find("{", start)
    if open_at < 0 or text[start:open_at].strip() not in _BOXED:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a generation, or None when it states none.

    The last ``\\boxed{}`` wins; without one, the last "The final answer is X" sentence.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed or None
    matches = _FINAL.findall(text)
    if matches:
        answer = matches[-1].strip().rstrip(".").strip()
        return answer or None
    return None


def normalize(answer: str) -> str:
    """A light canonical form for voting: no spaces, no ``$``, no trailing period."""
    text = answer.strip().rstrip(".").strip().strip("$").replace(" ", "")
    if text.startswith("\\text{") and text.endswith("}"):
        text = text[6:-1]
    return text


@dataclass(frozen=True)
class ThinkTags:
    """The markers of a thinking block (Qwen3: ``<think>`` ... ``</think>``)."""

    open: str = "<think>"
    close: str = "</think>"


def after_thinking(text: str, tags: ThinkTags) -> str | None:
    """The text after the last closed thinking block; None while a block is still open.

    A generation without any thinking block is all answer text.
    """
    close = text.rfind(tags.close)
    answer = text[close + len(tags.close) :] if close >= 0 else text
    return None if tags.open in answer else answer
