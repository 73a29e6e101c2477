"""The drafter's training loss: hard labels, and optionally the target's soft distribution.

Cross-entropy against the base's greedy token (what greedy verification accepts), summed over
draft steps as in apple/ml-recurrent-drafter. Soft-label distillation adds the KL divergence
from the base's whole next-token distribution at the same text position (Medusa-2 / EAGLE /
DistillSpec): the ranks of the tokens the base almost chose carry more signal per position than
its argmax alone, which matters when self-distilled data is small.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mathagent.drafter.data import Positions


def draft_loss(
    logits: list[Tensor],
    batch: Positions,
    teacher_head: Tensor | None = None,
    kd_weight: float = 0.0,
) -> Tensor:
    """Per step ``(1 - kd_weight) * CE(label) + kd_weight * KL(base || drafter)``, summed.

    logits: one [N, V] tensor per draft step; ``teacher_head`` [V, H] is the base's output
    projection, applied to ``batch.teacher`` [N, K, H]. A step with no label adds 0.
    """
    if kd_weight > 0 and (teacher_head is None or batch.teacher is None):
        raise ValueError("soft-label distillation needs the teacher's hidden states and head")
    total = logits[0].new_zeros((), dtype=torch.float32)
    for i, lg in enumerate(logits):
        ok = batch.labels[:, i] >= 0
        if not ok.any():
            continue
        if kd_weight < 1:
            total = total + (1 - kd_weight) * F.cross_entropy(lg[ok].float(), batch.labels[ok, i])
        if kd_weight > 0:
            assert teacher_head is not None and batch.teacher is not None
            with torch.no_grad():
                target = F.log_softmax((batch.teacher[ok, i] @ teacher_head.T).float(), dim=-1)
            student = F.log_softmax(lg[ok].float(), dim=-1)
            kl = F.kl_div(student, target, log_target=True, reduction="batchmean")
            total = total + kd_weight * kl
    return total
