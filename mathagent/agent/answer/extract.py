"""Where a generation states its answer: the last ``\\boxed``, else a closing sentence.

Order: the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces; ``\\boxed 5`` reads to the end
of its line or math), else the last "The final answer is X", else the last multiple-choice
statement ("the answer is (B)", "Answer: C"). Only the text after a closed thinking block counts,
and in a harmony generation (gpt-oss) only its last final-channel message; a block still open, or
harmony without a final message, states nothing. A generation cut inside its last box states no answer: the
model was still writing it, and an earlier box is one it went past (NeMo-Skills reads it so too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mathagent.agent.harmony_render import CHANNEL, final_message

_BOXED = ("\\boxed", "\\fbox")
# "The final answer is X": X in $...$ or \(...\), else up to the end of its sentence or line
# ("The final answer is $5$. I hope it is correct." as Minerva-style prompts end).
_FINAL = re.compile(
    r"final answer is[:\s]*(?:\$([^$\n]+)\$|\\\((.+?)\\\)|([^\n$]+?))\s*(?:\.(?=\s|$)|\n|$)",
    re.IGNORECASE,
)
# The keyword in any case, the letter in capitals: "the answer is a prime" names no choice.
_CHOICE = re.compile(
    r"\b(?i:answer|option|choice)(?:\s+(?i:is))?\s*:?\s*\**\s*\(?\s*([A-E])\s*\)?\**(?![\w(])"
)


@dataclass(frozen=True)
class ThinkTags:
    """The markers of a thinking block (Qwen3: ``<think>`` ... ``</think>``)."""

    open: str = "<think>"
    close: str = "</think>"


DEFAULT_THINK = ThinkTags()


def after_thinking(text: str, tags: ThinkTags = DEFAULT_THINK) -> str | None:
    """The text after the last closed thinking block; None while a block is still open.

    A generation without any thinking block is all answer text.
    """
    close = text.rfind(tags.close)
    answer = text[close + len(tags.close) :] if close >= 0 else text
    return None if tags.open in answer else answer


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed`` (or ``\\fbox``) in ``text``; None when there is none
    or when it is unclosed."""
    start = max(text.rfind(tag) for tag in _BOXED)
    if start < 0:
        return None
    tag = next(t for t in _BOXED if text.startswith(t, start))
    rest = text[start + len(tag) :]
    if rest[:1].isspace() and not rest.lstrip().startswith("{"):
        # `\boxed 5`: TeX boxes the argument that follows; read it to the end of the math.
        inline = re.split(r"[$\n]|\\\]|\\\)", rest.strip(), maxsplit=1)[0].strip()
        return inline or None
    if not rest.lstrip().startswith("{"):
        return None
    content = braced(rest, rest.index("{"))
    return None if content is None else content.strip()


def braced(text: str, open_at: int) -> str | None:
    """The balanced ``{...}`` content opening at ``text[open_at]``; None when unbalanced."""
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


def extract_answer(text: str, tags: ThinkTags = DEFAULT_THINK) -> str | None:
    """The final answer a generation states, or None when it states none (see the module)."""
    region = final_message(text) if CHANNEL in text else text
    region = after_thinking(region, tags) if region is not None else None
    if region is None:
        return None
    if max(region.rfind(tag) for tag in _BOXED) >= 0:
        return last_boxed(region) or None
    if matches := _FINAL.findall(region):
        answer = "".join(matches[-1]).strip().rstrip(".").strip()
        return answer or None
    if choices := _CHOICE.findall(region):
        return choices[-1]
    return None
