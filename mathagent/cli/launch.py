"""``mathagent serve --engine trtllm|vllm|sglang``: a preset rendered as a launch plan, then run.

The options only external engines take live here; :func:`serve_external` takes them as one
:class:`~mathagent.serving.launchers.serve.ServeRequest`, prints the plan, and runs it unless
``--dry-run``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mathagent.cli.common import fail

if TYPE_CHECKING:
    from mathagent.serving.launchers.serve import ServeRequest


class Launcher(StrEnum):
    native = "native"
    docker = "docker"


TpSize = Annotated[int | None, typer.Option(min=1, help="Tensor-parallel GPUs.")]
MaxDraftLen = Annotated[int | None, typer.Option(min=1, help="Draft tokens per step.")]
TrtllmVersion = Annotated[
    str | None,
    typer.Option(help="TensorRT-LLM release line (1.0-1.3): YAML spelling and docker image."),
]
Nodes = Annotated[
    str | None, typer.Option(help="Comma-separated node addresses (multi-node hostfile).")
]
Interfaces = Annotated[
    str | None, typer.Option(help="Comma-separated network interfaces for UCX/NCCL/MPI.")
]
LauncherOpt = Annotated[
    Launcher, typer.Option(help="trtllm: native binaries or the NGC docker image.")
]
Image = Annotated[str | None, typer.Option(help="Docker image for --launcher docker.")]
IterStats = Annotated[
    bool, typer.Option("--iter-stats", help="trtllm: enable_iter_perf_stats for /metrics.")
]
Out = Annotated[Path | None, typer.Option(help="Folder for the YAML and scripts.")]
ExamplesDir = Annotated[
    str | None, typer.Option(help="TensorRT-LLM examples folder (ReDrafter build).")
]
CalibDataset = Annotated[
    str | None,
    typer.Option(help="FP8 calibration set (ReDrafter): a dataset folder or a JSONL to build one."),
]
HealthTimeout = Annotated[float, typer.Option(min=1.0, help="Seconds to wait for GET /health.")]


def split_list(value: str | None) -> list[str]:
    """``"a, b,"`` -> ``["a", "b"]``."""
    return [item.strip() for item in value.split(",") if item.strip()] if value else []


def serve_external(request: ServeRequest, dry_run: bool) -> None:
    """Build the plan from the request's preset and overrides; print it; run it."""
    from mathagent.serving.launchers.plan import NoEquivalent
    from mathagent.serving.launchers.process import ServeError
    from mathagent.serving.launchers.serve import build_plan, resolve_preset, run_plan

    try:
        plan, info = build_plan(request, resolve_preset(request))
    except (NoEquivalent, KeyError, ValueError) as exc:
        raise fail(str(exc).strip("'\"")) from exc
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
        code = run_plan(plan, lambda line: typer.echo(line, err=True), request.health_timeout_s)
    except ServeError as exc:
        raise fail(str(exc)) from exc
    raise typer.Exit(code)
