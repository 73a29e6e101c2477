"""The proposers behind ``--speculative``: n-gram lookup, a draft model, and ReDrafter.

Each turns :class:`SpecRow` s into :class:`Draft` s. Greedy rows take the argmax (ReDrafter: a
beam search, verified as a tree); sampling rows take one chain sampled from the drafter's
distribution warped like the target's, so verification can stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mathagent.serving.engine.ngram import NgramProposer
from mathagent.serving.engine.proposal import Draft, Proposer, SpecRow
from mathagent.serving.engine.quant import Int8Linear
from mathagent.serving.engine.redrafter import Drafter
from mathagent.serving.engine.spec_config import SpecMethod, SpecMethodError

if TYPE_CHECKING:
    from mathagent.serving.engine.model import Transformer
    from mathagent.serving.engine.model_runner import ModelRunner


class NgramDrafts:
    """Prompt lookup over each sequence's own tokens (drafts are copied, so q is one-hot)."""

    def __init__(self, lookup: NgramProposer | None = None) -> None:
        self.lookup = lookup or NgramProposer()

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        out = []
        for row in rows:
            ids = row.seq.all_ids
            out.append(Draft.chain(ids[-1], self.lookup.propose(torch.tensor(ids), k)))
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass


class ReDrafterProposer:
    """ReDrafter over the target's hidden state and token embeddings."""

    def __init__(self, drafter: Drafter, embedding: Tensor, beams: int) -> None:
        # On a CPU the drafter's small one-row products are fastest in float32 (a bf16 product
        # of one row has a high fixed cost); on CUDA it follows the target's dtype.
        self.dtype = torch.float32 if embedding.device.type == "cpu" else embedding.dtype
        self.drafter = drafter.to(embedding.device, self.dtype).eval()
        self.embedding = embedding.to(self.dtype)  # [V, H] the target's own token embedding
        self.beams = beams

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        out = [Draft.chain(r.seq.last_token, []) for r in rows]
        greedy = [i for i, r in enumerate(rows) if r.hidden is not None and r.greedy]
        if greedy:
            ctx = torch.stack([rows[i].hidden for i in greedy]).to(self.dtype)  # [B, H]
            root = torch.tensor([rows[i].seq.last_token for i in greedy], device=ctx.device)
            beams = self.drafter.beam_search(ctx, root, self.embedding, self.beams, k)
            for j, i in enumerate(greedy):
                out[i] = Draft(beams[j].cpu())
        for i, row in enumerate(rows):
            if row.hidden is None or row.greedy:
                continue
            root = torch.tensor([row.seq.last_token], device=row.hidden.device)
            drafts, q = self.drafter.sample_chain(
                row.hidden[None].to(self.dtype),
                root,
                self.embedding,
                k,
                row.warp,
                row.seq.generator,
            )
            out[i] = Draft.chain(row.seq.last_token, drafts[0].tolist(), q[0])
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass


class DraftModelProposer:
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
        out: list[Tensor | None] = [None] * len(rows)
        by_len: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            row.state.setdefault("cached", 0)
            by_len.setdefault(len(row.seq.all_ids) - row.state["cached"], []).append(i)
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
        return torch.stack(out)  # type: ignore[arg-type]

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        # the cache holds the root and all drafts but the last; keep what was accepted
        row.state["cached"] = min(row.state["cached"], old_cached + 1 + num_accepted)


def draft_runner(model: Transformer, target: ModelRunner) -> ModelRunner:
    """A runner (own KV cache, same slots and limits) for a draft model."""
    from mathagent.serving.engine.model_runner import ModelRunner

    if model.args.vocab_size != target.model.args.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({model.args.vocab_size}) differs from the target's "
            f"({target.model.args.vocab_size}); a draft model must share the tokenizer"
        )
    return ModelRunner(model, target.config)


def head_rows(head: nn.Module, rows: Tensor | None) -> Callable[[Tensor], Tensor]:
    """The target's vocabulary head restricted to ``rows`` (a draft vocabulary), same numerics."""
    if rows is None:
        return head
    if isinstance(head, Int8Linear):
        return head.rows(rows)
    weight = head.weight.detach()[rows.to(head.weight.device)]
    return lambda x: F.linear(x.to(weight.dtype), weight)


def load_proposer(method: SpecMethod, target: ModelRunner, beams: int, model_dir: Path) -> Proposer:
    """Build the proposer a method names (loading its weights)."""
    if method.kind == "ngram":
        return NgramDrafts()
    assert method.path is not None
    if method.kind == "redrafter":
        emb = target.model.tok_embeddings.weight
        try:
            drafter = Drafter.from_pretrained(
                Path(method.path).expanduser(), emb.detach().float().cpu()
            )
        except (OSError, ValueError) as exc:
            raise SpecMethodError(f"cannot load ReDrafter {method.path!r}: {exc}") from exc
        if drafter.config.vocab_size != emb.shape[0] or drafter.config.hidden_size != emb.shape[1]:
            raise SpecMethodError(
                f"ReDrafter {method.path!r} is shaped for vocab {drafter.config.vocab_size} x "
                f"hidden {drafter.config.hidden_size}, the target is {emb.shape[0]} x {emb.shape[1]}"
            )
        proposer = ReDrafterProposer(drafter, emb.detach(), beams)
        if drafter.config.lm_head_from_base and target.model.args.tie_word_embeddings:
            # the drafter's head is the target's own: share its (possibly quantized) projection
            drafter.use_head(head_rows(target.model.output, drafter.draft_vocab))
        return proposer
    from mathagent.serving.engine.loader import ModelLoadError, load_model

    try:
        loaded = load_model(method.path, model_dir, target.device, target.config.dtype)
        return DraftModelProposer(draft_runner(loaded.model, target))
    except (ModelLoadError, ValueError, OSError) as exc:
        raise SpecMethodError(f"cannot load draft model {method.path!r}: {exc}") from exc
