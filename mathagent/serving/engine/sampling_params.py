"""Per-request sampling parameters, validated at the engine's edge (HTTP, CLI, callers)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mathagent.serving.engine.spec_config import EMBEDDED_METHODS, embedded_method


class SamplingParams(BaseModel):
    """How one request is decoded. ``temperature == 0`` means greedy."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k cut")
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True  # as vLLM: special tokens' text is left out unless False
    speculative: str | None = Field(None, description=EMBEDDED_METHODS)

    @field_validator("speculative")
    @classmethod
    def _known_method(cls, value: str | None) -> str | None:
        return None if value is None else str(embedded_method(value))

    @field_validator("stop", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax."""
        return self.temperature == 0.0 or self.top_k == 1
