"""What the agent will do for one model: settings over a recipe over the family's defaults.

Values found at run time live here, not back in :class:`~mathagent.config.AgentSettings`: an
explicit setting wins, then the recipe (``--recipe``), then the model family.

``aimo2`` is NVIDIA's AIMO-2 Kaggle setup (NeMo-Skills' OpenMath-Nemotron-14B-Kaggle, paper
arXiv:2504.16891): the Kaggle model's prompt without notices, 6 executions of at most 2 s with
200 output characters, 16 samples voted with an early stop once 4 agree (the solver's early stop;
the paper's exact rule could not be read here), and the competition's 5 hours over 50 problems
as the per-problem time (360 s), unused time passed on to later problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mathagent.agent.families import Family, family_for
from mathagent.agent.prompts import ChatTemplate
from mathagent.config import AgentSettings

RECIPES: dict[str, dict[str, Any]] = {
    "none": {},
    "aimo2": {
        "prompt_format": "openmath-kaggle",
        "max_tool_calls": 6,
        "code_timeout_s": 2.0,
        "max_output_chars": 200,
        "samples": 16,
        "early_stop": 4,
        "wall_time_s": 360.0,
        "time_buffer": True,
    },
}
# Defaults that no family changes.
COMMON = {
    "code_timeout_s": 10.0,
    "max_output_chars": 1000,
    "samples": 1,
    "early_stop": 0,
    "wall_time_s": 600.0,
    "time_buffer": False,
}


@dataclass(frozen=True)
class AgentPlan:
    """Concrete knobs for one model. ``time_buffer``: unused problem time flows to later ones."""

    family: Family
    max_tool_calls: int
    code_timeout_s: float
    max_output_chars: int
    max_tokens: int
    temperature: float
    top_p: float
    samples: int
    early_stop: int
    wall_time_s: float
    remaining_notice: bool
    reasoning_effort: str
    time_buffer: bool


def plan_for(settings: AgentSettings, model: str) -> AgentPlan:
    """The plan for ``model`` (whose name picks the family unless the prompt format is set)."""
    recipe = RECIPES[settings.recipe]
    prompt_format = settings.prompt_format
    if prompt_format == "auto":
        prompt_format = recipe.get("prompt_format", "auto")
    family = family_for(prompt_format, model)
    defaults = {
        **COMMON,
        "max_tool_calls": family.max_tool_calls,
        "max_tokens": family.max_tokens,
        "temperature": family.temperature,
        "top_p": family.top_p,
        "remaining_notice": family.notices,
        "reasoning_effort": family.reasoning_effort or "high",
        **recipe,
    }
    values = {}
    for name in AgentPlan.__dataclass_fields__:
        if name == "family":
            continue
        given = getattr(settings, name, None)
        values[name] = given if given is not None else defaults[name]
    return AgentPlan(family=family, **values)


def planned_samples(settings: AgentSettings) -> int:
    """Samples per problem before the model is known (no family changes it)."""
    if settings.samples is not None:
        return settings.samples
    return RECIPES[settings.recipe].get("samples", COMMON["samples"])


def agent_prompt(
    settings: AgentSettings,
    model: str,
    problem: str,
    *,
    tools: bool = True,
    chat_template: ChatTemplate | None = None,
) -> str:
    """The prompt text the agent sends ``model`` for ``problem`` (drafter data, benchmarks)."""
    plan = plan_for(settings, model)
    return plan.family.render(
        problem,
        tools=tools,
        max_tool_calls=plan.max_tool_calls,
        chat_template=chat_template,
        reasoning_effort=plan.reasoning_effort,
    )
