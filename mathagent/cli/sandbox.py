"""``mathagent sandbox build|serve``: the sandbox image and its HTTP service."""

from __future__ import annotations

from typing import Annotated

import typer

from mathagent.cli.common import Host, announce, fail, settings_of
from mathagent.config import SANDBOX_PORT

app = typer.Typer(help="The Docker sandbox: build its image, serve it.", no_args_is_help=True)


@app.command("build")
def build(
    ctx: typer.Context,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if up to date.")] = False,
) -> None:
    """Build the sandbox image (offline, from Debian packages)."""
    import docker

    from mathagent.sandbox.image import ImageBuildError, build_image

    try:
        done = build_image(settings_of(ctx).sandbox, force=force)
    except (ImageBuildError, docker.errors.DockerException) as exc:
        raise fail(str(exc)) from exc
    state = "built" if done.built else "up to date"
    typer.echo(f"{done.image}: {state} in {done.seconds:.1f} s")


@app.command("serve")
def serve(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = SANDBOX_PORT,
    host: Host = None,
) -> None:
    """Serve the sandbox HTTP API."""
    import docker
    import uvicorn

    from mathagent.sandbox.image import image_tag
    from mathagent.sandbox.service import create_app

    settings = settings_of(ctx)
    tag = image_tag(settings.sandbox)
    try:
        docker.from_env().images.get(tag)
    except docker.errors.ImageNotFound as exc:
        raise fail(f"image {tag} is missing: run `mathagent sandbox build`") from exc
    except docker.errors.DockerException as exc:
        raise fail(f"Docker is not available: {exc}") from exc
    service = create_app(settings.sandbox)
    announce("mathagent sandbox", host or settings.host, port)
    uvicorn.run(service, host=host or settings.host, port=port, log_level="warning")
