"""Draft-model speculation: a smaller model sharing the target's tokenizer drafts a chain.

The draft model runs on a runner of its own (own KV cache, the target's slots and limits), and
catches up on each sequence's tokens it has not seen before drafting; rejected drafts are
forgotten by moving its count of cached tokens back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.model_runner import ModelRunner
from mathagent.serving.engine.spec_decode.chain_step import OneGraphProposer
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model import Transformer


class DraftModelProposer(OneGraphProposer):
    """A smaller model with the same tokenizer, with its own KV cache in the same slots.

    ``row.state["cached"]`` counts the sequence's tokens whose K/V the draft cache holds.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        last = self._catch_up(rows)  # [B, V] draft logits after each row's last token
        tokens: list[list[int]] = [[] for _ in rows]
        qs: list[list[Tensor]] = [[] for _ in rows]
        for step in range(k):
            nxt = []
            for b, row in enumerate(rows):
                tok, q = self._pick(row, last[b])
                tokens[b].append(tok)
                if q is not None:
                    qs[b].append(q)
                nxt.append(tok)
            if step == k - 1:
                break
            pos = torch.tensor([[r.state["cached"]] for r in rows])  # [B, 1]
            logits, _ = self.runner.forward(
                torch.tensor(nxt)[:, None].to(self.runner.device),
                pos.to(self.runner.device),
                [r.seq.slot for r in rows],
            )
            last = logits[:, -1]
            for r in rows:
                r.state["cached"] += 1
        return [
            Draft.chain(r.seq.last_token, t, torch.stack(q) if q else None)
            for r, t, q in zip(rows, tokens, qs, strict=True)
        ]

    def _pick(self, row: SpecRow, logits: Tensor) -> tuple[int, Tensor | None]:
        if row.greedy:
            return int(logits.argmax()), None
        q = row.warp(logits[None])[0]
        return int(torch.multinomial(q.cpu(), 1, generator=row.seq.generator)), q

    def _catch_up(self, rows: list[SpecRow]) -> Tensor:
        """Feed each row's tokens missing from the draft cache; logits after its last token."""
        return self.catch_up_to(rows, None)

    def catch_up_to(self, rows: list[SpecRow], end: int | None) -> Tensor:
        """Feed each row's tokens missing from the draft cache, up to position ``end``
        (exclusive; None: all of them); logits after the last one fed (rows already there:
        none are run, and their entries are left out)."""
        out: list[Tensor | None] = [None] * len(rows)
        by_len: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            row.state.setdefault("cached", 0)
            stop = len(row.seq.all_ids) if end is None else end
            if stop > row.state["cached"]:
                by_len.setdefault(stop - row.state["cached"], []).append(i)
        chunk = self.runner.config.prefill_chunk
        for length, idxs in by_len.items():
            for start in range(0, length, chunk):
                t = min(chunk, length - start)
                group = [rows[i] for i in idxs]
                toks = torch.tensor([g.seq.all_ids[g.state["cached"] :][:t] for g in group])
                pos = torch.stack([torch.arange(t) + g.state["cached"] for g in group])
                logits, _ = self.runner.forward(
                    toks.to(self.runner.device),
                    pos.to(self.runner.device),
                    [g.seq.slot for g in group],
                    logits_last_only=True,
                )
                for g in group:
                    g.state["cached"] += t
            for j, i in enumerate(idxs):
                out[i] = logits[j, -1]
        return torch.stack([o for o in out if o is not None]) if by_len else torch.zeros(0)

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        # the cache holds the root and all drafts but the last; keep what was accepted
        row.state["cached"] = min(row.state["cached"], old_cached + 1 + num_accepted)


def draft_runner(model: Transformer, target: ModelRunner) -> ModelRunner:
    """A runner (own KV cache, same slots and limits) for a draft model."""
    if model.args.vocab_size != target.model.args.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({model.args.vocab_size}) differs from the target's "
            f"({target.model.args.vocab_size}); a draft model must share the tokenizer"
        )
    return ModelRunner(model, target.config)
