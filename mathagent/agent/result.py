"""What one solve returns: typed records shared by the CLI, the /solve API and evals."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    """One code execution inside a generation."""

    code: str
    status: str = Field(description="sandbox status: completed | error | timeout | memory_limit")
    stdout: str = ""
    stderr: str = ""
    state_lost: bool = False
    duration_s: float = 0.0


class Segment(BaseModel):
    """One run of a generation: ``generation[start:end]`` is model text, code or tool output."""

    kind: Literal["text", "code", "output"]
    start: int
    end: int
    call: int | None = Field(None, description="index into tool_calls (code and output runs)")


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Timing(BaseModel):
    """Wall time split: model, sandbox and the agent's own overhead (seconds)."""

    total_s: float = 0.0
    model_s: float = 0.0
    sandbox_s: float = 0.0
    agent_s: float = 0.0


class SampleResult(BaseModel):
    """One generation (one sample) for a problem."""

    answer: str | None = None
    generation: str = Field("", description="the assistant text including code and output")
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str = Field(
        "", description="answer | eos | length | tool_budget | time | error | cancelled"
    )
    num_generated_tokens: int = 0
    usage: Usage = Field(default_factory=Usage)
    timing: Timing = Field(default_factory=Timing)
    error: str | None = None
    segments: list[Segment] = Field(
        default_factory=list,
        description="how the generation splits into text, code and output (offsets only)",
    )


class SolveResult(BaseModel):
    """All samples of one problem and the voted answer."""

    answer: str | None = None
    samples: list[SampleResult] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list, description="all samples' calls")
    usage: Usage = Field(default_factory=Usage)
    timing: Timing = Field(default_factory=Timing)
    error: str | None = Field(None, description="set when every sample failed, e.g. no endpoint")
