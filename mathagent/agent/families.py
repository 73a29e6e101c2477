"""Model families as data: which models belong, how they are prompted, called and budgeted.

Each record carries what its reference uses for that model: the prompt (NeMo-Skills prompt
configs, tests/agent/fixtures/nemo_skills/prompt_configs.json), the tool syntax and notices
(``CodeExecutionConfig``; the variant mapping of ``chat_interface/core.py``,
fixtures/nemo_skills/openmath_variants.json), sampling and ``max_tokens`` (NeMo-Skills'
evaluation docs: 32768 tokens at temperature 0.6 for OpenMath-Nemotron; its gpt-oss recipe:
120000 at 1.0, reasoning effort high, 100 executions), and the request extras NeMo-Skills sends
to vLLM/TensorRT-LLM. The model name picks the family (``auto``); ``--prompt-format`` names one.

Eras: OpenMath-Nemotron was trained with an empty system block (training.md,
``system_message=""``; the release-era evaluation renders the same bytes); Qwen2.5-Math and
Qwen3 read ``\\boxed{}`` in their system message, as their own evaluations and the release-era
NeMo-Skills render it (the newest NeMo-Skills writes ``\\boxed{{}}`` there, an unformatted
template, which those models never saw).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mathagent.agent.answer import ThinkTags, after_thinking
from mathagent.agent.formats import OPENMATH, QWEN, ToolSyntax
from mathagent.agent.harmony import HarmonyFormat
from mathagent.agent.prompts import (
    ChatTemplate,
    Example,
    PromptTemplate,
    conversation,
    render_prompt,
)
from mathagent.agent.request import Conversation

# What NeMo-Skills' VLLMModel sends on the text endpoint (litellm body, fixtures/requests):
# special tokens stay in the text, and nothing is inserted between them.
TEXT_EXTRAS: dict[str, Any] = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
CHAT_EXTRAS: dict[str, Any] = {"spaces_between_special_tokens": False}


@dataclass(frozen=True)
class Family:
    """One model family. ``pattern`` (case-insensitive) matches its model names."""

    name: str
    pattern: str | None
    prompt: PromptTemplate  # tools on
    plain: PromptTemplate  # tools off
    syntax: ToolSyntax
    notices: bool = False
    thinking: ThinkTags | None = None
    max_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    max_tool_calls: int = 8
    reasoning_effort: str | None = None
    text_extras: dict[str, Any] = field(default_factory=dict)
    chat_extras: dict[str, Any] = field(default_factory=dict)

    @property
    def harmony(self) -> HarmonyFormat | None:
        """The harmony syntax when the family renders its own prompt (gpt-oss)."""
        return self.syntax if isinstance(self.syntax, HarmonyFormat) else None

    def render(
        self,
        problem: str,
        *,
        tools: bool,
        max_tool_calls: int,
        chat_template: ChatTemplate | None = None,
        reasoning_effort: str = "high",
        date: str | None = None,
    ) -> str:
        """The prompt text this family sends for ``problem`` (:func:`prompts.render_prompt`)."""
        return render_prompt(
            self.prompt if tools else self.plain,
            problem,
            max_tool_calls=max_tool_calls,
            chat_template=chat_template,
            harmony=self.harmony,
            tools=tools,
            reasoning_effort=reasoning_effort,
            date=date,
        )

    def conversation(
        self, problem: str, *, tools: bool, max_tool_calls: int, chat: bool, **render: Any
    ) -> Conversation:
        """A sample's conversation: the rendered prompt, or messages for a chat endpoint."""
        template = self.prompt if tools else self.plain
        harmony = self.harmony
        return conversation(
            template,
            problem,
            max_tool_calls=max_tool_calls,
            chat=chat,
            harmony=harmony,
            tools=tools,
            **render,
        )

    def answer_text(self, generation: str) -> str | None:
        """Where the answer is stated: after the thinking, in harmony's final channel."""
        region = self.syntax.answer_region(generation)
        if region is None or self.thinking is None:
            return region
        return after_thinking(region, self.thinking)


