"""A sample's transcript as offsets into its generation: which runs are text, code, output.

Built from the loop's own events (text chunks flagged as code, tool results), whose texts
concatenate to the generation, so the offsets cost a few integers per tool call and never copy
text. Readers (the eval report) render each run as the terminal does.
"""

from __future__ import annotations

from typing import Literal

from mathagent.agent.events import Event, TextEvent, ToolCallEvent, ToolResultEvent
from mathagent.agent.result import Segment

Kind = Literal["text", "code", "output"]


class SegmentLog:
    """Appends one segment per run of same-kind events; adjacent chunks of a kind merge."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._end = 0

    def add(self, event: Event) -> None:
        """Account for one event of the sample (events without text are ignored)."""
        if isinstance(event, ToolCallEvent):
            self._tag_open_code(event.index)
        elif isinstance(event, ToolResultEvent):
            self._extend("output", len(event.output), event.index)
        elif isinstance(event, TextEvent) and event.text:
            self._extend("code" if event.code else "text", len(event.text), None)

    def _extend(self, kind: Kind, length: int, call: int | None) -> None:
        last = self.segments[-1] if self.segments else None
        if last is not None and last.kind == kind and kind != "output":
            last.end += length
        else:
            self.segments.append(
                Segment(kind=kind, start=self._end, end=self._end + length, call=call)
            )
        self._end += length

    def _tag_open_code(self, index: int) -> None:
        """The code run just before a call is that call's code."""
        last = self.segments[-1] if self.segments else None
        if last is not None and last.kind == "code" and last.call is None:
            last.call = index
