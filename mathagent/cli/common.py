"""What every command shares: option types, the settings of this invocation, errors, JSON.

The app's callback builds :class:`Settings` once per invocation; a command that takes flags
derives a validated copy with :func:`with_overrides` instead of mutating it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from mathagent.config import Settings
from mathagent.serving.engine.spec_config import EMBEDDED_METHODS

BaseUrl = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible endpoint.")]
BaseUrls = Annotated[
    list[str] | None,
    typer.Option(
        "--base-url",
        help="OpenAI-compatible endpoint; repeat it (or give a comma list) for replicas.",
    ),
]
ModelName = Annotated[
    str | None, typer.Option("--model", help="Model name (or path when embedded).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
NoTools = Annotated[bool, typer.Option("--no-tools", help="Plain generation, no code.")]
Temperature = Annotated[
    float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature.")
]
MaxTokens = Annotated[
    int | None, typer.Option("--max-tokens", min=1, help="Tokens per generation.")
]
MaxToolCalls = Annotated[
    int | None, typer.Option("--max-tool-calls", min=0, help="Code executions.")
]
Host = Annotated[str | None, typer.Option("--host", help="Bind address (default loopback).")]
Speculative = Annotated[
    str | None,
    typer.Option(
        "--speculative",
        help=f"Embedded engine: {EMBEDDED_METHODS} (default: the default model's shipped "
        "EAGLE-3 head, none for other models).",
    ),
]
Samples = Annotated[
    int | None, typer.Option("--samples", min=1, help="Samples per problem (default 1; aimo2 16).")
]
PromptFormat = Annotated[
    str | None,
    typer.Option(
        "--prompt-format",
        help="auto | openmath | openmath-kaggle | qwen | qwen3 | gpt-oss | fewshot",
    ),
]
ReasoningEffort = Annotated[
    str | None,
    typer.Option("--reasoning-effort", help="gpt-oss reasoning effort: low | medium | high."),
]
Recipe = Annotated[
    str | None,
    typer.Option(
        "--recipe",
        help="aimo2: the AIMO-2 Kaggle setup (Kaggle prompt, 6 calls of 2 s, 200 chars, "
        "16 samples, early stop at 4 agreeing, 360 s per problem with a shared buffer).",
    ),
]

# Setup failures of the agent's parts (endpoint, sandbox, model files), reported as one line.
SETUP_ERRORS = (RuntimeError, OSError, ValueError)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` to stderr; raise the returned exit."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def announce(service: str, host: str, port: int) -> None:
    """Say on stderr where ``service`` listens and whether other machines can reach it."""
    loopback = host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
    reach = (
        "loopback only; --host or MATHAGENT_HOST to expose it"
        if loopback
        else "reachable from other machines"
    )
    typer.echo(f"{service}: listening on http://{host}:{port} ({reach})", err=True)


def load_settings() -> Settings:
    """The settings from the environment, or one clear line about the bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = [
            f"MATHAGENT_{'__'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        ]
        raise fail("bad configuration: " + "; ".join(lines), code=2) from exc


def settings_of(ctx: typer.Context) -> Settings:
    """This invocation's settings (built once by the app callback)."""
    if not isinstance(ctx.obj, Settings):
        ctx.obj = load_settings()
    return ctx.obj


def with_overrides(
    settings: Settings,
    *,
    agent: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    **top: Any,
) -> Settings:
    """A validated copy of ``settings`` with the flags the user gave (``None`` = not given)."""
    update = {k: v for k, v in top.items() if v is not None}
    for name, given in (("agent", agent), ("engine", engine)):
        given = {k: v for k, v in (given or {}).items() if v is not None}
        if given:
            section = getattr(settings, name)
            try:
                # only what was set before or given now counts as set (unset fields keep
                # the defaults the runtime chooses per job)
                before = section.model_dump(exclude_unset=True)
                update[name] = type(section).model_validate({**before, **given})
            except ValidationError as exc:
                raise fail(str(exc), code=2) from exc
    return settings.model_copy(update=update)


def print_json(obj: object) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
