"""Terminal rendering of a solve as it streams: prose plain, code in colour, output boxed.

Only the first sample streams live; other samples get one summary line when they finish, so
concurrent samples never interleave on screen.
"""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from mathagent.agent.events import DoneEvent, Event, TextEvent, ToolResultEvent
from mathagent.agent.result import ToolCall


def output_title(call: ToolCall) -> str:
    """The title of a call's output box (the terminal's and the eval report's)."""
    title = f"output · {call.status} · {call.duration_s:.2f} s"
    return title + " · session restarted" if call.state_lost else title


def output_body(call: ToolCall) -> str:
    """What a call's output box shows: stdout then stderr, as the sandbox returned them."""
    return (call.stdout + call.stderr).rstrip("\n") or "(no output)"


class Transcript:
    """Prints events to a rich console."""

    def __init__(self, console: Console, live_sample: int = 0) -> None:
        self.console, self.live = console, live_sample
        self._at_line_start = True

    def show(self, event: Event) -> None:
        """Render one event."""
        if isinstance(event, TextEvent) and event.sample == self.live:
            self._write(event.text, "bold cyan" if event.code else "")
        elif isinstance(event, ToolResultEvent) and event.sample == self.live:
            self._tool_result(event)
        elif isinstance(event, DoneEvent):
            self._done(event)

    def _write(self, text: str, style: str) -> None:
        if text:
            self.console.print(Text(text, style=style), end="", soft_wrap=True)
            self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._at_line_start:
            self.console.print()
            self._at_line_start = True

    def _tool_result(self, event: ToolResultEvent) -> None:
        call = event.call
        style = "green" if call.status == "completed" else "red"
        self._newline()
        panel = Panel(
            Text(output_body(call)),
            title=output_title(call),
            title_align="left",
            border_style=style,
        )
        self.console.print(panel)

    def _done(self, event: DoneEvent) -> None:
        result = event.result
        self._newline()
        why = result.finish_reason
        line = f"[sample {event.sample}] answer: {result.answer} (stopped by: {why})"
        if result.error:
            line += f" — {result.error}"
        self.console.print(Text(line, style="dim" if not result.error else "red"))
