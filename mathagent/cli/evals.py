"""``mathagent eval``, ``bench`` and ``report``: batch evaluation and speed comparisons."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from mathagent.cli import common
from mathagent.cli.common import fail, print_json, settings_of, with_overrides


def eval_(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Option(help="Dataset path or name (aime24, gsm8k, ...).")],
    out: Annotated[Path, typer.Option(help="Output folder (re-run to resume).")],
    samples: common.Samples = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Problems in flight.")] = 4,
    no_tools: common.NoTools = False,
    limit: Annotated[int | None, typer.Option(min=1, help="First K problems only.")] = None,
    base_url: common.BaseUrls = None,
    model: common.ModelName = None,
    temperature: common.Temperature = None,
    max_tokens: common.MaxTokens = None,
    max_tool_calls: common.MaxToolCalls = None,
    prompt_format: common.PromptFormat = None,
    reasoning_effort: common.ReasoningEffort = None,
    recipe: common.Recipe = None,
    speculative: common.Speculative = None,
    column: Annotated[
        list[str] | None, typer.Option(help="FIELD=COLUMN for id/problem/answer, repeatable.")
    ] = None,
    modulo: Annotated[
        int | None, typer.Option(min=2, help="Grade integer answers modulo this (AIMO: 1000).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Evaluate the agent on a dataset; writes results.jsonl, summary.json, report.html."""
    from mathagent.evals.eval_command import EvalRequest
    from mathagent.runtime import run_eval

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
    agent = {
        "temperature": temperature,
        "max_tokens": max_tokens,
        "max_tool_calls": max_tool_calls,
        "prompt_format": prompt_format,
        "reasoning_effort": reasoning_effort,
        "recipe": recipe,
    }
    urls = ",".join(base_url) if base_url else None
    engine = {"speculative": speculative}
    settings = with_overrides(
        settings_of(ctx), base_url=urls, model=model, agent=agent, engine=engine
    )
    try:
        summary = asyncio.run(run_eval(request, settings))
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc)) from exc
    _print_summary(summary, out, as_json)
    if summary.get("num_failed"):
        raise fail(f"{summary['num_failed']} samples failed (see the log); re-run to retry them")


def _columns(specs: list[str] | None) -> dict[str, str]:
    columns = {}
    for spec in specs or []:
        key, sep, name = spec.partition("=")
        if not sep or not key or not name:
            raise fail(f"--column wants FIELD=COLUMN, got {spec!r}")
        columns[key.strip()] = name.strip()
    return columns


def _print_summary(summary: dict, out: Path, as_json: bool) -> None:
    if as_json:
        print_json(summary)
        return
    keys = [k for k in summary if k.startswith(("pass@", "majority@"))]
    keys += ["no_answer", "avg_tokens", "tool_calls_per_solution", "tokens_per_s"]
    keys += ["latency_p50_s", "acceptance_length", "num_entries", "num_samples", "num_failed"]
    for key in keys:
        if key in summary:
            value = summary[key]
            typer.echo(f"{key:28} {value:.2f}" if isinstance(value, float) else f"{key:28} {value}")
    for row in summary.get("replicas", []):
        typer.echo(
            f"replica {row['url']}: {row['requests']} requests, {row['failures']} failed, "
            f"{row['tokens_per_s']:.1f} tok/s"
        )
    typer.echo(f"report: {out / 'report.html'}")


def bench(
    ctx: typer.Context,
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
    from mathagent.evals.bench import BenchConfig, BenchError, Endpoint, run_bench
    from mathagent.evals.datasets import DatasetError, load_dataset

    settings = settings_of(ctx)
    try:
        endpoints = [Endpoint.parse(spec) for spec in endpoint]
        problems = load_dataset(dataset, data_dir=settings.data_dir, limit=limit)
        config = BenchConfig(out, concurrency, max_tokens, temperature, model)
        table = asyncio.run(run_bench(endpoints, problems, config, meta={"dataset": dataset}))
    except (BenchError, DatasetError) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json(table)
        return
    for row in table["rows"]:
        typer.echo(_bench_line(row))
    typer.echo(f"report: {out / 'report.html'}")


def _bench_line(row: dict) -> str:
    acceptance = row["acceptance_length"]
    return (
        f"{row['name']:12} {row['total_generation_s']:8.1f} s  "
        f"{row['batch_tokens_per_s']:8.1f} tok/s  "
        f"{row['per_request_tokens_per_s']:6.1f} ± {row['per_request_tokens_per_s_sd']:.1f} "
        f"tok/s/req  TTFT {row['ttft_s']:.3f} s  "
        f"acc.len {'n/a' if acceptance is None else f'{acceptance:.2f}'}  "
        f"accuracy {row['accuracy']:.1f}%"
    )


def report(
    dirs: Annotated[
        list[Path], typer.Argument(help="An eval or bench folder, or two eval folders A B.")
    ],
    out: Annotated[
        Path | None, typer.Option(help="Comparison page path (default A/compare-<B>.html).")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the page path (and a comparison's numbers) as JSON."),
    ] = False,
) -> None:
    """Rebuild DIR/report.html, or compare two eval runs side by side (A B)."""
    from mathagent.evals.report import comparison, load_run, write_comparison, write_report

    if len(dirs) > 2:
        raise fail(f"report takes one folder or two to compare, got {len(dirs)}", code=2)
    try:
        if len(dirs) == 1:
            page = write_report(dirs[0])
            if as_json:
                print_json({"page": str(page)})
            else:
                typer.echo(str(page))
            return
        path = write_comparison(dirs[0], dirs[1], out)
        if as_json:
            print_json({**comparison(load_run(dirs[0]), load_run(dirs[1])), "page": str(path)})
        else:
            typer.echo(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise fail(str(exc)) from exc
