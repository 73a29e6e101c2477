"""``mathagent serve``, ``generate`` and ``fetch-model``: the engines and the model cache."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from mathagent.cli import launch
from mathagent.cli.common import (
    AsJson,
    Host,
    Speculative,
    announce,
    fail,
    print_json,
    settings_of,
    with_overrides,
)
from mathagent.config import ENGINE_PORT, Settings
from mathagent.serving.engine.spec_config import EMBEDDED_METHODS

Replicas = Annotated[
    int,
    typer.Option(
        min=1,
        help="Embedded: this many servers on consecutive ports, one per visible GPU "
        "(CPU: the threads split between them).",
    ),
]


class EngineKind(StrEnum):
    embedded = "embedded"
    trtllm = "trtllm"
    vllm = "vllm"
    sglang = "sglang"


def serve(
    ctx: typer.Context,
    engine: Annotated[EngineKind, typer.Option(help="Which engine to run.")] = EngineKind.embedded,
    preset: Annotated[str | None, typer.Option(help="Named speculative configuration.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    speculative: Speculative = None,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = ENGINE_PORT,
    host: Host = None,
    replicas: Replicas = 1,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write configs and print commands only.")
    ] = False,
    tp_size: launch.TpSize = None,
    max_draft_len: launch.MaxDraftLen = None,
    trtllm_version: launch.TrtllmVersion = None,
    nodes: launch.Nodes = None,
    interfaces: launch.Interfaces = None,
    launcher: launch.LauncherOpt = launch.Launcher.native,
    image: launch.Image = None,
    iter_stats: launch.IterStats = False,
    out: launch.Out = None,
    examples_dir: launch.ExamplesDir = None,
    calib_dataset: launch.CalibDataset = None,
    health_timeout: launch.HealthTimeout = 1800.0,
) -> None:
    """Start an OpenAI-compatible inference server."""
    settings = settings_of(ctx)
    if engine is EngineKind.embedded:
        settings = with_overrides(settings, host=host, engine={"speculative": speculative})
        _serve_embedded(settings, model, port, dry_run, replicas)
        return
    if replicas > 1:
        raise fail("--replicas is for the embedded engine (external engines: --tp-size)")
    from mathagent.serving.launchers.serve import ServeRequest

    request = ServeRequest(
        engine=engine.value,
        preset=preset,
        model=model,
        speculative=speculative,
        tp_size=tp_size,
        max_draft_len=max_draft_len,
        host=host,
        port=None if port == ENGINE_PORT else port,  # a preset's own port wins over the default
        nodes=launch.split_list(nodes),
        interfaces=launch.split_list(interfaces),
        iter_stats=iter_stats,
        trtllm_version=trtllm_version,
        launcher=launcher.value,
        image=image,
        calib_dataset=calib_dataset,
        out=out or settings.cache_dir / "serve" / f"{engine.value}-{preset or 'custom'}",
        health_timeout_s=health_timeout,
        **({"examples_dir": examples_dir} if examples_dir else {}),
    )
    launch.serve_external(request, dry_run)


def _serve_embedded(
    settings: Settings, model: str | None, port: int, dry_run: bool, replicas: int = 1
) -> None:
    if replicas > 1:
        _serve_replicas(settings, model, port, replicas, dry_run)
        return
    from mathagent.model_store import ModelFetchError
    from mathagent.runtime import engine_builder, engine_settings_for
    from mathagent.serving.embedded import serve as run_server
    from mathagent.serving.engine.config import EngineConfigError
    from mathagent.serving.engine.loader import ModelLoadError
    from mathagent.serving.engine.model import UnsupportedModelError

    if dry_run:
        typer.echo(f"embedded engine: model={model or settings.model or 'default'} port={port}")
        return
    announce("mathagent embedded engine", settings.host, port)
    try:
        engine = engine_settings_for(
            settings.engine, settings.engine.max_batch_size, model or settings.model
        )
        run_server(engine_builder(settings, model, engine), settings.host, port)
    except (EngineConfigError, ModelLoadError, UnsupportedModelError, ModelFetchError) as exc:
        raise fail(str(exc)) from exc


def _serve_replicas(
    settings: Settings, model: str | None, port: int, replicas: int, dry_run: bool
) -> None:
    from mathagent.serving.replicas import ReplicaError, plan_replicas, run_replicas

    extra = ["--model", model] if model else []
    if "speculative" in settings.engine.model_fields_set:  # a chosen none too: it beats the default
        extra += ["--speculative", settings.engine.speculative]
    engine = settings.engine
    try:
        plan = plan_replicas(replicas, settings.host, port, engine.device, engine.threads, extra)
        if dry_run:
            for i in range(plan.replicas):
                typer.echo(plan.shown(i))
            typer.echo(f"MATHAGENT_BASE_URL={','.join(plan.urls())}")
            return
        status = run_replicas(plan, typer.echo)
    except ReplicaError as exc:
        raise fail(str(exc)) from exc
    if status:
        raise typer.Exit(status)


def generate(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="Raw prompt text.")],
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    speculative: Annotated[str, typer.Option(help=EMBEDDED_METHODS)] = "none",
    model: Annotated[str | None, typer.Option(help="Model path (default: SmolLM2).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    as_json: AsJson = False,
) -> None:
    """Generate text with the embedded engine."""
    from mathagent.model_store import ModelFetchError
    from mathagent.runtime import engine_config
    from mathagent.serving.engine.config import EngineConfigError
    from mathagent.serving.engine.llm_engine import LLMEngine, PromptError
    from mathagent.serving.engine.loader import ModelLoadError
    from mathagent.serving.engine.model import UnsupportedModelError
    from mathagent.serving.engine.sampling_params import SamplingParams

    settings = with_overrides(settings_of(ctx), engine={"speculative": speculative})
    errors = (EngineConfigError, ModelLoadError, UnsupportedModelError, PromptError)
    try:
        engine = LLMEngine(engine_config(settings, model), settings.model_dir)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        (result,) = engine.generate([prompt], params)
    except (*errors, ModelFetchError) as exc:
        raise fail(str(exc)) from exc
    if not as_json:
        typer.echo(result.text)
        return
    m = result.metrics
    elapsed = (m.finished or 0.0) - m.arrival
    print_json(
        {
            "text": result.text,
            "tokens": len(result.token_ids),
            "tokens_per_s": round(len(result.token_ids) / elapsed, 3) if elapsed > 0 else 0.0,
            "acceptance_length": round(m.acceptance_length, 3),
            **_speculative_fields(m.speculative),
        }
    )


def _speculative_fields(stats: dict | None) -> dict:
    """accepted/drafted, per-position acceptance and draft / verify milliseconds per step of a
    speculative run (empty otherwise)."""
    if stats is None:
        return {}
    keys = ("drafted_tokens", "accepted_tokens", "acceptance_rate", "per_position_acceptance",
            "draft_ms_per_step", "verify_ms_per_step")  # fmt: skip
    return {k: stats[k] for k in keys}


def fetch_model(ctx: typer.Context) -> None:
    """Fetch the default model (SmolLM2-135M-Instruct GGUF) into the model cache."""
    from mathagent.model_store import ModelFetchError, fetch_default_model

    try:
        path = fetch_default_model(settings_of(ctx).model_dir)
    except ModelFetchError as exc:
        raise fail(str(exc)) from exc
    typer.echo(str(path))
