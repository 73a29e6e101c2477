"""How an OpenAI-compatible server says a request does not fit its context.

vLLM, SGLang and TensorRT-LLM refuse (400) a prompt plus ``max_tokens`` past the context rather
than cut the request short, and the agent's count of its prompt can fall a few tokens short of
theirs (text re-tokenised after the model wrote it): such a refusal means the context is spent.
"""

from __future__ import annotations

# vLLM's two wordings (serving_engine.py @ 7ded96b3 _validate_input, and its later one); SGLang's
# and TensorRT-LLM's as NeMo-Skills reads them (nemo_skills/inference/model/utils.py @ 81345c4e,
# is_context_window_exceeded_error).
CONTEXT_REFUSALS = (
    "maximum context length",
    "'max_completion_tokens' is too large",
    "Requested token count exceeds",
    "should not exceed max_seq_len",
)


def spent_context(status: int, message: str) -> bool:
    """Whether an error answer says the prompt plus ``max_tokens`` do not fit the context."""
    return status == 400 and any(words in message for words in CONTEXT_REFUSALS)
