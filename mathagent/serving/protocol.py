"""OpenAI-compatible request bodies and their mapping onto engine sampling parameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mathagent.serving.engine.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions (vLLM's extras included)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted; the engine's tokenizers add none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Any = None
    speculative: str | None = None  # extra field: this request's speculative method

    @field_validator("n")
    @classmethod
    def _only_one(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @model_validator(mode="after")
    def _unsupported(self) -> _SamplingFields:
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported")
        if self.logprobs not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return self

    def requested_max_tokens(self) -> int | None:
        """The ``max_tokens`` this request asks for; None when it sets none."""
        return self.max_tokens

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's parameters for this request (OpenAI defaults where unset)."""
        return SamplingParams(
            max_tokens=self.requested_max_tokens() or default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            speculative=self.speculative,
        )


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: a text prompt or a list of token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            if len(value) != 1:
                raise ValueError("exactly one prompt per request is supported")
            return value[0]
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text (text parts joined when content is a list)."""
        if isinstance(self.content, list):
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True

    def requested_max_tokens(self) -> int | None:
        """OpenAI's newer name first, as vLLM reads them (``max_completion_tokens or
        max_tokens``, serving_engine.py @ 7ded96b3)."""
        return self.max_completion_tokens or self.max_tokens
