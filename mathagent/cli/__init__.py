"""The ``mathagent`` command line: one Typer app, its commands grouped by the part they drive.

The app's callback reads the settings once per invocation; commands derive validated copies
with their flags (:mod:`mathagent.cli.common`). Heavy parts are imported inside the commands,
so ``--help`` stays fast.
"""

from __future__ import annotations

import typer

from mathagent.cli import drafter, evals, sandbox, serve, solve
from mathagent.cli.common import load_settings

app = typer.Typer(
    name="mathagent",
    help="Solve competition math with a tool-calling LLM, sandboxed Python and a fast engine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _settings(ctx: typer.Context) -> None:
    ctx.obj = load_settings()


app.command()(solve.solve)
app.command()(solve.api)
app.command()(serve.serve)
app.command()(serve.generate)
app.command("fetch-model")(serve.fetch_model)
app.add_typer(sandbox.app, name="sandbox")
app.command("eval")(evals.eval_)
app.command()(evals.bench)
app.command()(evals.report)
app.command("train-drafter", help=drafter.HELP)(drafter.train_drafter)

__all__ = ["app"]
