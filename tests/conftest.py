"""Shared fixtures: settings isolated from the developer's environment, and one engine on the
real default model (fp32, CPU) for the whole session (engine, drafter and server tests)."""

from __future__ import annotations

import pytest

from mathagent.config import EngineSettings, Settings
from tests import triton_interpreter

# before any test module defines a Triton kernel: on a host without CUDA they run interpreted
triton_interpreter.enable()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Remove every MATHAGENT_* variable so tests see the defaults."""
    import os

    for key in list(os.environ):
        if key.startswith("MATHAGENT_"):
            monkeypatch.delenv(key)
    return monkeypatch


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1 + 1 =",
    "Question: What is 17 * 23 + 5?\nAnswer:",
    "Once upon a time, there was a",
    "The derivative of x^2 with respect to x is",
    "List three prime numbers:",
    "import numpy as np\n",
    "Water boils at a temperature of",
    "The square root of 144 is",
    "Translate to French: Good morning.\n",
    "A triangle has angles of 30 and 60 degrees. The third angle is",
    "The quick brown fox",
    "In Python, a list comprehension looks like",
    "Solve for x: 2x + 3 = 11.",
    "The sum of the first 10 positive integers is",
    "My favourite colour is",
    "Here is a haiku about the sea:\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "The largest planet in the solar system is",
]


@pytest.fixture(scope="session")
def engine_settings() -> EngineSettings:
    # speculation tests check every step verifies: the draft-length policy stays off here
    return EngineSettings(
        device="cpu", dtype="float32", max_batch_size=8, max_seq_len=1024, adaptive_draft=False
    )


@pytest.fixture(scope="session")
def default_model() -> str:
    """The default model's GGUF path (fetched once into the model cache)."""
    from mathagent.model_store import resolve_model

    return resolve_model(None, Settings().model_dir)


@pytest.fixture(scope="session")
def engine(engine_settings, default_model):
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine

    config = EngineConfig.from_settings(engine_settings, default_model)
    return LLMEngine(config, Settings().model_dir)
