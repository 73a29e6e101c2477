"""Prompt templates (data) and their rendering with the model's own chat template.

A :class:`PromptTemplate` yields chat messages; :class:`ChatTemplate` turns them into the raw
text of the assistant turn's start, sent to ``/v1/completions`` so tool output can be appended
inside the assistant turn. The user texts of ``openmath`` and ``math`` follow NeMo-Skills'
``generic/math-tir`` and ``generic/math`` prompt configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mathagent.agent.formats import FORMATS, OPENMATH, CodeFormat

Message = dict[str, str]


@dataclass(frozen=True)
class Example:
    """One worked few-shot example: a problem solved by a single code call."""

    problem: str
    code: str
    output: str
    answer: str


@dataclass(frozen=True)
class PromptTemplate:
    """How to ask: system and user text, few-shot turns, and the code format (None = no tools)."""

    name: str
    user: str
    system: str | None = None
    examples: tuple[Example, ...] = ()
    code_format: CodeFormat | None = None
    remaining_notice: bool = False
    chat_kwargs: dict[str, Any] = field(default_factory=dict)

    def messages(self, problem: str, max_tool_calls: int) -> list[Message]:
        """The conversation up to (not including) the assistant's answer."""
        out: list[Message] = []
        if self.system:
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


_EXAMPLES = (
    Example("What is 12 * 9 - 4?", "print(12 * 9 - 4)", "104\n", "104"),
    Example(
        "Tom has 3 boxes with 12 apples in each box. He eats 5 apples. How many apples are left?",
        "print(3 * 12 - 5)",
        "31\n",
        "31",
    ),
)
_NO_TOOL_EXAMPLES = tuple(
    Example(e.problem, e.code.removeprefix("print(").removesuffix(")"), e.output.strip(), e.answer)
    for e in _EXAMPLES
)

TEMPLATES: dict[str, PromptTemplate] = {
    "openmath": PromptTemplate(
        name="openmath",
        user=(
            "Solve the following math problem, integrating natural language reasoning with "
            "Python code executions. You may perform up to {max_tool_calls} Python code calls "
            "to assist your reasoning. Make sure to put the answer (and only answer) inside "
            "\\boxed{{}}.\n{problem}"
        ),
        code_format=OPENMATH,
        remaining_notice=True,
    ),
    "qwen": PromptTemplate(
        name="qwen",
        system=(
            "Please integrate natural language reasoning with programs to solve the problem "
            "above, and put your final answer within \\boxed{}."
        ),
        user="{problem}",
        code_format=FORMATS["qwen"],
    ),
    "gpt-oss": PromptTemplate(
        name="gpt-oss",
        user=(
            "Solve the following math problem. You may run Python up to {max_tool_calls} "
            "times. Make sure to put the answer (and only answer) inside \\boxed{{}}.\n\n"
            "{problem}"
        ),
        code_format=FORMATS["gpt-oss"],
        chat_kwargs={"builtin_tools": ["python"]},
    ),
    # Small instruct models (the default SmolLM2-135M) learn the tags from two worked turns.
    "fewshot": PromptTemplate(
        name="fewshot",
        system=(
            "You are a math assistant. Write Python code between <tool_call> and </tool_call> "
            "to compute the answer; its output is shown in an ```output block. Then give the "
            "final answer in \\boxed{}."
        ),
        user="{problem}",
        examples=_EXAMPLES,
        code_format=OPENMATH,
    ),
    "math": PromptTemplate(
        name="math",
        user=(
            "Solve the following math problem. Make sure to put the answer (and only answer) "
            "inside \\boxed{{}}.\n\n{problem}"
        ),
    ),
    "fewshot-math": PromptTemplate(
        name="fewshot-math",
        system="You are a math assistant. Give the final answer in \\boxed{}.",
        user="{problem}",
        examples=_NO_TOOL_EXAMPLES,
    ),
}

PROMPT_FORMATS = ("auto", "openmath", "qwen", "gpt-oss", "fewshot")


def select_template(prompt_format: str, model_name: str, tools: bool) -> PromptTemplate:
    """The template for a format (``auto`` guesses from the model name) with tools on or off."""
    name = prompt_format
    if name == "auto":
        lowered = model_name.lower()
        name = next(
            (
                n
                for key, n in (("openmath", "openmath"), ("gpt-oss", "gpt-oss"), ("qwen", "qwen"))
                if key in lowered
            ),
            "fewshot",
        )
    if name not in TEMPLATES or name in ("math", "fewshot-math"):
        raise ValueError(f"unknown prompt format {prompt_format!r}; choose from {PROMPT_FORMATS}")
    if not tools:
        return TEMPLATES["fewshot-math" if name == "fewshot" else "math"]
    return TEMPLATES[name]


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
