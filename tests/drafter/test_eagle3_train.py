"""EAGLE-3 training on the real default model: labels, features, a short fit, the saved head."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import IGNORE, Example
from mathagent.drafter.eagle3_data import Batch, sequence_features
from mathagent.drafter.eagle3_train import Eagle3TrainConfig, greedy_walk, train_eagle3
from mathagent.serving.engine.spec_decode.eagle3_loader import load_head
from tests.conftest import PROMPTS


def test_step_s_reads_token_t_plus_1_plus_s_and_names_t_plus_2_plus_s() -> None:
    toks = torch.arange(10, 16)[None]  # T = 6
    preds = torch.arange(20, 26)[None]
    batch = Batch(torch.zeros(1, 6, 3), toks, preds, torch.tensor([6]), torch.tensor([3]))
    assert batch.inputs(1)[0].tolist() == [12, 13, 14, 15, 0, 0]
    # label at t is preds[t + 1 + s] (token t + 2 + s), kept when t + 2 + s >= start (3) and inside
    assert batch.labels(0)[0].tolist() == [IGNORE, 22, 23, 24, 25, IGNORE]
    assert batch.labels(1)[0].tolist() == [22, 23, 24, 25, IGNORE, IGNORE]


def test_the_walk_drafts_after_each_kept_prefix_and_the_targets_token() -> None:
    # K = 2; T = 8; completion starts at 2, so the first root is token 2 (drafted from t = 1)
    right = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 1], [0, 1], [1, 1], [0, 0], [0, 0]]).bool()
    full = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0]).bool()
    # t = 1 keeps 1 (2 tokens), t = 3 keeps 2 (3 tokens), t = 6 is not fully labelled: stop
    assert greedy_walk(right, full, 2) == (5, 2)
    # from t = 0 the walk lands on t = 3 again, skipping t = 1, 2 (the position average
    # would count every t: it is not the walk)
    assert greedy_walk(right, full, 1) == (6, 2)


def test_features_are_the_captured_layer_inputs(engine) -> None:
    base = FrozenBase(engine.loaded, engine.config)
    ids = base.encode(PROMPTS[0])
    (feat,) = sequence_features(base, [Example(ids, 1)], (2, 15, 27), torch.float32)
    assert feat.aux.shape == (len(ids), 3 * 576) and base.model.capture == ()
    assert torch.equal(feat.tokens, torch.tensor(ids))
    # the last layer's output (id 30) normed is the final hidden state the head reads
    (last,) = sequence_features(base, [Example(ids, 1)], (2, 15, 30), torch.float32)
    _, hidden = base.runner.forward(torch.tensor([ids]), torch.arange(len(ids))[None], [0])
    torch.testing.assert_close(base.model.norm(last.aux[:, 1152:]), hidden[0])


def test_a_short_fit_saves_a_head_the_engine_loads(engine, tmp_path: Path) -> None:
    base = FrozenBase(engine.loaded, engine.config)
    examples = [Example(base.encode(p), 1, heldout=i == 0) for i, p in enumerate(PROMPTS[:4])]
    cfg = Eagle3TrainConfig(steps=3, eval_len=3, intermediate_size=64, draft_vocab=64, epochs=2,
                            batch_tokens=512, max_seq_len=base.max_seq_len)  # fmt: skip
    metrics = train_eagle3(base, examples, cfg, tmp_path)
    assert "eagle3_step0_top1" in metrics and metrics["chain_acceptance_length_at_3"] >= 1.0
    raw = json.loads((tmp_path / "config.json").read_text())
    size = raw["draft_vocab_size"]  # at most the distinct labels
    assert 0 < size <= 64 and raw["lm_head_from_target"] is True
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    head = load_head(tmp_path, base.model.args, base.model.output.weight)
    assert head.lm_head.weight.shape == (size, 576)
    assert metrics["walk_acceptance_length_at_3"] >= 1.0


def test_draft_vocab_0_or_the_vocabulary_drafts_from_all_of_it(engine, tmp_path: Path) -> None:
    base = FrozenBase(engine.loaded, engine.config)
    examples = [Example(base.encode(p), 1, heldout=i == 0) for i, p in enumerate(PROMPTS[:2])]
    cfg = Eagle3TrainConfig(steps=2, eval_len=2, intermediate_size=32, epochs=1, draft_vocab=0,
                            batch_tokens=256, max_seq_len=base.max_seq_len)  # fmt: skip
    train_eagle3(base, examples, cfg, tmp_path)
    head = load_head(tmp_path, base.model.args, base.model.output.weight)
    assert cfg.draft_vocab == 0 and head.config.draft_vocab_size == base.model.args.vocab_size
    assert torch.equal(head.target_ids(), torch.arange(base.model.args.vocab_size))
