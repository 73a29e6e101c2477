"""Prompt templates (data) and the one renderer that turns them into what a model is sent.

A :class:`PromptTemplate` yields chat messages. :func:`render_prompt` is the only place that
turns a problem into prompt text: gpt-oss through harmony, every other family through the
model's own chat template (:class:`ChatTemplate`), ending with the assistant turn's start, so
that tool output can be appended inside the assistant turn on ``/v1/completions``. The loop, the
drafter's data, the scripts and the benchmarks all call it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mathagent.agent.request import Conversation, Message

if TYPE_CHECKING:
    from mathagent.agent.formats import TagFormat


@dataclass(frozen=True)
class Example:
    """One worked few-shot example: a problem solved by a single code call."""

    problem: str
    code: str
    output: str
    answer: str


@dataclass(frozen=True)
class PromptTemplate:
    """How to ask: system and user text, few-shot turns written in ``code_format``.

    ``system`` None sends no system message; "" sends an empty one (OpenMath-Nemotron's
    training layout: the chat template then writes an empty system block, not its default).
    ``user`` is formatted with ``problem`` and ``max_tool_calls``.
    """

    name: str
    user: str
    system: str | None = None
    examples: tuple[Example, ...] = ()
    code_format: TagFormat | None = None

    def messages(self, problem: str, max_tool_calls: int) -> list[Message]:
        """The conversation up to (not including) the assistant's answer."""
        out: list[Message] = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system})
        for ex in self.examples:
            out.append({"role": "user", "content": ex.problem})
            out.append({"role": "assistant", "content": self._solution(ex)})
        user = self.user.format(problem=problem, max_tool_calls=max_tool_calls)
        out.append({"role": "user", "content": user})
        return out

    def _solution(self, ex: Example) -> str:
        final = f"The final answer is \\boxed{{{ex.answer}}}."
        if self.code_format is None:
            return f"{ex.code} = {ex.output}. {final}"
        fmt = self.code_format
        return f"{fmt.code_begin}{ex.code}{fmt.code_end}{fmt.output_block(ex.output)}{final}"


class ChatTemplate:
    """The model's chat template (from its tokenizer), rendering messages to prompt text."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, source: str | Path) -> ChatTemplate:
        """Load a local tokenizer: an HF folder, a ``.gguf`` file, or a cached model name.

        Raises ``OSError`` when nothing local matches (the model hub is never contacted).
        """
        from transformers import AutoTokenizer

        path = Path(source).expanduser()
        if path.suffix == ".gguf":
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        else:
            tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        if not getattr(tok, "chat_template", None):
            raise OSError(f"the tokenizer at {source} has no chat template")
        return cls(tok)

    def render(self, messages: list[Message], **kwargs: Any) -> str:
        """Prompt text ending with the assistant turn's header."""
        return self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )

    def count(self, text: str) -> int | None:
        """Tokens in ``text``, when the tokenizer can count them."""
        encode = getattr(self._tokenizer, "encode", None)
        if encode is None:
            return None
        return len(encode(text, add_special_tokens=False))


class HarmonyPrompter(Protocol):
    """Renders a harmony prompt (gpt-oss: :class:`~mathagent.agent.harmony.HarmonyFormat`)."""

    def prompt(self, user: str, effort: str, date: str, tools: bool) -> str: ...


def render_prompt(
    template: PromptTemplate,
    problem: str,
    *,
    max_tool_calls: int,
    chat_template: ChatTemplate | None = None,
    harmony: HarmonyPrompter | None = None,
    tools: bool = True,
    reasoning_effort: str = "high",
    date: str | None = None,
) -> str:
    """The prompt text for ``/v1/completions``, ending where the assistant's answer starts.

    With ``harmony`` (gpt-oss): harmony's system message (``reasoning_effort``, ``date``, default
    today, the python tool when ``tools``) and the user message; else the chat template.
    """
    messages = template.messages(problem, max_tool_calls)
    if harmony is not None:
        user = "\n".join(m["content"] for m in messages if m["role"] == "user")
        day = date or datetime.date.today().isoformat()
        return harmony.prompt(user, reasoning_effort, day, tools)
    if chat_template is None:
        raise ValueError(f"the {template.name} prompt needs the model's chat template")
    return chat_template.render(messages)


def conversation(
    template: PromptTemplate,
    problem: str,
    *,
    max_tool_calls: int,
    chat: bool,
    **render: Any,
) -> Conversation:
    """What a sample sends before its assistant text: prompt text, or messages in chat mode.

    ``render`` are :func:`render_prompt`'s keyword arguments.
    """
    if chat:
        return Conversation(messages=template.messages(problem, max_tool_calls))
    return Conversation(
        prompt=render_prompt(template, problem, max_tool_calls=max_tool_calls, **render)
    )
