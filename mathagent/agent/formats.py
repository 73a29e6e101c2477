"""Tool syntax: how a model family calls Python, and how the output goes back to it.

The loop sees only :class:`ToolSyntax`. Two kinds implement it: tag formats (:class:`TagFormat`,
begin/end strings taken from NeMo-Skills' ``prompt/code_tags``: openmath, qwen) and harmony
(:mod:`mathagent.agent.harmony`, gpt-oss: structured messages addressed to a recipient). The
end string of a format is the stop string of every request, so the server hands control back
exactly when a call is complete.

One deliberate difference from NeMo-Skills' openmath tags: its ``code_output_begin`` is
"```output\\n" after a ``</tool_call>\\n`` it keeps, but a stop string removes the newline
OpenMath-Nemotron writes after ``</tool_call>``, so the output fed back starts with that newline
("\\n```output\\n"); both give the same bytes (tests/agent/fixtures/README.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from mathagent.agent.request import NOT_REPORTED, Finish


@dataclass(frozen=True)
class TurnEnd:
    """What a finished turn asks of the loop.

    ``restored``: stop text the server dropped, appended to the generation first; then run
    ``code``, or, when ``reply`` is set, append that instead of running it (text for the model,
    e.g. about an unknown tool); no ``code``: the generation is over. ``error``: the model's text cannot go on (the sample ends
    with that message). ``channel``: harmony's call channel, which the answer goes back on.
    """

    restored: str = ""
    code: str | None = None
    reply: str | None = None
    error: str | None = None
    channel: str | None = None


class ToolSyntax(ABC):
    """One family's tool-call syntax."""

    name: str
    stop: tuple[str, ...]
    code_marker: str  # streamed text from here on is shown as code

    @abstractmethod
    def end_turn(self, generation: str, finish: Finish) -> TurnEnd:
        """Decide what the turn that ended ``generation`` (the assistant text so far) asks."""

    @abstractmethod
    def is_open(self, text: str) -> bool:
        """True while ``text`` ends inside a call (an answer there is not final)."""

    @abstractmethod
    def output_block(
        self, output: str, remaining: int | None = None, call: TurnEnd | None = None
    ) -> str:
        """The text appended after ``call``: its output, then the optional budget notice."""

    def context(self, generation: str) -> str:
        """The assistant text as the next request sends it (harmony re-renders its calls)."""
        return generation

    def check_turn(self, turn: str) -> str | None:
        """An error when the server mangled the turn's text (special tokens stripped)."""
        return None

    def answer_region(self, generation: str) -> str | None:
        """The part of the generation that states the answer; None when it states none."""
        return generation


@dataclass(frozen=True)
class TagFormat(ToolSyntax):
    """Code between two tags, output in a fenced block (NeMo-Skills' code tags)."""

    name: str
    code_begin: str
    code_end: str
    output_begin: str
    output_end: str

    @property
    def stop(self) -> tuple[str, ...]:  # type: ignore[override]
        return (self.code_end,)

    @property
    def code_marker(self) -> str:  # type: ignore[override]
        return self.code_begin

    def is_open(self, text: str) -> bool:
        """True when the last ``code_begin`` in ``text`` has no ``code_end`` after it."""
        start = text.rfind(self.code_begin)
        return start >= 0 and text.find(self.code_end, start + len(self.code_begin)) < 0

    def ends_with_block(self, text: str) -> bool:
        """True when ``text`` ends with a complete code block (the turn asks for execution)."""
        if not text.endswith(self.code_end):
            return False
        return self.is_open(text[: -len(self.code_end)])

    def last_code(self, text: str) -> str:
        """The code of the last block, for a ``text`` that :meth:`ends_with_block`."""
        body = text[: -len(self.code_end)]
        return body[body.rfind(self.code_begin) + len(self.code_begin) :]

    def end_turn(self, generation: str, finish: Finish) -> TurnEnd:
        # The server stopped on the end tag and dropped it (reported as the string, or not
        # reported at all); a stop reported as anything else is the model's EOS.
        dropped = finish.stop_reason is NOT_REPORTED or finish.stop_reason == self.code_end
        stopped = finish.finish_reason == "stop" and dropped and self.is_open(generation)
        restored = self.code_end if stopped else ""
        text = generation + restored
        if self.ends_with_block(text):
            return TurnEnd(restored, code=self.last_code(text))
        if self.is_open(text):
            why = "the token budget ran out" if finish.finish_reason == "length" else "it ended"
            return TurnEnd(
                error=f"the model's last code block never closed ({why} before {self.code_end})"
            )
        return TurnEnd()

    def output_block(
        self, output: str, remaining: int | None = None, call: TurnEnd | None = None
    ) -> str:
        return f"{self.output_begin}{output}{self.output_end}{remaining_notice(remaining)}"


def remaining_notice(remaining: int | None) -> str:
    """NeMo-Skills' "Remaining code executions" notice; empty when notices are off (None)."""
    if remaining is None:
        return ""
    if remaining > 0:
        return (
            "```system\n"
            f"Remaining code executions: {remaining}. You will not be able to call code when "
            "you run out of executions, so use it wisely. Note that you can still continue "
            "solving the problem without code after that.\n"
            "```\n"
        )
    return (
        "```system\n"
        "You have run out of code executions! You can no longer write or execute code. Now you "
        "should continue solving the problem by relying on your mathematical reasoning and "
        "analytical skills.\n"
        "```\n"
    )


OPENMATH = TagFormat(
    name="openmath",
    code_begin="<tool_call>",
    code_end="</tool_call>",
    output_begin="\n```output\n",
    output_end="```\n",
)
QWEN = TagFormat(
    name="qwen",
    code_begin="```python\n",
    code_end="```\n",
    output_begin="```output\n",
    output_end="```\n",
)


class ChunkSplitter:
    """Splits a turn's streamed text into prose and code as it arrives.

    A turn is generated with the syntax's stop, so everything after the turn's first
    ``code_marker`` is code. A tail that could be the start of the marker is held back until
    the next chunk decides it.
    """

    def __init__(self, syntax: ToolSyntax | None) -> None:
        self._begin = syntax.code_marker if syntax else ""
        self._pending = ""
        self._in_code = False

    def feed(self, chunk: str) -> list[tuple[str, bool]]:
        """Return ``(text, is_code)`` pieces ready to show."""
        if self._in_code or not self._begin:
            return [(chunk, self._in_code)] if chunk else []
        text = self._pending + chunk
        at = text.find(self._begin)
        if at >= 0:
            self._in_code, self._pending = True, ""
            return [(p, c) for p, c in ((text[:at], False), (text[at:], True)) if p]
        keep = _partial_suffix(text, self._begin)
        self._pending = text[len(text) - keep :] if keep else ""
        ready = text[: len(text) - keep]
        return [(ready, False)] if ready else []

    def flush(self) -> list[tuple[str, bool]]:
        """Release whatever is held back at the end of the turn."""
        pending, self._pending = self._pending, ""
        return [(pending, self._in_code)] if pending else []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
