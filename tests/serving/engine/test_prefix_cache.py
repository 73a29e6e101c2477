"""Prefix reuse across KV-cache slots: the scheduler's choices, and equal tokens end to end."""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.scheduler import Scheduler, common_prefix
from mathagent.serving.engine.sequence import Sequence

GREEDY = SamplingParams(max_tokens=6, temperature=0)


class _NoText:
    """A detokeniser stand-in: scheduler tests never decode text."""

    stopped_by = None

    def add(self, ids: list[int], final: bool = False) -> str:
        return ""


def _seq(name: str, prompt: list[int]) -> Sequence:
    return Sequence(name, prompt, GREEDY, _NoText(), ())  # type: ignore[arg-type]


def _run_to_end(sched: Scheduler, seq: Sequence, generated: list[int]) -> None:
    """Admit ``seq``, pretend its prompt and ``generated`` were cached, then finish it."""
    sched.add(seq)
    batch = sched.schedule()
    assert batch is not None and batch.seqs == [seq]
    seq.output_ids = list(generated)
    seq.num_cached = len(seq.all_ids) - 1  # the last generated token is never fed back
    sched.finish(seq)


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [([], [1], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2, 4], 2), ([5], [1, 5], 0)],
)
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_next_turn_takes_over_the_freed_slot_without_a_copy():
    sched = Scheduler(num_slots=4)
    first = _seq("turn-1", [1, 2, 3, 4])
    _run_to_end(sched, first, [5, 6, 7])
    assert sched.free[0] == [1, 2, 3, 4, 5, 6]  # its K/V stay in slot 0
    second = _seq("turn-2", [1, 2, 3, 4, 5, 6, 7, 8, 9])  # conversation so far + a tool result
    sched.add(second)
    sched.schedule()
    assert second.slot == 0 and second.prefix_source is None
    assert second.num_cached == second.metrics.cached_tokens == 6
    assert 0 not in sched.free


def test_a_running_sequence_lends_its_prefix_by_copy():
    sched = Scheduler(num_slots=4)
    running = _seq("a", [1, 2, 3, 4, 5])
    sched.add(running)
    sched.schedule()
    running.num_cached = 5
    other = _seq("b", [1, 2, 3, 9])
    sched.add(other)
    sched.schedule()
    assert other.slot == 1 and other.prefix_source == (0, 3) and other.num_cached == 3


def test_the_last_prompt_token_is_always_prefilled():
    sched = Scheduler(num_slots=2)
    _run_to_end(sched, _seq("a", [1, 2, 3]), [4, 5])
    again = _seq("b", [1, 2, 3])
    sched.add(again)
    sched.schedule()
    assert again.num_cached == 2 and not again.prefill_done


def test_requests_sharing_a_cached_prompt_start_decoding_together():
    sched = Scheduler(num_slots=4)
    _run_to_end(sched, _seq("warm", [1, 2, 3]), [4])
    same = [_seq(f"r{i}", [1, 2, 3]) for i in range(3)]
    long = _seq("long", [8, 8, 8, 8])
    for seq in [*same, long]:
        sched.add(seq)
    first = sched.schedule()  # all four were admitted in one go
    assert first is not None and first.kind == "decode"
    assert {s.request_id for s in first.seqs} == {"r0", "r1", "r2"}
    second = sched.schedule()  # the uncached prompt has its prefill step
    assert second is not None and second.kind == "prefill" and second.seqs == [long]
    assert [s.num_cached for s in same] == [2, 2, 2]  # each feeds token 3 in the decode step
    assert same[0].slot == 0 and {same[1].prefix_source, same[2].prefix_source} == {(0, 2)}


def test_eviction_prefers_empty_then_least_recently_freed_slots():
    sched = Scheduler(num_slots=2)
    _run_to_end(sched, _seq("a", [1, 2]), [3])  # slot 0
    _run_to_end(sched, _seq("b", [7, 8]), [9])  # the empty slot 1, not slot 0's prefix
    assert sched.free == {0: [1, 2], 1: [7, 8]}
    fresh = _seq("c", [4, 4])
    sched.add(fresh)
    sched.schedule()
    assert fresh.slot == 0 and fresh.num_cached == 0  # slot 0 was freed first


def test_switched_off_nothing_is_kept_or_reused():
    sched = Scheduler(num_slots=2, prefix_caching=False)
    _run_to_end(sched, _seq("a", [1, 2, 3]), [4])
    assert sched.free == {0: [], 1: []}
    again = _seq("b", [1, 2, 3, 4, 5])
    sched.add(again)
    sched.schedule()
    assert again.num_cached == 0 and again.metrics.cached_tokens == 0


def test_reused_prefixes_give_the_same_greedy_tokens(engine_settings, default_model):
    """An agent-style second turn (first prompt + its answer + more) and a request sharing a
    running request's prefix decode the same tokens as an engine that recomputes everything."""
    from mathagent.config import Settings
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine

    params = SamplingParams(max_tokens=16, temperature=0)
    engines = {}
    for caching in (True, False):
        settings = engine_settings.model_copy(update={"prefix_caching": caching})
        config = EngineConfig.from_settings(settings, default_model)
        engines[caching] = LLMEngine(config, Settings().model_dir)
    turn = "<|im_start|>user\nWhat is 12 * 7? Answer briefly.<|im_end|>\n<|im_start|>assistant\n"
    outputs: dict[bool, list[list[int]]] = {}
    for caching, eng in engines.items():
        (first,) = eng.generate([turn], params)
        follow = turn + first.text + "<|im_end|>\n<|im_start|>user\nAnd 12 * 8?<|im_end|>\n"
        follow += "<|im_start|>assistant\n"
        second, sibling = eng.generate([follow, follow[:-40] + " Explain."], params)
        outputs[caching] = [first.token_ids, second.token_ids, sibling.token_ids]
        cached = [second.metrics.cached_tokens, sibling.metrics.cached_tokens]
        assert (min(cached) > 10) if caching else cached == [0, 0]
    assert outputs[True] == outputs[False]


def test_drafter_training_cannot_touch_the_engines_slots(engine_settings, default_model):
    """Drafter training and distillation run forwards on slots they pick themselves: on the
    frozen base's own runner and cache, built from the engine's weights. The engine's K/V stay
    as they were, so a prompt a freed slot held is reused after training, with the same tokens."""
    from mathagent.config import Settings
    from mathagent.drafter.base import FrozenBase
    from mathagent.drafter.distill import BatchDistiller, BatchJob
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine

    eng = LLMEngine(
        EngineConfig.from_settings(engine_settings, default_model), Settings().model_dir
    )
    params = SamplingParams(max_tokens=8, temperature=0)
    prompt = "def fibonacci(n):"
    (before,) = eng.generate([prompt], params)
    keys, values = eng.runner.cache.k.clone(), eng.runner.cache.v.clone()
    base = FrozenBase(eng.loaded, eng.config)
    base.features([eng.encode("Once upon a time, there was a dragon")] * eng.config.max_batch_size)
    BatchDistiller(base, max_tokens=4).run([BatchJob(eng.encode("Once upon a time"))] * 3)
    assert torch.equal(eng.runner.cache.k, keys) and torch.equal(eng.runner.cache.v, values)
    (after,) = eng.generate([prompt], params)
    assert after.metrics.cached_tokens == len(eng.encode(prompt)) - 1  # the freed slot's prefix
    assert after.token_ids == before.token_ids
