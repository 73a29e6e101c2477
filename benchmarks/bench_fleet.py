"""Embedded servers for the benchmarks, one per engine configuration, started through the CLI.

Each row of a table is a ``mathagent serve --engine embedded`` process with its own settings
in the environment (``MATHAGENT_ENGINE__*``), the way a user runs it. A row that cannot start
(fp8 off Hopper, a drafter that does not load) keeps the server's own error message and the
other rows go on. ``mathagent bench`` / ``eval`` run as CLI processes too (:func:`cli_json`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import engine_runs
import httpx


@dataclass
class Row:
    """One engine configuration: ``BASE[+SPEC]``, e.g. ``bf16``, ``fp8+redrafter``."""

    name: str
    env: dict[str, str]
    port: int
    url: str = ""
    error: str | None = None
    start_s: float | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    log: Path | None = None
    command: list[str] | None = None  # instead of `mathagent serve` (replay rows); + --port

    @classmethod
    def parse(cls, name: str, port: int, device: str, drafters: dict[str, str]) -> Row:
        base, _, spec = name.partition("+")
        if base not in engine_runs.RUNS:
            raise SystemExit(f"row {name!r}: base must be one of {', '.join(engine_runs.RUNS)}")
        replay = re.fullmatch(r"replay([1-9])", spec)
        if spec and spec not in drafters and spec != "ngram" and not replay:
            raise SystemExit(f"row {name!r}: speculation must be ngram, replayN (acceptance "
                             f"N, replay_server.py) or one of {list(drafters)}")  # fmt: skip
        method = "none" if not spec or replay else "ngram" if spec == "ngram" else f"{spec}:{drafters[spec]}"  # fmt: skip
        env = {
            "MATHAGENT_ENGINE__DEVICE": device,
            **engine_runs.env(base),
            "MATHAGENT_ENGINE__SPECULATIVE": method,
        }
        return cls(name, env, port, url=f"http://127.0.0.1:{port}")


def default_rows(device: str) -> list[str]:
    """The issue's rows where fp8 runs (Hopper); elsewhere their non-fp8 twins."""
    if device.startswith("cuda") and fp8_runs():
        return ["bf16", "fp8", "fp8+redrafter", "fp8+eagle3"]
    base = "bf16" if device.startswith("cuda") else "fp32"
    return [base, "bf16" if base == "fp32" else "fp32", f"{base}+redrafter", f"{base}+eagle3"]


def fp8_runs() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


class Fleet:
    """Start every row's server (the first alone: it converts the GGUF into the shared model
    cache, which the others then read), wait until each answers ``/v1/models``, stop them all."""

    def __init__(self, rows: list[Row], common_env: dict[str, str], timeout_s: float) -> None:
        self.rows, self.common_env, self.timeout_s = rows, common_env, timeout_s
        self.logs = Path(tempfile.mkdtemp(prefix="bench-fleet-"))

    def __enter__(self) -> Fleet:
        if self.rows:
            self._start(self.rows[:1])
            self._start(self.rows[1:])
        return self

    def __exit__(self, *exc: object) -> None:
        for row in self.rows:
            if row.proc is not None and row.proc.poll() is None:
                row.proc.terminate()
        for row in self.rows:
            if row.proc is not None:
                try:
                    row.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    row.proc.kill()

    @property
    def up(self) -> list[Row]:
        return [r for r in self.rows if r.error is None]

    def _start(self, rows: list[Row]) -> None:
        t0 = time.perf_counter()
        for row in rows:
            row.log = self.logs / f"{row.port}.log"
            env = {**os.environ, **self.common_env, **row.env, "PYTHONUNBUFFERED": "1"}
            cmd = row.command or [
                sys.executable,
                "-m",
                "mathagent",
                "serve",
                "--engine",
                "embedded",
            ]
            cmd += ["--port", str(row.port)]
            with row.log.open("wb") as log:
                row.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        for row in rows:
            row.error = self._wait(row, t0 + self.timeout_s)
            row.start_s = round(time.perf_counter() - t0, 2)

    @staticmethod
    def _wait(row: Row, deadline: float) -> str | None:
        """None once the server lists its model; else why not (its log's tail)."""
        assert row.proc is not None and row.log is not None
        while time.perf_counter() < deadline:
            if row.proc.poll() is not None:
                return f"server exited {row.proc.returncode}: {_tail(row.log)}"
            try:
                if httpx.get(f"{row.url}/v1/models", timeout=5).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        row.proc.terminate()
        return f"not up within the start timeout: {_tail(row.log)}"


def _tail(log: Path, chars: int = 600) -> str:
    return log.read_text(errors="replace")[-chars:].strip()


def cli_json(args: list[str], env: dict[str, str], timeout_s: float) -> dict:
    """Run ``mathagent ARGS --json``; its printed JSON, or {"error": ...}."""
    import json

    cmd = [sys.executable, "-m", "mathagent", *args, "--json"]
    try:
        done = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s: {' '.join(args)}"}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"}
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"error": f"no JSON in the output: {done.stdout[-300:]}"}
