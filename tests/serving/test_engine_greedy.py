"""Greedy decoding equals transformers token for token; batching does not change tokens."""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.config import SamplingParams

from .conftest import PROMPTS

MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_model(engine):
    from transformers import AutoModelForCausalLM

    # The engine's cached conversion of the same GGUF: identical float32 weights.
    return AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=torch.float32).eval()


def _hf_greedy(hf_model, tokenizer, prompt: str, eos: tuple[int, ...]) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = hf_model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1] :]
    tokens = out.tolist()
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[:i]  # the engine does not return the stop token
    return tokens


def test_greedy_matches_transformers(engine, hf_model):
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    results = engine.generate(PROMPTS, params)
    mismatches = []
    for prompt, res in zip(PROMPTS, results, strict=True):
        expected = _hf_greedy(hf_model, engine.tokenizer, prompt, engine.loaded.eos_token_ids)
        if res.token_ids != expected:
            mismatches.append((prompt, res.token_ids, expected))
        assert res.finish_reason in ("stop", "length")
    assert not mismatches, mismatches


def test_batched_equals_single(engine):
    params = SamplingParams(max_tokens=16, temperature=0.0)
    prompts = PROMPTS[:6]
    batched = engine.generate(prompts, params)
    for prompt, res in zip(prompts, batched, strict=True):
        (single,) = engine.generate([prompt], params)
        assert single.token_ids == res.token_ids
        assert single.text == res.text


def test_token_id_prompt_equals_text_prompt(engine):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    ids = engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    (a,), (b,) = engine.generate([PROMPTS[0]], params), engine.generate([ids], params)
    assert a.token_ids == b.token_ids and a.text == b.text
