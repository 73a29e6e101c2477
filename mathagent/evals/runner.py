"""The batch runner: every (problem, sample) once, concurrently, resumable after any crash.

The runner knows nothing about models: it takes a :class:`SampleSolver` (an async callable
that solves one sample of one problem) or, with ``EvalConfig.per_problem``, a
:class:`ProblemSolver` (all missing samples of a problem at once, for early stop and a
per-problem time budget), so unit tests drive it with a scripted fake and the CLI with the
agent. Pipeline: load what is done → queue the rest → C workers solve, grade, append →
summary.json → report.html.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mathagent.agent.result import SampleResult
from mathagent.evals.datasets import Problem
from mathagent.evals.grading import DEFAULT_TIMEOUT_S, answers_match
from mathagent.evals.metrics import summarize
from mathagent.evals.results import RESULTS_FILE, SUMMARY_FILE, ResultsFile, make_record

log = logging.getLogger(__name__)


class SampleSolver(Protocol):
    """Solves sample number ``sample`` of ``problem`` (samples differ by seed/sampling)."""

    def __call__(self, problem: Problem, sample: int) -> Awaitable[SampleResult]: ...


class ProblemSolver(Protocol):
    """Solves the listed samples of ``problem`` together; ``None`` marks a failed sample (not
    recorded, so a re-run retries it)."""

    def __call__(
        self, problem: Problem, samples: list[int]
    ) -> Awaitable[list[SampleResult | None]]: ...


@dataclass
class EvalConfig:
    """One eval run: where it writes and how much it does at once."""

    out_dir: Path
    samples: int = 1
    concurrency: int = 4
    progress: bool = True
    per_problem: bool = False  # the solver is a ProblemSolver; C problems are in flight
    grade_timeout_s: float = DEFAULT_TIMEOUT_S
    meta: dict[str, Any] = field(default_factory=dict)  # dataset, model, tools... for the report


@dataclass
class _Tally:
    """Live numbers for the progress bar."""

    done: int = 0
    correct: int = 0
    tokens: int = 0
    failed: int = 0
    started: float = field(default_factory=time.perf_counter)


async def run_eval(
    problems: Sequence[Problem],
    solve: SampleSolver | ProblemSolver,
    config: EvalConfig,
    *,
    meter: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run what ``config.out_dir`` lacks, then write summary.json and report.html.

    ``meter`` opens an acceptance meter (see :mod:`mathagent.evals.acceptance`) around the work;
    ``extra`` gives more summary fields at the end (the replicas' counts). Returns the summary. Samples whose solver raised are not recorded (a re-run retries them).
    """
    config.out_dir.mkdir(parents=True, exist_ok=True)
    store = ResultsFile(config.out_dir / RESULTS_FILE)
    existing = store.load()
    done = {(str(r["id"]), int(r["sample"])) for r in existing}
    todo: list[tuple[Problem, list[int]]] = []
    for p in problems:
        missing = [s for s in range(config.samples) if (p.id, s) not in done]
        if missing:
            todo += [(p, missing)] if config.per_problem else [(p, [s]) for s in missing]
    total = len(problems) * config.samples
    left = sum(len(samples) for _, samples in todo)
    tally = _Tally(done=total - left, correct=_count_correct(existing, problems, config.samples))
    meter_cm = meter() if meter else nullcontext()
    try:
        async with meter_cm as measured:
            await _run_all(todo, solve, config, store, tally, total)
    finally:
        store.close()
    acceptance = getattr(measured, "acceptance_length", None)
    more = extra() if extra else {}
    return write_summary(config.out_dir, problems, config, acceptance, tally.failed, more)


def _count_correct(records: list[dict[str, Any]], problems: Sequence[Problem], samples: int) -> int:
    ids = {p.id for p in problems}
    return sum(
        bool(r["is_correct"]) for r in records if r["id"] in ids and int(r["sample"]) < samples
    )


async def _run_all(
    todo: list[tuple[Problem, list[int]]],
    solve: SampleSolver | ProblemSolver,
    config: EvalConfig,
    store: ResultsFile,
    tally: _Tally,
    total: int,
) -> None:
    queue: asyncio.Queue[tuple[Problem, list[int]]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    with _progress(config.progress) as bar:
        task = bar.add_task("eval", total=total, completed=tally.done, acc="", tps="")
        workers = [
            asyncio.create_task(_worker(queue, solve, config, store, tally, bar, task))
            for _ in range(min(config.concurrency, max(len(todo), 1)))
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            # One worker's fatal error (a full results disk) stops the others before the
            # store closes: none may append behind a caller that already saw the error.
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)


async def _worker(
    queue: asyncio.Queue[tuple[Problem, list[int]]],
    solve: SampleSolver | ProblemSolver,
    config: EvalConfig,
    store: ResultsFile,
    tally: _Tally,
    bar: Progress,
    task: Any,
) -> None:
    while not queue.empty():
        problem, samples = queue.get_nowait()
        started_at, t0 = time.time(), time.perf_counter()
        try:
            if config.per_problem:
                results = await solve(problem, samples)  # type: ignore[arg-type]
            else:
                results = [await solve(problem, samples[0])]  # type: ignore[arg-type]
        except Exception as exc:  # one failed sample must not stop the run
            log.warning("problem %s samples %s failed: %s", problem.id, samples, exc)
            tally.failed += len(samples)
            continue
        latency = time.perf_counter() - t0
        for sample, result in zip(samples, results, strict=True):
            if result is None:
                tally.failed += 1
                continue
            own = latency if len(samples) == 1 else result.timing.total_s
            await _record(problem, sample, result, started_at, own, config, store, tally)
            _show(bar, task, tally)


async def _record(
    problem: Problem,
    sample: int,
    result: SampleResult,
    started_at: float,
    latency_s: float,
    config: EvalConfig,
    store: ResultsFile,
    tally: _Tally,
) -> None:
    correct = await asyncio.to_thread(
        answers_match,
        result.answer,
        problem.answer,
        modulo=problem.modulo,
        timeout_s=config.grade_timeout_s,
    )
    store.append(
        make_record(
            problem, sample, result, is_correct=correct, started_at=started_at, latency_s=latency_s
        )
    )
    tally.done += 1
    tally.correct += correct
    tally.tokens += result.num_generated_tokens


def _show(bar: Progress, task: Any, tally: _Tally) -> None:
    elapsed = time.perf_counter() - tally.started
    bar.update(
        task,
        advance=1,
        acc=f"acc {100 * tally.correct / tally.done:.1f}%",
        tps=f"{tally.tokens / elapsed:.1f} tok/s",
    )


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[acc]}"),
        TextColumn("{task.fields[tps]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),  # stdout stays clean for --json
        disable=not enabled,
        transient=False,
    )


def write_summary(
    out_dir: Path,
    problems: Sequence[Problem],
    config: EvalConfig,
    acceptance_length: float | None = None,
    failed: int = 0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json over this run's problems and samples, then report.html."""
    from mathagent.evals.report import write_report

    ids = {p.id for p in problems}
    records = [
        r
        for r in ResultsFile(out_dir / RESULTS_FILE).load()
        if r["id"] in ids and int(r["sample"]) < config.samples
    ]
    summary = summarize(records, acceptance_length=acceptance_length)
    summary["num_failed"] = failed
    summary["complete"] = failed == 0 and len(records) == len(problems) * config.samples
    summary["meta"] = {**config.meta, "samples": config.samples, "concurrency": config.concurrency}
    summary.update(extra or {})
    _write_json_atomic(out_dir / SUMMARY_FILE, summary)
    write_report(out_dir)
    return summary


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
