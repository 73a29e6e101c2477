"""The terminal transcript: prose, code and output set apart; other samples summarized."""

from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console

from mathagent.agent.events import DoneEvent, TextEvent, ToolResultEvent
from mathagent.agent.result import SampleResult, ToolCall
from mathagent.agent.transcript import Transcript


def render(events) -> str:
    out = io.StringIO()
    transcript = Transcript(Console(file=out, width=60, color_system=None))
    for e in events:
        transcript.show(e)
    return out.getvalue()


def test_code_and_output_are_set_apart():
    call = ToolCall(code="print(1)", status="completed", stdout="1\n", duration_s=0.5)
    text = render(
        [
            TextEvent(sample=0, text="Compute: "),
            TextEvent(sample=0, text="<tool_call>print(1)</tool_call>", code=True),
            ToolResultEvent(sample=0, index=0, call=call, output="\n```output\n1\n```\n"),
            TextEvent(sample=1, text="hidden sample text"),
            TextEvent(sample=0, text="\\boxed{1}"),
            DoneEvent(sample=0, result=SampleResult(answer="1", finish_reason="answer")),
        ]
    )
    assert "Compute: <tool_call>print(1)</tool_call>\n" in text
    assert "output · completed · 0.50 s" in text and "│ 1 " in text
    assert "hidden sample text" not in text
    assert text.rstrip().endswith("[sample 0] answer: 1 (stopped by: answer)")


def test_cli_rejects_an_empty_problem():
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", "solve", "  "],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "the problem is empty" in done.stderr
