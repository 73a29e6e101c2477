"""Batched self-distillation on the real default model (fp32, CPU): the same greedy text as the
engine, and training rows identical to a separate teacher-forced pass over that text."""

from __future__ import annotations

import torch

from mathagent.serving.engine.batch_distill import BatchDistiller, BatchJob
from mathagent.serving.engine.drafter_data import build_positions
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.train_drafter import Example, engine_base_fn
from tests.serving.conftest import PROMPTS


def test_greedy_text_and_rows_match_the_engine_and_a_teacher_forced_pass(engine) -> None:
    prompts = [engine.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:5]]
    distiller = BatchDistiller(engine.runner, engine.loaded.eos_token_ids, max_tokens=7,
                               teacher=True, prefill_tokens=24)  # fmt: skip
    jobs = [BatchJob(p, tag=str(i)) for i, p in enumerate(prompts)]
    done = distiller.run(jobs)
    assert sorted(t.job.tag for t in done) == ["0", "1", "2", "3", "4"]
    want = engine.generate(prompts, SamplingParams(max_tokens=7, temperature=0.0))
    base_fn = engine_base_fn(engine.runner)
    for t in done:
        prompt = t.job.prompt_ids
        assert t.completion_ids == want[int(t.job.tag)].token_ids
        ex = Example(prompt + t.completion_ids[:-1], start=len(prompt))
        ref = build_positions(base_fn, [ex], 3, teacher=True)
        assert t.rows is not None and t.rows.size == ref.size
        assert torch.equal(t.rows.inputs, ref.inputs) and torch.equal(t.rows.labels, ref.labels)
        torch.testing.assert_close(t.rows.hidden, ref.hidden, rtol=1e-4, atol=1e-4)
        assert t.rows.teacher is not None and ref.teacher is not None
        ok = ref.labels >= 0
        torch.testing.assert_close(t.rows.teacher[ok], ref.teacher[ok], rtol=1e-4, atol=1e-4)


def test_sampled_jobs_refill_slots_and_a_budget_ends_them(engine) -> None:
    prompt = engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    jobs = [BatchJob(prompt, temperature=0.7, tag=str(i)) for i in range(20)]  # > 8 slots
    done = BatchDistiller(engine.runner, [], max_tokens=4, seed=1).run(jobs)
    assert len(done) == 20 and all(len(t.completion_ids) == 4 for t in done)
    assert len({tuple(t.completion_ids) for t in done}) > 1  # sampled, not all alike
    again = BatchDistiller(engine.runner, [], max_tokens=4, seed=1).run(jobs)  # a seeded run
    assert [t.completion_ids for t in again] == [t.completion_ids for t in done]
    cut = BatchDistiller(engine.runner, [], max_tokens=200).run(jobs, time_budget_s=0.0)
    assert len(cut) < 20
