"""Typed events of a solve, emitted as they happen (the SSE stream sends them as they are).

Concatenating a sample's ``text`` events and its ``tool_result`` outputs, in order, gives
exactly that sample's ``generation``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mathagent.agent.result import SampleResult, SolveResult, ToolCall


class TextEvent(BaseModel):
    """A chunk of model text; ``code`` marks text inside a code block."""

    type: Literal["text"] = "text"
    sample: int
    text: str
    code: bool = False


class ToolCallEvent(BaseModel):
    """A code block is about to run in the sample's sandbox session."""

    type: Literal["tool_call"] = "tool_call"
    sample: int
    index: int
    code: str


class ToolResultEvent(BaseModel):
    """A code block ran; ``output`` is the exact text appended to the model's context."""

    type: Literal["tool_result"] = "tool_result"
    sample: int
    index: int
    call: ToolCall
    output: str


class AnswerEvent(BaseModel):
    """A sample's final answer was found."""

    type: Literal["answer"] = "answer"
    sample: int
    answer: str


class DoneEvent(BaseModel):
    """A sample finished (for any reason); carries its full record."""

    type: Literal["done"] = "done"
    sample: int
    result: SampleResult


class ResultEvent(BaseModel):
    """The problem finished: every sample and the voted answer."""

    type: Literal["result"] = "result"
    result: SolveResult = Field(description="the same object POST /solve returns")


Event = TextEvent | ToolCallEvent | ToolResultEvent | AnswerEvent | DoneEvent | ResultEvent
