"""``results.jsonl``: one line per (problem, sample), appended durably, repaired on resume.

Each record is written with one ``write`` of a whole line on an append-only descriptor and
fsynced, so a process killed at any moment leaves at most one torn last line; reopening cuts
it off. A record only exists once its line is complete, which makes a re-run exact-once. A
write that fails (a full disk) is cut back at once and raises :class:`ResultsError`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mathagent.agent.result import SampleResult
from mathagent.evals.datasets import Problem

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"


class ResultsError(RuntimeError):
    """A results file that cannot be resumed (a damaged line before the last one) or written
    (a full disk)."""


class ResultsFile:
    """Append-only, crash-safe store of result records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def load(self) -> list[dict[str, Any]]:
        """All complete records, after cutting a torn last line off the file."""
        if not self.path.exists():
            return []
        self._repair_tail()
        records = []
        with self.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ResultsError(f"{self.path}:{lineno}: damaged record ({exc.msg})") from exc
        return records

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line and make it durable before returning."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fsync(self._fd)
        except OSError as exc:
            # A full disk may take half a line: cut it so the file holds whole records only.
            os.ftruncate(self._fd, end)
            raise ResultsError(
                f"cannot write {self.path}: {exc.strerror or exc}; the records already there "
                "are whole: free space and re-run the same command to resume"
            ) from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _repair_tail(self) -> None:
        with self.path.open("rb+") as f:
            data = f.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                tail = data[end:]
                if _is_record(tail):
                    f.write(b"\n")  # complete record that lost only its newline
                else:
                    f.truncate(end)
                f.flush()
                os.fsync(f.fileno())


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def make_record(
    problem: Problem,
    sample: int,
    result: SampleResult,
    *,
    is_correct: bool,
    started_at: float,
    latency_s: float,
) -> dict[str, Any]:
    """The results.jsonl record of one sample (DESIGN.md schema plus diagnostics)."""
    return {
        "id": problem.id,
        "sample": sample,
        "problem": problem.problem,
        "expected_answer": problem.answer,
        "predicted_answer": result.answer,
        "is_correct": is_correct,
        "generation": result.generation,
        "tool_calls": [call.model_dump() for call in result.tool_calls],
        "segments": [segment.model_dump() for segment in result.segments],
        "num_generated_tokens": result.num_generated_tokens,
        "latency_s": latency_s,
        "finish_reason": result.finish_reason,
        "error": result.error,
        "usage": result.usage.model_dump(),
        "timing": result.timing.model_dump(),
        "modulo": problem.modulo,
        "started_at": started_at,
        "finished_at": started_at + latency_s,
        "written_at": time.time(),
    }
