"""Code-tag formats: how a model family opens and closes code, and how output is fed back.

The strings are data, taken from NeMo-Skills' ``prompt/code_tags`` (openmath, qwen) and the
gpt-oss harmony tool channel. ``code_end`` is the stop string of every completion request, so
the server hands back control exactly when a block closes.

One deliberate difference from NeMo-Skills' openmath tags: its ``code_output_begin`` is
"```output\\n", but a stop string removes the newline OpenMath-Nemotron writes after
``</tool_call>``, so the output we feed back starts with that newline ("\\n```output\\n"),
which reproduces the model's training transcripts.
"""

from __future__ import annotations

from dataclasses import dataclass

from mathagent.sandbox.base import ExecResult, ExecStatus

OUTPUT_CUT = "<output cut>"
STATE_LOST = (
    "Note: the Python session was restarted before this code ran; variables, functions and "
    "imports from earlier code blocks are gone. Define them again if you need them.\n"
)


@dataclass(frozen=True)
class CodeFormat:
    """The code tags of one model family."""

    name: str
    code_begin: str
    code_end: str
    output_begin: str
    output_end: str

    def is_block_open(self, text: str) -> bool:
        """True when the last ``code_begin`` in ``text`` has no ``code_end`` after it."""
        start = text.rfind(self.code_begin)
        return start >= 0 and text.find(self.code_end, start + len(self.code_begin)) < 0

    def ends_with_block(self, text: str) -> bool:
        """True when ``text`` ends with a complete code block (the turn asks for execution)."""
        if not text.endswith(self.code_end):
            return False
        return self.is_block_open(text[: -len(self.code_end)])

    def last_code(self, text: str) -> str:
        """The code of the last block, for a ``text`` that :meth:`ends_with_block`."""
        body = text[: -len(self.code_end)]
        return body[body.rfind(self.code_begin) + len(self.code_begin) :]

    def output_block(self, output: str, remaining: int | None = None) -> str:
        """The text appended after a block: its output, then the optional budget notice."""
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


def cut(text: str, limit: int) -> str:
    """Keep the first ``limit`` characters and mark the cut, as NeMo-Skills' sandbox does."""
    # The sandbox may have cut already; cutting again must not stack a second marker.
    body = text.removesuffix(OUTPUT_CUT)
    if len(body) <= limit:
        return text
    return body[:limit] + OUTPUT_CUT


def _cut_stream(text: str, limit: int, truncated: bool) -> str:
    # The sandbox cuts at the limit without a marker and flags it; a stream at the limit is it.
    if truncated and len(text) >= limit and not text.endswith(OUTPUT_CUT):
        return text[:limit] + OUTPUT_CUT
    return cut(text, limit)


def feedback_text(res: ExecResult, max_chars: int, timeout_s: float) -> str:
    """What the model reads after its code ran: output cut at ``max_chars``, plus status text."""
    body = _cut_stream(res.stdout, max_chars, res.truncated) + _cut_stream(
        res.stderr, max_chars, res.truncated
    )
    if body and not body.endswith("\n"):
        body += "\n"
    if res.status == ExecStatus.timeout:
        body += (
            f"TimeoutError: the code did not finish within {timeout_s:g} seconds and was stopped.\n"
        )
    elif res.status == ExecStatus.memory_limit:
        body += "MemoryError: the code ran out of memory and was stopped.\n"
    return (STATE_LOST if res.state_lost else "") + body


OPENMATH = CodeFormat(
    name="openmath",
    code_begin="<tool_call>",
    code_end="</tool_call>",
    output_begin="\n```output\n",
    output_end="```\n",
)
QWEN = CodeFormat(
    name="qwen",
    code_begin="```python\n",
    code_end="```\n",
    output_begin="```output\n",
    output_end="```\n",
)
GPT_OSS = CodeFormat(
    name="gpt-oss",
    code_begin="<|start|>assistant<|channel|>analysis to=python code<|message|>",
    code_end="<|call|>",
    output_begin="<|start|>python to=assistant<|channel|>analysis<|message|>",
    output_end="<|end|><|start|>assistant",
)

FORMATS: dict[str, CodeFormat] = {f.name: f for f in (OPENMATH, QWEN, GPT_OSS)}


class ChunkSplitter:
    """Splits a turn's streamed text into prose and code as it arrives.

    A turn is generated with ``stop = code_end``, so everything after the turn's first
    ``code_begin`` is code. A tail that could be the start of ``code_begin`` is held back
    until the next chunk decides it.
    """

    def __init__(self, fmt: CodeFormat | None) -> None:
        self._begin = fmt.code_begin if fmt else ""
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
