"""Stop strings across token boundaries, stop tokens, sampling and seeds, length limits."""

from __future__ import annotations

import pytest

from mathagent.serving.engine.detokenizer import Detokenizer
from mathagent.serving.engine.sampling_params import SamplingParams


class CharTokenizer:
    """Scripted tokenizer: each id is a fixed text piece (a unit-test fake)."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


def _run(pieces: list[str], stop: list[str], include: bool = False) -> tuple[str, list[str]]:
    detok = Detokenizer(CharTokenizer(pieces), stop, include)
    deltas = []
    for n in range(1, len(pieces) + 1):
        deltas.append(detok.add(list(range(n))))
        if detok.stopped_by:
            break
    return "".join(deltas), deltas


def test_stop_string_split_across_tokens_is_caught_and_never_streamed():
    text, deltas = _run(["Let", " me", " <tool", "_ca", "ll>", "print"], ["<tool_call>"])
    assert text == "Let me "
    assert all("<" not in d for d in deltas)


def test_stop_string_included_when_asked():
    text, _ = _run(["a", "b", "ST", "OP", "c"], ["STOP"], include=True)
    assert text == "abSTOP"


def test_held_back_prefix_is_released_when_it_does_not_match():
    text, deltas = _run(["x", "<to", "ast>", "y"], ["<tool_call>"])
    assert text == "x<toast>y"
    assert deltas[1] == ""  # "<to" could start the stop string, so it waits


def test_earliest_of_several_stops_wins():
    text, _ = _run(["one ", "two ", "three"], ["three", "two"])
    assert text == "one "


def test_engine_stop_string_split_across_real_tokens(engine):
    prompt = "Count: 1, 2, 3,"
    (full,) = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0))
    assert ", 5," in full.text
    (cut,) = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0, stop=[", 5,"]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(", 5,")]


def test_stop_token_ids_and_max_tokens(engine):
    (full,) = engine.generate(["1 + 1 ="], SamplingParams(max_tokens=8, temperature=0))
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    stop_at = full.token_ids[3]
    params = SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_at])
    (cut,) = engine.generate(["1 + 1 ="], params)
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[: full.token_ids.index(stop_at)]
    # the forward that produced only the stop token adds no output: plain decode stays at 1.0
    assert full.metrics.acceptance_length == 1.0
    assert cut.metrics.acceptance_length == 1.0
    assert cut.metrics.target_forwards == len(cut.token_ids)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    (a,) = engine.generate(["Once upon a time"], params)
    b, _ = engine.generate(
        ["Once upon a time", "The weather today"], [params, params.model_copy(update={"seed": 5})]
    )
    assert a.token_ids == b.token_ids
    others = {
        tuple(r.token_ids)
        for s in range(4)
        for r in engine.generate(["Once upon a time"], params.model_copy(update={"seed": s}))
    }
    assert len(others) > 1  # different seeds do sample differently


def test_top_k_one_is_greedy(engine):
    (greedy,) = engine.generate(["The sky is"], SamplingParams(max_tokens=8, temperature=0))
    (k1,) = engine.generate(["The sky is"], SamplingParams(max_tokens=8, temperature=1, top_k=1))
    assert greedy.token_ids == k1.token_ids


@pytest.mark.parametrize(
    "bad",
    [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_tokens": 0}, {"stop": [""]}],
)
def test_invalid_sampling_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_context_limit_ends_with_length(engine):
    ids = [100] * (engine.max_seq_len - 3)
    (res,) = engine.generate([ids], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    assert res.finish_reason == "length"
    assert len(res.token_ids) == 3