OPENMATH_TIR = (
    "Solve the following math problem, integrating natural language reasoning with Python "
    "code executions.\nYou may perform up to {max_tool_calls} Python code calls to assist "
    "your reasoning.\nMake sure to put the answer (and only answer) inside \\boxed{{}}.\n\n"
    "{problem}"
)
GENERIC_MATH = (
    "Solve the following math problem. Make sure to put the answer (and only answer) inside "
    "\\boxed{{}}.\n\n{problem}"
)
QWEN_TIR_SYSTEM = (
    "Please integrate natural language reasoning with programs to solve the problem above, "
    "and put your final answer within \\boxed{}."
)
STEP_BY_STEP = "Please reason step by step, and put your final answer within \\boxed{}."

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
_GENERIC = PromptTemplate("generic/math", GENERIC_MATH, system="")
_HARMONY = HarmonyFormat()
# A user template is formatted (problem, max_tool_calls): its literal braces are doubled.
_GPT_OSS = PromptTemplate("gpt-oss/math", "{problem}\n" + STEP_BY_STEP.replace("{}", "{{}}"))
_REASONING = {"max_tokens": 32768, "temperature": 0.6, "top_p": 0.95}
_NEMO_EXTRAS = {"text_extras": TEXT_EXTRAS, "chat_extras": CHAT_EXTRAS}

FAMILIES: tuple[Family, ...] = (
    Family(
        "openmath-kaggle",
        r"openmath-nemotron.*kaggle",
        prompt=_GENERIC,
        plain=_GENERIC,
        syntax=OPENMATH,
        **_REASONING,
        **_NEMO_EXTRAS,
    ),
    Family(
        "openmath",
        r"openmath-nemotron",
        prompt=PromptTemplate("openmath/tir", OPENMATH_TIR, system=""),
        plain=_GENERIC,
        syntax=OPENMATH,
        notices=True,
        **_REASONING,
        **_NEMO_EXTRAS,
    ),
    Family(
        "gpt-oss",
        r"gpt-oss",
        prompt=_GPT_OSS,
        plain=_GPT_OSS,
        syntax=_HARMONY,
        max_tokens=120_000,
        temperature=1.0,
        top_p=1.0,
        max_tool_calls=100,
        reasoning_effort="high",
        **_NEMO_EXTRAS,
    ),
    Family(
        "qwen3",
        r"qwen3",
        prompt=PromptTemplate("qwen3/math-cot-think", "{problem} /think", system=STEP_BY_STEP),
        plain=PromptTemplate("qwen3/math-cot-think", "{problem} /think", system=STEP_BY_STEP),
        syntax=QWEN,
        thinking=ThinkTags(),
        **_REASONING,
        **_NEMO_EXTRAS,
    ),
    # Qwen2.5-Math-Instruct: 4096 tokens of context, greedy (Qwen's own evaluation).
    Family(
        "qwen",
        r"qwen",
        prompt=PromptTemplate("qwen/math-tir", "{problem}", system=QWEN_TIR_SYSTEM),
        plain=PromptTemplate("qwen/math-cot", "{problem}", system=STEP_BY_STEP),
        syntax=QWEN,
        max_tokens=4096,
        top_p=0.95,
        **_NEMO_EXTRAS,
    ),
    # Small instruct models (the default SmolLM2-135M) learn the tags from two worked turns.
    Family(
        "fewshot",
        None,
        prompt=PromptTemplate(
            "fewshot",
            "{problem}",
            system=(
                "You are a math assistant. Write Python code between <tool_call> and "
                "</tool_call> to compute the answer; its output is shown in an ```output block. "
                "Then give the final answer in \\boxed{}."
            ),
            examples=_EXAMPLES,
            code_format=OPENMATH,
        ),
        plain=PromptTemplate(
            "fewshot-math",
            "{problem}",
            system="You are a math assistant. Give the final answer in \\boxed{}.",
            examples=_NO_TOOL_EXAMPLES,
        ),
        syntax=OPENMATH,
    ),
)
BY_NAME = {f.name: f for f in FAMILIES}
PROMPT_FORMATS = ("auto", *BY_NAME)


def family_for(prompt_format: str, model: str) -> Family:
    """The named family, or (``auto``) the first whose pattern matches ``model``."""
    if prompt_format == "auto":
        return next(
            f for f in FAMILIES if f.pattern is None or re.search(f.pattern, model, re.IGNORECASE)
        )
    if prompt_format not in BY_NAME:
        raise ValueError(f"unknown prompt format {prompt_format!r}; choose from {PROMPT_FORMATS}")
    return BY_NAME[prompt_format]
