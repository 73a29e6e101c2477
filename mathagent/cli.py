"""The ``mathagent`` command line: one Typer app that wires the parts together.

Each command parses its options, builds the settings once, and hands over to the part that
does the work. Imports of the heavy parts happen inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from mathagent.config import API_PORT, ENGINE_PORT, SANDBOX_PORT, Settings

app = typer.Typer(
    name="mathagent",
    help="Solve competition math with a tool-calling LLM, sandboxed Python and a fast engine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
sandbox_app = typer.Typer(
    help="The Docker sandbox: build its image, serve it.", no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")


class EngineKind(StrEnum):
    embedded = "embedded"
    trtllm = "trtllm"
    vllm = "vllm"
    sglang = "sglang"


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def _not_yet(what: str) -> typer.Exit:
    return _fail(f"{what} is not available in this build yet", code=2)


@app.command("fetch-model")
def fetch_model() -> None:
    """Fetch the default model (SmolLM2-135M-Instruct GGUF) into the model cache."""
    from mathagent.serving.model_store import ModelFetchError, fetch_default_model

    settings = Settings()
    try:
        path = fetch_default_model(settings.model_dir)
    except ModelFetchError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(str(path))


@app.command()
def solve(
    problem: Annotated[str, typer.Argument(help="The problem statement.")],
    no_tools: Annotated[
        bool, typer.Option("--no-tools", help="Plain generation, no code.")
    ] = False,
    samples: Annotated[int, typer.Option(min=1, help="Generations to run and vote over.")] = 1,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name (or path when embedded).")] = None,
    max_tool_calls: Annotated[int | None, typer.Option(min=0, help="Code executions.")] = None,
    temperature: Annotated[
        float | None, typer.Option(min=0.0, help="Sampling temperature.")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Tokens per generation.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Solve one problem; the last line of plain output is the final answer."""
    raise _not_yet("solve")


@app.command()
def api(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = API_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
) -> None:
    """Serve the /solve HTTP API."""
    raise _not_yet("api")


@app.command()
def serve(
    engine: Annotated[EngineKind, typer.Option(help="Which engine to run.")] = EngineKind.embedded,
    preset: Annotated[str | None, typer.Option(help="Named speculative configuration.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    speculative: Annotated[
        str | None, typer.Option(help="none | ngram | draft:PATH | redrafter:PATH")
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = ENGINE_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write configs and print commands only.")
    ] = False,
) -> None:
    """Start an OpenAI-compatible inference server."""
    if engine is not EngineKind.embedded:
        raise _not_yet(f"serve --engine {engine.value}")
    from mathagent.serving.engine.config import EngineConfigError
    from mathagent.serving.engine.loader import ModelLoadError
    from mathagent.serving.engine.model import UnsupportedModelError
    from mathagent.serving.server import serve as run_server

    settings = Settings()
    if speculative is not None:
        settings.engine.speculative = speculative
    if dry_run:
        typer.echo(f"embedded engine: model={model or settings.model or 'default'} port={port}")
        return
    try:
        run_server(settings, model, host or settings.host, port)
    except (EngineConfigError, ModelLoadError, UnsupportedModelError) as exc:
        raise _fail(str(exc)) from exc


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="Raw prompt text.")],
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    speculative: Annotated[
        str, typer.Option(help="none | ngram | draft:PATH | redrafter:PATH")
    ] = "none",
    model: Annotated[str | None, typer.Option(help="Model path (default: SmolLM2).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Generate text with the embedded engine."""
    from mathagent.serving.engine.config import EngineConfig, EngineConfigError, SamplingParams
    from mathagent.serving.engine.llm_engine import LLMEngine, PromptError
    from mathagent.serving.engine.loader import ModelLoadError
    from mathagent.serving.engine.model import UnsupportedModelError

    settings = Settings()
    settings.engine.speculative = speculative
    try:
        config = EngineConfig.from_settings(settings.engine, model or settings.model)
        engine = LLMEngine(config, settings.model_dir)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        (result,) = engine.generate([prompt], params)
    except (EngineConfigError, ModelLoadError, UnsupportedModelError, PromptError) as exc:
        raise _fail(str(exc)) from exc
    m = result.metrics
    elapsed = (m.finished or 0.0) - m.arrival
    if not as_json:
        typer.echo(result.text)
        return
    _print_json(
        {
            "text": result.text,
            "tokens": len(result.token_ids),
            "tokens_per_s": round(len(result.token_ids) / elapsed, 3) if elapsed > 0 else 0.0,
            "acceptance_length": round(m.acceptance_length, 3),
        }
    )


@sandbox_app.command("build")
def sandbox_build(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if up to date.")] = False,
) -> None:
    """Build the sandbox image (offline, from Debian packages)."""
    raise _not_yet("sandbox build")


@sandbox_app.command("serve")
def sandbox_serve(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = SANDBOX_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
) -> None:
    """Serve the sandbox HTTP API."""
    raise _not_yet("sandbox serve")


@app.command("eval")
def eval_(
    dataset: Annotated[str, typer.Option(help="Dataset path or name (aime24, gsm8k, ...).")],
    out: Annotated[Path, typer.Option(help="Output folder (re-run to resume).")],
    samples: Annotated[int, typer.Option(min=1, help="Samples per problem.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Problems in flight.")] = 4,
    no_tools: Annotated[
        bool, typer.Option("--no-tools", help="Plain generation, no code.")
    ] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="First K problems only.")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name (or path when embedded).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Evaluate the agent on a dataset; writes results.jsonl, summary.json, report.html."""
    raise _not_yet("eval")


@app.command()
def bench(
    endpoint: Annotated[list[str], typer.Option(help="NAME=URL, repeatable.")],
    dataset: Annotated[str, typer.Option(help="Dataset path or name.")],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    limit: Annotated[int | None, typer.Option(min=1, help="First K problems only.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """Compare serving configurations on the same problems."""
    raise _not_yet("bench")


@app.command()
def report(out: Annotated[Path, typer.Argument(help="An eval or bench output folder.")]) -> None:
    """Rebuild report.html for an eval or bench folder."""
    raise _not_yet("report")


@app.command("train-drafter")
def train_drafter(
    base: Annotated[str, typer.Option(help="Base model path.")],
    data: Annotated[Path, typer.Option(help="Training text (JSONL or text).")],
    out: Annotated[Path, typer.Option(help="Output folder for the drafter.")],
    draft_len: Annotated[int, typer.Option(min=1, help="Draft tokens per beam.")] = 3,
    layers: Annotated[int, typer.Option(min=1, help="Residual layers in the drafter.")] = 2,
) -> None:
    """Train a ReDrafter head on a frozen base model."""
    raise _not_yet("train-drafter")


def _print_json(obj: object) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
