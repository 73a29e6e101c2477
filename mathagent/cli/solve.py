"""``mathagent solve`` and ``mathagent api``: the agent on one problem, or behind HTTP."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Annotated, Any

import typer

from mathagent.cli.common import (
    SETUP_ERRORS,
    AsJson,
    BaseUrl,
    Host,
    MaxTokens,
    MaxToolCalls,
    ModelName,
    NoTools,
    PromptFormat,
    ReasoningEffort,
    Recipe,
    Samples,
    Speculative,
    Temperature,
    announce,
    fail,
    print_json,
    settings_of,
    with_overrides,
)
from mathagent.config import API_PORT, Settings


def solve(
    ctx: typer.Context,
    problem: Annotated[str, typer.Argument(help="The problem statement.")],
    no_tools: NoTools = False,
    samples: Samples = None,
    base_url: BaseUrl = None,
    model: ModelName = None,
    max_tool_calls: MaxToolCalls = None,
    temperature: Temperature = None,
    max_tokens: MaxTokens = None,
    prompt_format: PromptFormat = None,
    reasoning_effort: ReasoningEffort = None,
    recipe: Recipe = None,
    speculative: Speculative = None,
    as_json: AsJson = False,
) -> None:
    """Solve one problem; the last line of plain output is the final answer."""
    from mathagent.agent.solver import SolveOptions

    if not problem.strip():
        raise fail("the problem is empty", code=2)
    agent = {"prompt_format": prompt_format, "reasoning_effort": reasoning_effort, "recipe": recipe}
    settings = with_overrides(
        settings_of(ctx),
        base_url=base_url,
        model=model,
        agent=agent,
        engine={"speculative": speculative},
    )
    options = SolveOptions(
        tools=not no_tools,
        samples=samples,
        max_tool_calls=max_tool_calls,
        temperature=temperature,
        max_tokens=max_tokens,
    )
    try:
        result = asyncio.run(_solve(settings, problem, options, show=not as_json))
    except SETUP_ERRORS as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json(result.model_dump(mode="json"))
    elif result.answer is None:
        raise fail(result.error or "no final answer was found")
    else:
        typer.echo(result.answer)


async def _solve(settings: Settings, problem: str, options: Any, show: bool) -> Any:
    from rich.console import Console

    from mathagent.agent.events import ResultEvent
    from mathagent.agent.plan import planned_samples
    from mathagent.agent.transcript import Transcript
    from mathagent.runtime import open_solver

    transcript, result = Transcript(Console(highlight=False)), None
    rows = options.samples or planned_samples(settings.agent)
    async with (
        open_solver(settings, tools=options.tools, concurrent_rows=rows) as rt,
        aclosing(rt.solver.stream(problem, options)) as events,
    ):
        async for event in events:
            if show:
                transcript.show(event)
            if isinstance(event, ResultEvent):
                result = event.result
    return result


def api(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = API_PORT,
    host: Host = None,
) -> None:
    """Serve the /solve HTTP API."""
    settings = with_overrides(settings_of(ctx), host=host)
    try:
        asyncio.run(_serve_api(settings, port))
    except SETUP_ERRORS as exc:
        raise fail(str(exc)) from exc


async def _serve_api(settings: Settings, port: int) -> None:
    import uvicorn

    from mathagent.agent.api import create_app
    from mathagent.runtime import open_solver

    async with open_solver(settings, tools=True) as rt:
        app = create_app(rt.solver, settings)
        config = uvicorn.Config(app, host=settings.host, port=port, log_level="info")
        announce("mathagent api", settings.host, port)
        auth = "on (MATHAGENT_API_KEY)" if settings.api_key else "off: set MATHAGENT_API_KEY"
        typer.echo(f"mathagent api: bearer auth {auth}", err=True)
        await uvicorn.Server(config).serve()
