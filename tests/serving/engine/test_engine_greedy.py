"""Greedy decoding equals transformers token for token; batching does not change tokens."""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.llm_engine import PromptError
from mathagent.serving.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS

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


def _hf_greedy_mismatch(hf_model, tokenizer, prompt: str, tokens: list[int], eos, finish: str):
    """First position where ``tokens`` is not transformers' greedy choice, or None.

    One teacher-forced forward checks the whole continuation: a sequence equals greedy output
    exactly when every token is the argmax given its prefix (and it ends where greedy ends),
    so this is the same check as ``generate`` at a 24th of the cost.
    """
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    full = torch.cat([ids, torch.tensor([tokens], dtype=ids.dtype)], dim=1)
    with torch.inference_mode():
        choice = hf_model(full).logits[0, ids.shape[1] - 1 :].argmax(-1).tolist()
    for i, tok in enumerate(tokens):
        if choice[i] != tok:
            return i
    if finish == "stop" and choice[len(tokens)] not in eos:
        return len(tokens)  # the engine stopped where greedy would have gone on
    if finish == "length" and len(tokens) != MAX_NEW:
        return len(tokens)
    return None


def test_greedy_matches_transformers(engine, hf_model):
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    results = engine.generate(PROMPTS, params)
    eos = engine.loaded.eos_token_ids
    mismatches = []
    for prompt, res in zip(PROMPTS, results, strict=True):
        assert res.finish_reason in ("stop", "length")
        at = _hf_greedy_mismatch(
            hf_model, engine.tokenizer, prompt, res.token_ids, eos, res.finish_reason
        )
        if at is not None:
            mismatches.append((prompt, at, res.token_ids))
    assert not mismatches, mismatches
    # And against transformers' own generate loop, on a few prompts (it is slow on CPU).
    for prompt, res in list(zip(PROMPTS, results, strict=True))[:3]:
        assert res.token_ids == _hf_greedy(hf_model, engine.tokenizer, prompt, eos)


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


def test_a_failed_generate_leaves_nothing_queued(engine, monkeypatch):
    """A bad prompt is refused before any of its batch is queued, and a step that raises
    aborts the call's requests: the next call sees only its own outputs."""
    params = SamplingParams(max_tokens=4, temperature=0.0)
    (before,) = engine.generate([PROMPTS[0]], params)
    with pytest.raises(PromptError, match="token ids must lie"):
        engine.generate([PROMPTS[0], [10**9]], params)
    assert not engine.has_unfinished()

    def broken(*_):
        raise RuntimeError("step failed")

    with monkeypatch.context() as m:
        m.setattr(engine.runner, "decode", broken)
        with pytest.raises(RuntimeError, match="step failed"):
            engine.generate(PROMPTS[:3], params)
    assert not engine.has_unfinished()
    (after,) = engine.generate([PROMPTS[0]], params)
    assert after.token_ids == before.token_ids
