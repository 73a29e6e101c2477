"""Batched self-distillation on the real default model (fp32, CPU): the same greedy and seeded
sampled text as the engine, and training rows identical to a separate teacher-forced pass."""

from __future__ import annotations

import pytest
import torch

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import Example, build_positions
from mathagent.drafter.distill import BatchDistiller, BatchJob
from mathagent.serving.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS


def test_greedy_text_and_rows_match_the_engine_and_a_teacher_forced_pass(engine) -> None:
    prompts = [engine.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:5]]
    base = FrozenBase(engine.loaded, engine.config)
    distiller = BatchDistiller(base, max_tokens=7, teacher=True, prefill_tokens=24)
    jobs = [BatchJob(p, tag=str(i)) for i, p in enumerate(prompts)]
    done = distiller.run(jobs)
    assert [t.job.tag for t in done] == ["0", "1", "2", "3", "4"]  # in the jobs' order
    want = engine.generate(prompts, SamplingParams(max_tokens=7, temperature=0.0))
    for t in done:
        prompt = t.job.prompt_ids
        assert t.completion_ids == want[int(t.job.tag)].token_ids
        ex = Example(prompt + t.completion_ids[:-1], start=len(prompt))
        ref = build_positions(base.features, [ex], 3, teacher=True)
        assert t.rows is not None and t.rows.size == ref.size
        assert torch.equal(t.rows.inputs, ref.inputs) and torch.equal(t.rows.labels, ref.labels)
        torch.testing.assert_close(t.rows.hidden, ref.hidden, rtol=1e-4, atol=1e-4)
        assert t.rows.teacher is not None and ref.teacher is not None
        ok = ref.labels >= 0
        torch.testing.assert_close(t.rows.teacher[ok], ref.teacher[ok], rtol=1e-4, atol=1e-4)


def test_seeded_samples_and_stops_are_the_engines(engine) -> None:
    """A sampled job draws what the engine draws for a request with that seed, and ends (a stop
    token, or max_tokens) where the engine's request ends."""
    prompts = [engine.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[10:14]]
    jobs = [BatchJob(p, 0.8, str(i), seed=100 + i) for i, p in enumerate(prompts)]
    done = BatchDistiller(FrozenBase(engine.loaded, engine.config), max_tokens=24).run(jobs)
    params = [SamplingParams(max_tokens=24, temperature=0.8, seed=100 + i) for i in range(4)]
    want = engine.generate(prompts, params)
    assert [t.output_ids for t in done] == [w.token_ids for w in want]
    for t, w in zip(done, want, strict=True):
        assert t.stopped == (w.finish_reason == "stop")


def test_sampled_jobs_refill_slots_and_a_budget_ends_them(engine) -> None:
    prompt = engine.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    base = FrozenBase(engine.loaded, engine.config)
    jobs = [BatchJob(prompt, temperature=0.7, tag=str(i)) for i in range(20)]  # > 8 slots
    done = BatchDistiller(base, max_tokens=4, seed=1, eos_ids=[]).run(jobs)
    assert len(done) == 20 and all(len(t.completion_ids) == 4 for t in done)
    assert len({tuple(t.completion_ids) for t in done}) > 1  # sampled, not all alike
    again = BatchDistiller(base, max_tokens=4, seed=1, eos_ids=[]).run(jobs)  # a seeded run
    assert [t.completion_ids for t in again] == [t.completion_ids for t in done]
    cut = BatchDistiller(base, max_tokens=200, eos_ids=[]).run(jobs, time_budget_s=0.0)
    assert len(cut) < 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_graphs_the_distiller_writes_the_engines_greedy_text() -> None:
    """The GPU job's path: the base's own runner replays CUDA graphs for decode steps, and its
    greedy text equals the engine's (float32, sharp random weights: well-separated argmaxes)."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel
    from mathagent.serving.engine.model import ModelArgs, Transformer

    shape = dict(vocab_size=2048, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                 num_attention_heads=16, num_key_value_heads=4, architectures=["LlamaForCausalLM"])  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf_config(shape)).to("cuda").eval()
    for param in model.parameters():
        param.data.normal_(0.0, 0.08)
    config = EngineConfig(model=None, device=torch.device("cuda"), dtype=torch.float32,
                          max_batch_size=4, max_seq_len=256, speculative="none", draft_len=3,
                          draft_beams=1, eager=False, threads=None)  # fmt: skip
    loaded = LoadedModel(model, None, "random", None, ())
    engine = LLMEngine(config, model_dir=None, loaded=loaded)  # type: ignore[arg-type]
    base = FrozenBase(loaded, config)
    assert base.runner.graphs is not None and base.runner.cache is not engine.runner.cache
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (5, 19, 11, 3, 8, 13)]
    done = BatchDistiller(base, max_tokens=12, eos_ids=[]).run([BatchJob(p) for p in prompts])
    want = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    assert [t.completion_ids for t in done] == [w.token_ids for w in want]
    sampled = [BatchJob(p, 0.8, seed=i) for i, p in enumerate(prompts)]
    runs = [BatchDistiller(base, max_tokens=12, eos_ids=[]).run(sampled) for _ in range(2)]
    assert [t.completion_ids for t in runs[0]] == [t.completion_ids for t in runs[1]]
    assert all(len(t.completion_ids) == 12 for t in runs[0])
