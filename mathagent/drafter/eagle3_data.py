"""EAGLE-3 training data: per sequence, the base's fused-layer inputs and greedy predictions.

Unlike ReDrafter's flat table of positions, EAGLE-3 trains on whole sequences (its decoder
layer attends over the context), so one pass of the frozen base keeps, per example, the hidden
states entering the three fused layers ``aux [T, 3H]`` (``Transformer.capture``), its greedy
next token at every position ``preds [T]``, the text's tokens and where the labels start.
Step ``s`` at position ``t`` reads the token ``t + 1 + s`` and is labelled with
``preds[t + 1 + s]`` (the base's token ``t + 2 + s``), counted when that token lies in the
completion (at or after ``start``) and inside the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import IGNORE, Example, length_batches


@dataclass
class SeqFeatures:
    """One training sequence as the base saw it."""

    aux: Tensor  # [T, 3H] hidden states entering the fused layers (storage dtype)
    tokens: Tensor  # [T] int64
    preds: Tensor  # [T] int64 the base's greedy next token
    start: int  # first completion position


@dataclass
class Batch:
    """Sequences padded to one length, on one device."""

    aux: Tensor  # [B, T, 3H]
    tokens: Tensor  # [B, T] (0 past a row's end)
    preds: Tensor  # [B, T]
    lengths: Tensor  # [B]
    starts: Tensor  # [B]

    def inputs(self, step: int) -> Tensor:
        """Tokens ``t + 1 + step`` at each position [B, T] (0 past the end)."""
        shifted = torch.zeros_like(self.tokens)
        shift = 1 + step
        if shift < self.tokens.shape[1]:
            shifted[:, :-shift] = self.tokens[:, shift:]
        return shifted

    def labels(self, step: int) -> Tensor:
        """The base's token ``t + 2 + step`` at each position [B, T]; ``IGNORE`` where none."""
        shift = 1 + step
        t = torch.arange(self.tokens.shape[1], device=self.tokens.device)[None]
        out = torch.full_like(self.preds, IGNORE)
        if shift < self.preds.shape[1]:
            out[:, :-shift] = self.preds[:, shift:]
        ok = (t + shift < self.lengths[:, None]) & (t + shift + 1 >= self.starts[:, None])
        return torch.where(ok, out, torch.full_like(out, IGNORE))


def sequence_features(
    base: FrozenBase, examples: Sequence[Example], layers: tuple[int, ...], dtype: torch.dtype
) -> list[SeqFeatures]:
    """Run the frozen base over every example once (batched by length) and keep its fused
    inputs (in ``dtype``) and greedy predictions, on the base's device."""
    model, runner = base.model, base.runner
    out: list[SeqFeatures | None] = [None] * len(examples)
    model.capture = layers
    try:
        with torch.inference_mode():
            lengths = [len(e.tokens) for e in examples]
            for group in length_batches(lengths, base.slots, 32768):
                longest = max(lengths[i] for i in group)
                toks = torch.zeros(len(group), longest, dtype=torch.long)
                for b, i in enumerate(group):
                    toks[b, : lengths[i]] = torch.tensor(examples[i].tokens)
                toks = toks.to(runner.device)
                pos = torch.arange(longest, device=runner.device)[None].expand(len(group), -1)
                _, hidden = runner.forward(toks, pos, list(range(len(group))), hidden_only=True)
                assert model.captured is not None
                for b, i in enumerate(group):
                    n = lengths[i]
                    preds = torch.cat(
                        [model.logits(c).argmax(-1) for c in hidden[b, :n].split(1024)]
                    )
                    out[i] = SeqFeatures(
                        model.captured[b, :n].to(dtype).clone(), toks[b, :n].clone(), preds,
                        examples[i].start,
                    )  # fmt: skip
    finally:
        model.capture, model.captured = (), None
    return [f for f in out if f is not None]


def batches(feats: Sequence[SeqFeatures], batch_tokens: int) -> list[list[int]]:
    """Indices of ``feats`` grouped by similar length within ``batch_tokens`` padded tokens."""
    return length_batches([f.tokens.numel() for f in feats], 1 << 30, batch_tokens)


def collate(feats: Sequence[SeqFeatures], idx: Sequence[int], dtype: torch.dtype) -> Batch:
    """Pad the sequences ``idx`` into one batch (``aux`` in ``dtype``)."""
    rows = [feats[i] for i in idx]
    longest = max(r.tokens.numel() for r in rows)
    dev = rows[0].tokens.device
    aux = torch.zeros(len(rows), longest, rows[0].aux.shape[-1], dtype=dtype, device=dev)
    tokens = torch.zeros(len(rows), longest, dtype=torch.long, device=dev)
    preds = torch.zeros_like(tokens)
    for b, r in enumerate(rows):
        n = r.tokens.numel()
        aux[b, :n], tokens[b, :n], preds[b, :n] = r.aux, r.tokens, r.preds
    lengths = torch.tensor([r.tokens.numel() for r in rows], device=dev)
    starts = torch.tensor([r.start for r in rows], device=dev)
    return Batch(aux, tokens, preds, lengths, starts)
