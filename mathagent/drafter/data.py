"""The drafter's training data: text examples, and the table of positions built from them.

Examples come from JSONL (``text``, or ``prompt`` + ``completion`` as self-distillation writes
them) or plain text. The table has one row per text position, built by one pass of the base:
row t holds the base's final hidden state at t, the ids of the next ``K`` tokens of the text
(t + 1 ... t + K, the inputs the recurrent state consumes) and ``K`` labels: the base's greedy
token after each of them (``preds[t + 1 + i]``, naming token t + 2 + i). Labels are the base's
own predictions, so the drafter learns what greedy verification accepts. A label whose token
lies before the example's ``start`` (prompt text) or past its end is -100 (ignored). For
soft-label distillation a row may also keep the base's hidden state behind each label
(``hidden[t + 1 + i]``): the base's head turns it into the target's whole next-token distribution.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch
from torch import Tensor

IGNORE = -100


def open_text(path: Path, mode: str) -> IO[str]:
    """Open a text file, gzipped when its name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return path.open(mode, encoding="utf-8")


@dataclass
class Example:
    """One training sequence; ``start`` is the first position whose token is a label."""

    tokens: list[int]
    start: int = 0
    heldout: bool = False


def load_examples(path: Path, encode: Callable[[str], list[int]], max_len: int) -> list[Example]:
    """Read JSONL (``text``, or ``prompt`` + ``completion``; ``.gz`` allowed) or plain text.

    With prompt + completion only completion tokens are labels: the drafter learns what the
    base generates, not what users type. ``completion_ids`` (written by self-distillation)
    are used as they are; ``heldout: true`` marks the evaluation set.
    """
    examples = []
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        with open_text(path, "r") as f:
            for line in f:
                if line.strip():
                    examples.append(_example(json.loads(line), encode, max_len))
    else:
        blocks = [b for b in path.read_text().split("\n\n") if b.strip()]
        examples = [_clip(encode(b), 0, max_len) for b in blocks]
    examples = [e for e in examples if len(e.tokens) - max(e.start, 1) >= 2]
    if not examples:
        raise ValueError(f"{path} holds no usable training text")
    return examples


def _example(rec: dict, encode: Callable[[str], list[int]], max_len: int) -> Example:
    if "completion" not in rec and "completion_ids" not in rec:
        return _clip(encode(rec["text"]), 0, max_len)
    prompt = encode(rec.get("prompt", ""))
    completion = rec.get("completion_ids") or encode(rec["completion"])
    ex = _clip(prompt + completion, len(prompt), max_len)
    ex.heldout = bool(rec.get("heldout", False))
    return ex


def _clip(tokens: list[int], start: int, max_len: int) -> Example:
    """Keep at most ``max_len`` tokens, dropping the front of a long prompt first."""
    if len(tokens) <= max_len:
        return Example(tokens, start)
    cut = len(tokens) - max_len
    return Example(tokens[cut:], max(0, start - cut))


@dataclass
class Positions:
    """Training rows on one device."""

    hidden: Tensor  # [N, H] float32 base hidden state at t
    inputs: Tensor  # [N, K] int64 tokens t + 1 ... t + K (0 past the end)
    labels: Tensor  # [N, K] int64 base's greedy token after each input; -100 = none
    teacher: Tensor | None = None  # [N, K, H] base hidden state whose argmax is each label

    @property
    def size(self) -> int:
        """Number of rows."""
        return self.hidden.shape[0]

    def slice(self, start: int, end: int) -> Positions:
        """Rows ``start:end``."""
        teacher = None if self.teacher is None else self.teacher[start:end]
        return Positions(
            self.hidden[start:end], self.inputs[start:end], self.labels[start:end], teacher
        )

    def take(self, idx: Tensor) -> Positions:
        """Rows ``idx`` (a minibatch)."""
        teacher = None if self.teacher is None else self.teacher[idx]
        return Positions(self.hidden[idx], self.inputs[idx], self.labels[idx], teacher)


def example_rows(
    hidden: Tensor, preds: Tensor, tokens: Tensor, start: int, k: int, teacher: bool = False
) -> Positions | None:
    """Rows of one sequence: hidden [T, H], preds [T], tokens [T] on one device; ``teacher``
    keeps the hidden state behind every label too (soft-label distillation)."""
    t_len = tokens.numel()
    lo = max(start - 1 - k, 0)  # the first row with a label at or after ``start``
    if lo > t_len - 2:
        return None
    rows = torch.arange(lo, t_len - 1, device=tokens.device)  # step 0 needs token t + 1
    idx = rows[:, None] + 1 + torch.arange(k, device=tokens.device)  # [N, K]
    inside = idx < t_len
    safe = idx.clamp(max=t_len - 1)
    inputs = torch.where(inside, tokens[safe], torch.zeros_like(safe))
    labelled = inside & (idx + 1 >= start)  # the label names token idx + 1
    labels = torch.where(labelled, preds[safe], torch.full_like(safe, IGNORE))
    keep = labelled.any(-1)
    soft = hidden[safe[keep]] if teacher else None  # [N, K, H]; unlabelled steps are masked
    return Positions(hidden[rows][keep], inputs[keep], labels[keep], soft)


def build_positions(
    base_fn: Callable[[list[list[int]]], list[tuple[Tensor, Tensor]]],
    examples: Sequence[Example],
    k: int,
    max_rows: int = 1,
    batch_tokens: int = 32768,
    teacher: bool = False,
) -> Positions:
    """Run the frozen base over every example once (batched) and gather all their rows."""
    parts: list[Positions] = []
    with torch.inference_mode():
        for group in length_batches([len(e.tokens) for e in examples], max_rows, batch_tokens):
            outs = base_fn([examples[i].tokens for i in group])
            for i, (hidden, preds) in zip(group, outs, strict=True):
                tokens = torch.tensor(examples[i].tokens, device=hidden.device)
                rows = example_rows(hidden.float(), preds, tokens, examples[i].start, k, teacher)
                if rows is not None:
                    parts.append(rows)
    if not parts:
        raise ValueError("no training positions: every example is too short")
    return concat_positions(parts)


def concat_positions(parts: Sequence[Positions]) -> Positions:
    """One table of several (all with teacher states, or none)."""
    # concatenated outside inference mode: plain tensors that autograd may read
    soft = [p.teacher for p in parts]
    return Positions(
        torch.cat([p.hidden for p in parts]),
        torch.cat([p.inputs for p in parts]),
        torch.cat([p.labels for p in parts]),
        None if any(t is None for t in soft) else torch.cat(soft),  # type: ignore[arg-type]
    )


def length_batches(lengths: list[int], max_rows: int, batch_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length, each group within ``max_rows`` and padded tokens."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        cur = groups[-1] if groups else None
        if cur and len(cur) < max_rows and (len(cur) + 1) * lengths[i] <= batch_tokens:
            cur.append(i)
        else:
            groups.append([i])
    return groups
