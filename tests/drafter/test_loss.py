"""The drafter's loss: cross-entropy alone by default; the soft-label KL term is zero when the
drafter already matches the base, and training with it moves the drafter towards the base."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mathagent.drafter.data import Positions, example_rows
from mathagent.drafter.loss import draft_loss
from mathagent.drafter.train import TrainConfig, evaluate, fit

torch.set_num_threads(1)


def _batch(n: int = 6, k: int = 2, v: int = 11, h: int = 4) -> tuple[Positions, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(n, k, h, generator=gen)
    head = torch.randn(v, h, generator=gen)
    labels = (teacher @ head.T).argmax(-1)
    labels[0, 1] = -100
    return Positions(torch.randn(n, h, generator=gen), labels.clone(), labels, teacher), head


def test_kd_weight_zero_is_cross_entropy_and_a_perfect_student_has_no_kl() -> None:
    batch, head = _batch()
    student = [batch.teacher[:, i] @ head.T for i in range(2)]  # the base's own logits
    ok = batch.labels[:, 1] >= 0
    ce = F.cross_entropy(student[0], batch.labels[:, 0])
    ce = ce + F.cross_entropy(student[1][ok], batch.labels[ok, 1])
    torch.testing.assert_close(draft_loss(student, batch), ce)
    torch.testing.assert_close(draft_loss(student, batch, head, 1.0), torch.tensor(0.0))
    mixed = draft_loss(student, batch, head, 0.25)
    torch.testing.assert_close(mixed, 0.75 * ce)
    worse = [torch.zeros_like(s) for s in student]
    assert draft_loss(worse, batch, head, 1.0) > 0.1
    with pytest.raises(ValueError, match="teacher"):
        draft_loss(student, Positions(batch.hidden, batch.inputs, batch.labels), head, 0.5)


def test_rows_keep_the_hidden_state_behind_each_label() -> None:
    hidden, tokens = torch.randn(9, 4), torch.randint(0, 11, (9,))
    preds = torch.randint(0, 11, (9,))
    rows = example_rows(hidden, preds, tokens, start=5, k=3, teacher=True)
    assert rows is not None and rows.teacher is not None
    for r in range(rows.size):
        for i in range(3):
            if rows.labels[r, i] >= 0:  # row r is text position 1 + r (lo = 5 - 1 - 3)
                assert torch.equal(rows.teacher[r, i], hidden[1 + r + 1 + i])


def test_fitting_with_soft_labels_learns_the_base() -> None:
    torch.manual_seed(0)
    v, h, n = 13, 8, 256
    emb = torch.randn(v, h)
    hidden = torch.randn(n, h)
    inputs = torch.randint(0, v, (n, 2))
    mix = torch.randn(h, h)  # the base's next states: a fixed map of its current one
    teacher = (hidden @ mix)[:, None].expand(n, 2, h) + 0.1 * torch.randn(n, 2, h)
    labels = (teacher @ emb.T).argmax(-1)
    data = Positions(hidden, inputs, labels, teacher)
    cfg = TrainConfig(draft_len=2, layers=1, epochs=30, lr=1e-2, batch_positions=64, kd_weight=0.5)
    untrained = TrainConfig(draft_len=2, layers=1, epochs=1, lr=0.0, batch_positions=64)
    before, _ = fit(emb, data, data, untrained, report=lambda m: None)
    drafter, steps = fit(emb, data, data, cfg, report=lambda m: None, teacher_head=emb)
    assert steps == 120
    assert evaluate(before, emb, data, top_k=3)["redrafter1_top1"] < 0.4
    assert evaluate(drafter, emb, data, top_k=3)["redrafter1_top1"] > 0.6
