"""What one completion request carries and how it ended: the conversation before the assistant
text, the sampling parameters, the finish."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# vLLM and TensorRT-LLM report which stop ended a completion (a string or a token id); others
# omit the field.
NOT_REPORTED = object()

Message = dict[str, str]


@dataclass
class Finish:
    """How a streamed completion ended."""

    finish_reason: str | None
    stop_reason: Any = NOT_REPORTED
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class GenParams:
    """Per-request sampling parameters; ``extra`` goes into the body as is (server extras)."""

    stop: list[str]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Conversation:
    """What is sent before the assistant text: a rendered prompt or chat messages."""

    prompt: str | None = None
    messages: list[Message] = field(default_factory=list)
