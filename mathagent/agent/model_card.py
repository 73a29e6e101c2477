"""What an OpenAI-compatible endpoint's ``/v1/models`` says about the model it serves."""

from __future__ import annotations

from dataclasses import dataclass

import openai

from mathagent.agent.llm import LLMError


@dataclass(frozen=True)
class ModelCard:
    """What ``/v1/models`` says about a served model."""

    id: str
    max_model_len: int | None = None


async def model_card(base_url: str, api_key: str = "EMPTY", model: str | None = None) -> ModelCard:
    """The endpoint's card for ``model`` (default: the first it lists).

    vLLM and the embedded server report ``max_model_len``; TensorRT-LLM does not (``None``).
    A server that lists other names than ``model`` still serves it: then no context is known.
    """
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1) as client:
        try:
            models = await client.models.list()
        except openai.APIError as exc:
            raise LLMError(f"cannot list the models at {base_url}: {exc}") from exc
    if not models.data:
        raise LLMError(f"the endpoint at {base_url} serves no model")
    card = next((m for m in models.data if model is None or m.id == model), None)
    if card is None:
        return ModelCard(model or models.data[0].id)
    length = (card.model_extra or {}).get("max_model_len")
    return ModelCard(card.id, length if isinstance(length, int) and length > 0 else None)
