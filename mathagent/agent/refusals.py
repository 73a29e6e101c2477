"""How an OpenAI-compatible server says a request does not fit its context.

vLLM, SGLang and TensorRT-LLM refuse (400) a prompt plus ``max_tokens`` past the context rather
than cut the request short, and the agent's count of its prompt can fall a few tokens short of
theirs (text re-tokenised after the model wrote it). vLLM's refusal says what it counted, so
the request can be made again for what fits; without numbers the context is taken as spent.
"""

from __future__ import annotations

import re

# vLLM's two wordings (serving_engine.py @ 7ded96b3 _validate_input, and its later one); SGLang's
# and TensorRT-LLM's as NeMo-Skills reads them (nemo_skills/inference/model/utils.py @ 81345c4e,
# is_context_window_exceeded_error).
CONTEXT_REFUSALS = (
    "maximum context length",
    "'max_completion_tokens' is too large",
    "Requested token count exceeds",
    "should not exceed max_seq_len",
)


# vLLM's numbers in both wordings: its limit, and its own count of the prompt.
_LIMIT = re.compile(r"maximum context length is (\d+)")
_PROMPT = re.compile(r"(\d+) in the messages|request has (\d+) input tokens")


def context_room(status: int, message: str) -> int | None:
    """None when an error answer is not a context refusal; else the tokens the server says fit
    after the prompt (its limit less its own count of the prompt), 0 when its words give no
    numbers."""
    if status != 400 or not any(words in message for words in CONTEXT_REFUSALS):
        return None
    limit, prompt = _LIMIT.search(message), _PROMPT.search(message)
    if limit is None or prompt is None:
        return 0
    return max(0, int(limit[1]) - int(prompt[1] or prompt[2]))
