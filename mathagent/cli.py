"""The ``mathagent`` command line: one Typer app that wires the parts together.

Each command parses its options, builds the settings once, and hands over to the part that
does the work. Imports of the heavy parts happen inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

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
    import asyncio

    from mathagent.agent.solver import SolveOptions

    if not problem.strip():
        raise _fail("the problem is empty", code=2)
    settings = Settings()
    settings.base_url = base_url or settings.base_url
    settings.model = model or settings.model
    options = SolveOptions(
        tools=not no_tools,
        samples=samples,
        max_tool_calls=max_tool_calls,
        temperature=temperature,
        max_tokens=max_tokens,
    )
    try:
        result = asyncio.run(_solve(settings, problem, options, show=not as_json))
    except _AGENT_ERRORS as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        _print_json(result.model_dump(mode="json"))
    elif result.answer is None:
        raise _fail(result.error or "no final answer was found")
    else:
        typer.echo(result.answer)


@app.command()
def api(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = API_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
) -> None:
    """Serve the /solve HTTP API."""
    import asyncio

    settings = Settings()
    settings.host = host or settings.host
    try:
        asyncio.run(_serve_api(settings, port))
    except _AGENT_ERRORS as exc:
        raise _fail(str(exc)) from exc


class Launcher(StrEnum):
    native = "native"
    docker = "docker"


@app.command()
def serve(
    engine: Annotated[EngineKind, typer.Option(help="Which engine to run.")] = EngineKind.embedded,
    preset: Annotated[str | None, typer.Option(help="Named speculative configuration.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    speculative: Annotated[
        str | None,
        typer.Option(
            help="none | ngram | draft:PATH | redrafter:PATH (external: also eagle3:PATH)"
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = ENGINE_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Write configs and print commands only.")
    ] = False,
    tp_size: Annotated[int | None, typer.Option(min=1, help="Tensor-parallel GPUs.")] = None,
    max_draft_len: Annotated[int | None, typer.Option(min=1, help="Draft tokens per step.")] = None,
    trtllm_version: Annotated[
        str | None, typer.Option(help="TensorRT-LLM version to write the YAML for (1.0, 1.2, ...).")
    ] = None,
    nodes: Annotated[
        str | None, typer.Option(help="Comma-separated node addresses (multi-node hostfile).")
    ] = None,
    interfaces: Annotated[
        str | None, typer.Option(help="Comma-separated network interfaces for UCX/NCCL/MPI.")
    ] = None,
    launcher: Annotated[
        Launcher, typer.Option(help="trtllm: native binaries or the NGC docker image.")
    ] = Launcher.native,
    image: Annotated[str | None, typer.Option(help="Docker image for --launcher docker.")] = None,
    iter_stats: Annotated[
        bool, typer.Option("--iter-stats", help="trtllm: enable_iter_perf_stats for /metrics.")
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Folder for the YAML and scripts.")] = None,
    examples_dir: Annotated[
        str | None, typer.Option(help="TensorRT-LLM examples folder (ReDrafter build).")
    ] = None,
    calib_dataset: Annotated[
        str | None, typer.Option(help="Calibration set for FP8 quantization (ReDrafter).")
    ] = None,
    health_timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds to wait for GET /health.")
    ] = 1800.0,
) -> None:
    """Start an OpenAI-compatible inference server."""
    if engine is EngineKind.embedded:
        from mathagent.serving.embedded import serve as run_server
        from mathagent.serving.engine.config import EngineConfigError
        from mathagent.serving.engine.loader import ModelLoadError
        from mathagent.serving.engine.model import UnsupportedModelError

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
        return
    from mathagent.serving.launchers.plan import NoEquivalent
    from mathagent.serving.launchers.process import ServeError
    from mathagent.serving.launchers.serve import ServeRequest, build_plan, resolve_preset, run_plan

    name = preset or "custom"
    request = ServeRequest(
        engine=engine.value,
        preset=preset,
        model=model,
        speculative=speculative,
        tp_size=tp_size,
        max_draft_len=max_draft_len,
        host=host,
        port=None if port == ENGINE_PORT else port,  # a preset's own port wins over the default
        nodes=_split(nodes),
        interfaces=_split(interfaces),
        iter_stats=iter_stats,
        trtllm_version=trtllm_version,
        launcher=launcher.value,
        image=image,
        calib_dataset=calib_dataset,
        out=out or Settings().cache_dir / "serve" / f"{engine.value}-{name}",
        health_timeout_s=health_timeout,
        **({"examples_dir": examples_dir} if examples_dir else {}),
    )
    try:
        plan, info = build_plan(request, resolve_preset(request))
    except (NoEquivalent, KeyError, ValueError) as exc:
        raise _fail(str(exc).strip("'\"")) from exc
    written = plan.write_files()
    for line in info:
        typer.echo(f"# {line}")
    typer.echo(f"# config folder: {request.out.resolve()}")
    for path in written:
        typer.echo(f"# wrote {path}")
    typer.echo(plan.describe())
    if dry_run:
        return
    try:
        code = run_plan(plan, lambda line: typer.echo(line, err=True), health_timeout)
    except ServeError as exc:
        raise _fail(str(exc)) from exc
    raise typer.Exit(code)


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()] if value else []


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
            **_speculative_fields(m.speculative),
        }
    )


def _speculative_fields(stats: dict | None) -> dict:
    """accepted/drafted and per-position acceptance of a speculative run (empty otherwise)."""
    if stats is None:
        return {}
    keys = ("drafted_tokens", "accepted_tokens", "acceptance_rate", "per_position_acceptance")
    return {k: stats[k] for k in keys}


@sandbox_app.command("build")
def sandbox_build(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if up to date.")] = False,
) -> None:
    """Build the sandbox image (offline, from Debian packages)."""
    import docker

    from mathagent.sandbox.image import ImageBuildError, build_image

    settings = Settings()
    try:
        done = build_image(settings.sandbox, force=force)
    except (ImageBuildError, docker.errors.DockerException) as exc:
        raise _fail(str(exc)) from exc
    state = "built" if done.built else "up to date"
    typer.echo(f"{done.image}: {state} in {done.seconds:.1f} s")


@sandbox_app.command("serve")
def sandbox_serve(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = SANDBOX_PORT,
    host: Annotated[str | None, typer.Option(help="Bind address (default loopback).")] = None,
) -> None:
    """Serve the sandbox HTTP API."""
    import docker
    import uvicorn

    from mathagent.sandbox.image import image_tag
    from mathagent.sandbox.service import create_app

    settings = Settings()
    tag = image_tag(settings.sandbox)
    try:
        docker.from_env().images.get(tag)
    except docker.errors.ImageNotFound as exc:
        raise _fail(f"image {tag} is missing: run `mathagent sandbox build`") from exc
    except docker.errors.DockerException as exc:
        raise _fail(f"Docker is not available: {exc}") from exc
    app = create_app(settings.sandbox)
    uvicorn.run(app, host=host or settings.host, port=port, log_level="warning")


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
    temperature: Annotated[
        float | None, typer.Option(min=0.0, help="Sampling temperature.")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Tokens per generation.")] = None,
    max_tool_calls: Annotated[int | None, typer.Option(min=0, help="Code executions.")] = None,
    prompt_format: Annotated[
        str | None, typer.Option(help="auto | openmath | qwen | gpt-oss | fewshot")
    ] = None,
    column: Annotated[
        list[str] | None, typer.Option(help="FIELD=COLUMN for id/problem/answer, repeatable.")
    ] = None,
    modulo: Annotated[
        int | None, typer.Option(min=2, help="Grade integer answers modulo this (AIMO: 1000).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Evaluate the agent on a dataset; writes results.jsonl, summary.json, report.html."""
    import asyncio

    from mathagent.evals.eval_command import EvalRequest, run_eval_command

    overrides = {
        "temperature": temperature,
        "max_tokens": max_tokens,
        "max_tool_calls": max_tool_calls,
        "prompt_format": prompt_format,
    }
    request = EvalRequest(
        dataset=dataset,
        out=out,
        samples=samples,
        concurrency=concurrency,
        tools=not no_tools,
        limit=limit,
        columns=_columns(column),
        modulo=modulo,
        progress=not as_json,
    )
    settings = _settings_with(base_url, model, overrides)
    try:
        summary = asyncio.run(run_eval_command(request, settings))
    except (ValueError, RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from exc
    _print_summary(summary, out, as_json)
    if summary.get("num_failed"):
        raise _fail(f"{summary['num_failed']} samples failed (see the log); re-run to retry them")


def _columns(specs: list[str] | None) -> dict[str, str]:
    columns = {}
    for spec in specs or []:
        key, sep, name = spec.partition("=")
        if not sep or not key or not name:
            raise _fail(f"--column wants FIELD=COLUMN, got {spec!r}")
        columns[key.strip()] = name.strip()
    return columns


def _settings_with(base_url: str | None, model: str | None, agent: dict) -> Settings:
    top = {k: v for k, v in {"base_url": base_url, "model": model}.items() if v is not None}
    settings = Settings(**top)
    updates = {k: v for k, v in agent.items() if v is not None}
    if updates:
        merged = {**settings.agent.model_dump(), **updates}
        settings.agent = type(settings.agent).model_validate(merged)
    return settings


def _print_summary(summary: dict, out: Path, as_json: bool) -> None:
    if as_json:
        _print_json(summary)
        return
    keys = [k for k in summary if k.startswith(("pass@", "majority@"))]
    keys += ["no_answer", "avg_tokens", "tool_calls_per_solution", "tokens_per_s"]
    keys += ["latency_p50_s", "acceptance_length", "num_entries", "num_samples", "num_failed"]
    for key in keys:
        if key in summary:
            value = summary[key]
            typer.echo(f"{key:28} {value:.2f}" if isinstance(value, float) else f"{key:28} {value}")
    typer.echo(f"report: {out / 'report.html'}")


@app.command()
def bench(
    endpoint: Annotated[list[str], typer.Option(help="NAME=URL, repeatable.")],
    dataset: Annotated[str, typer.Option(help="Dataset path or name.")],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    limit: Annotated[int | None, typer.Option(min=1, help="First K problems only.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 4,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per request.")] = 1024,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: the endpoint's first).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """Compare serving configurations on the same problems."""
    import asyncio

    from mathagent.evals.bench import BenchConfig, BenchError, Endpoint, run_bench
    from mathagent.evals.datasets import DatasetError, load_dataset

    settings = Settings()
    try:
        endpoints = [Endpoint.parse(spec) for spec in endpoint]
        problems = load_dataset(dataset, data_dir=settings.data_dir, limit=limit)
        config = BenchConfig(out, concurrency, max_tokens, temperature, model)
        table = asyncio.run(run_bench(endpoints, problems, config, meta={"dataset": dataset}))
    except (BenchError, DatasetError) as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        _print_json(table)
        return
    for row in table["rows"]:
        acceptance = row["acceptance_length"]
        typer.echo(
            f"{row['name']:12} {row['total_generation_s']:8.1f} s  "
            f"{row['batch_tokens_per_s']:8.1f} tok/s  "
            f"{row['per_request_tokens_per_s']:6.1f} ± {row['per_request_tokens_per_s_sd']:.1f} "
            f"tok/s/req  TTFT {row['ttft_s']:.3f} s  "
            f"acc.len {'n/a' if acceptance is None else f'{acceptance:.2f}'}  "
            f"accuracy {row['accuracy']:.1f}%"
        )
    typer.echo(f"report: {out / 'report.html'}")


@app.command()
def report(out: Annotated[Path, typer.Argument(help="An eval or bench output folder.")]) -> None:
    """Rebuild report.html for an eval or bench folder."""
    from mathagent.evals.report import write_report

    try:
        typer.echo(str(write_report(out)))
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc


@app.command("train-drafter")
def train_drafter(
    base: Annotated[str, typer.Option(help="Base model path.")],
    data: Annotated[Path, typer.Option(help="Training text (JSONL, .jsonl.gz or text).")],
    out: Annotated[Path, typer.Option(help="Output folder for the drafter.")],
    draft_len: Annotated[int, typer.Option(min=1, help="Draft tokens per beam.")] = 3,
    layers: Annotated[int, typer.Option(min=1, help="Residual layers in the drafter.")] = 2,
    self_distill: Annotated[
        Path | None,
        typer.Option(help="JSONL of prompts/problems: first write --data from the base itself."),
    ] = None,
    distill_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens per self-distilled text.")
    ] = 256,
    distill_skip: Annotated[int, typer.Option(min=0, help="Skip the first K records.")] = 0,
    distill_limit: Annotated[int | None, typer.Option(min=1, help="Use at most K records.")] = None,
    distill_budget_s: Annotated[
        float | None, typer.Option(min=1.0, help="Stop generating after this many seconds.")
    ] = None,
    distill_samples: Annotated[
        int, typer.Option(min=0, help="Sampled texts per prompt besides the greedy one.")
    ] = 0,
    distill_temperature: Annotated[
        float, typer.Option(min=0.0, help="Temperature of the sampled texts.")
    ] = 0.7,
    distill_seed: Annotated[int, typer.Option(help="Seed of the sampled texts.")] = 0,
    distill_greedy: Annotated[
        bool, typer.Option(help="Also write each prompt's greedy text (off: samples only).")
    ] = True,
    extra_data: Annotated[
        list[Path] | None, typer.Option(help="More training text (repeatable), as --data.")
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training text.")] = 3,
    lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate.")] = 3e-3,
    batch_positions: Annotated[
        int, typer.Option(min=1, help="Text positions per training step.")
    ] = 4096,
    train_budget_s: Annotated[
        float | None, typer.Option(min=1.0, help="Stop training after this many seconds.")
    ] = None,
    exit_dim: Annotated[
        int | None, typer.Option(min=1, help="Own vocab head of this width (default: tied).")
    ] = None,
    draft_vocab: Annotated[
        int, typer.Option(min=0, help="Draft only from the N most frequent tokens (0: all).")
    ] = 0,
    kd_weight: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Share of the loss that is KL to the base's softmax."),
    ] = 0.0,
    device: Annotated[
        str | None, typer.Option(help="Engine device for the base (default: the settings').")
    ] = None,
    compact: Annotated[
        bool, typer.Option("--compact", help="Leave a base-tied vocab head out of the checkpoint.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the final metrics as JSON.")
    ] = False,
) -> None:
    """Train a ReDrafter head on a frozen base model."""
    import logging

    from mathagent.serving.engine import train_drafter as td
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.distill import DistillConfig
    from mathagent.serving.engine.distill import self_distill as self_distill_run
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import ModelLoadError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings()
    engine_settings = settings.engine
    if device is not None:
        engine_settings = engine_settings.model_copy(update={"device": device})
    model = None if base == "default" else base
    try:
        engine = LLMEngine(EngineConfig.from_settings(engine_settings, model), settings.model_dir)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    if engine.tokenizer is None:
        raise _fail(f"{base} has no tokenizer; train-drafter reads text")
    if self_distill is not None:
        records = [json.loads(x) for x in self_distill.read_text().splitlines() if x.strip()]
        prompts = [_drafter_prompt(r, engine) for r in records[distill_skip:][:distill_limit]]
        plan = DistillConfig(distill_tokens, distill_samples, distill_temperature, distill_seed,
                             distill_greedy, time_budget_s=distill_budget_s)  # fmt: skip
        self_distill_run(engine, prompts, data, plan)
    for path in [data, *(extra_data or [])]:
        if not path.is_file():
            raise _fail(f"no training data at {path}")
    cfg = td.TrainConfig(
        draft_len=draft_len, layers=layers, exit_dim=exit_dim, epochs=epochs, lr=lr,
        batch_positions=batch_positions, max_seq_len=engine.max_seq_len,
        time_budget_s=train_budget_s, base_batch=engine.config.max_batch_size,
        draft_vocab=draft_vocab, kd_weight=kd_weight,
    )  # fmt: skip
    encode = lambda text: engine.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    examples = [
        ex for path in [data, *(extra_data or [])]
        for ex in td.load_examples(path, encode, cfg.max_seq_len)
    ]  # fmt: skip
    base_fn = td.engine_base_fn(engine.runner)
    emb = engine.runner.model.tok_embeddings.weight.detach()
    head = engine.runner.model.output.weight.detach()
    metrics = td.train(base_fn, emb, examples, cfg, out, compact=compact, teacher_head=head)
    if as_json:
        _print_json(metrics)
    else:
        for key, value in metrics.items():
            typer.echo(f"{key}: {value}")


def _drafter_prompt(record: dict, engine):
    """A raw prompt, or a problem rendered as the agent would ask it (its template, tools on)."""
    from mathagent.serving.engine.distill import DistillPrompt

    ident, heldout = str(record.get("id", "")), bool(record.get("heldout", False))
    if "prompt" in record:
        return DistillPrompt(record["prompt"], ident, heldout)
    from mathagent.agent.prompts import ChatTemplate, select_template

    settings = Settings()
    template = select_template(settings.agent.prompt_format, engine.model_name, tools=True)
    messages = template.messages(record["problem"], settings.agent.max_tool_calls)
    return DistillPrompt(ChatTemplate(engine.tokenizer).render(messages), ident, heldout)


# Setup failures of the agent's parts, reported as one clear line.
_AGENT_ERRORS = (RuntimeError, OSError, ValueError)


@asynccontextmanager
async def _agent(settings: Settings, tools: bool) -> AsyncIterator[Any]:
    """A Solver over the configured endpoint, or over the embedded engine started here."""
    from mathagent.agent.llm import served_model
    from mathagent.agent.solver import build_solver

    async with AsyncExitStack() as stack:
        base_url, model = settings.base_url, settings.model
        if base_url is None:
            from mathagent.serving.embedded import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(settings, model=settings.model))
            base_url, model = server.base_url, server.model_name
        elif model is None:
            model = await served_model(base_url, settings.llm_api_key)
        sandbox = None
        if tools:
            from mathagent.sandbox import open_sandbox

            sandbox = await stack.enter_async_context(open_sandbox(settings))
        yield build_solver(settings, base_url, model, sandbox)


async def _solve(settings: Settings, problem: str, options: Any, show: bool) -> Any:
    from rich.console import Console

    from mathagent.agent.events import ResultEvent
    from mathagent.agent.transcript import Transcript

    transcript, result = Transcript(Console(highlight=False)), None
    async with (
        _agent(settings, options.tools) as solver,
        aclosing(solver.stream(problem, options)) as events,
    ):
        async for event in events:
            if show:
                transcript.show(event)
            if isinstance(event, ResultEvent):
                result = event.result
    return result


async def _serve_api(settings: Settings, port: int) -> None:
    import uvicorn

    from mathagent.agent.api import create_app

    async with _agent(settings, tools=True) as solver:
        app = create_app(solver, settings)
        config = uvicorn.Config(app, host=settings.host, port=port, log_level="info")
        await uvicorn.Server(config).serve()


def _print_json(obj: object) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
