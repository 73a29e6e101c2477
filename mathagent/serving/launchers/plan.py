"""A launch plan: the files to write, the one-shot steps to run, then the server command.

Launchers (TensorRT-LLM, vLLM, SGLang) only *render* plans; this module writes them, prints
them, and runs them. A ``--dry-run`` stops after writing and printing, so it needs no GPU and
no engine installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mathagent.serving.launchers.process import ServeError, ServerProcess


class NoEquivalent(ValueError):
    """The requested preset or method does not exist on the chosen engine."""


@dataclass(frozen=True)
class Step:
    """One command line, with the environment it needs on top of the caller's."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Already done when this path exists (downloads, checkpoints, engines): reruns resume.
    skip_if_exists: str | None = None

    def shell(self) -> str:
        """The step as one copy-pasteable shell line."""
        exports = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return exports + shlex.join(self.argv)


@dataclass
class LaunchPlan:
    """Everything one ``mathagent serve`` does for an external engine."""

    engine: str
    preset: str | None
    files: dict[Path, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    server: Step | None = None
    health_url: str = "http://127.0.0.1:8000/health"
    notes: list[str] = field(default_factory=list)
    # Run on stop when killing the client may leave something behind (a docker container).
    cleanup: list[str] | None = None
    # False when the plan spans machines this one cannot drive (print-only).
    runnable: bool = True
    # Paths that must exist before running, with the message to show when one does not.
    requires: dict[str, str] = field(default_factory=dict)

    def write_files(self) -> list[Path]:
        """Write the config files (YAML, hostfile, launch script); return their paths."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return list(self.files)

    def script(self) -> str:
        """The whole plan as a bash script: steps guarded by their skip paths, then the server."""
        lines = [
            "#!/usr/bin/env bash",
            f"# mathagent serve --engine {self.engine}",
            "set -euo pipefail",
        ]
        for step in self.steps:
            lines.append(f"# {step.name}")
            guard = f"[ -e {shlex.quote(step.skip_if_exists)} ] || " if step.skip_if_exists else ""
            lines.append(guard + step.shell())
        if self.server is not None:
            lines.append(f"# {self.server.name}")
            exports = [f"export {k}={shlex.quote(v)}" for k, v in self.server.env.items()]
            lines += [*exports, "exec " + shlex.join(self.server.argv)]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """Human-readable listing of every command, in order, for ``--dry-run``."""
        out: list[str] = []
        steps = [*self.steps, *([self.server] if self.server else [])]
        for i, step in enumerate(steps, 1):
            skip = f"  (skipped when {step.skip_if_exists} exists)" if step.skip_if_exists else ""
            out.append(f"# {i}. {step.name}{skip}")
            out += [f"export {k}={shlex.quote(v)}" for k, v in step.env.items()]
            out.append(shlex.join(step.argv))
        out += [f"# note: {note}" for note in self.notes]
        return "\n".join(out)


def health_url(host: str | None, port: int | None) -> str:
    """Where to probe a server bound to ``host:port`` (wildcard binds are probed on loopback)."""
    probe = host if host not in (None, "0.0.0.0", "::", "localhost") else "127.0.0.1"
    return f"http://{probe}:{port or 8000}/health"


def run_steps(plan: LaunchPlan, echo: Callable[[str], None]) -> None:
    """Run the one-shot steps in order, skipping finished ones; stop at the first failure."""
    for step in plan.steps:
        if step.skip_if_exists and Path(step.skip_if_exists).exists():
            echo(f"[mathagent] skip: {step.name} ({step.skip_if_exists} exists)")
            continue
        echo(f"[mathagent] {step.name}: {step.shell()}")
        env = {**os.environ, **step.env}
        try:
            done = subprocess.run(step.argv, env=env, stdout=sys.stderr, stderr=sys.stderr)
        except FileNotFoundError:
            raise ServeError(f"{step.argv[0]} not found on PATH (needed to {step.name})") from None
        if done.returncode != 0:
            raise ServeError(f"{step.name} failed with exit code {done.returncode}: {step.shell()}")


def server_process(plan: LaunchPlan, health_timeout_s: float) -> ServerProcess:
    """The plan's server as a :class:`ServerProcess` (not started)."""
    if plan.server is None:
        raise ServeError("this plan has no server command")
    return ServerProcess(
        plan.server.argv,
        env=plan.server.env,
        health_url=plan.health_url,
        name=plan.engine,
        startup_timeout_s=health_timeout_s,
        cleanup=plan.cleanup,
    )
