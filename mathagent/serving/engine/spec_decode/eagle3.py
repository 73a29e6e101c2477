"""EAGLE-3 drafting inside the engine's speculative step.

The proposer asks the target's forward for its low/middle/high hidden states
(``Transformer.capture``) and fuses them with the head's ``fc`` as they are produced, into a
per-slot feature buffer indexed by write position (prefill and verify rows alike). Before each
draft it brings its own decoder layer's KV cache (per slot, by position) up to the committed
length: position ``t`` holds the layer's K/V for the pair (features at ``t``, token ``t + 1``).
A tree's accepted branch has its features moved to consecutive positions with the target's K/V
(:meth:`Eagle3Proposer.moved`). Drafting then runs the layer on its own output: a chain
(argmax, or sampled from the warped draft distribution with ``q`` kept for lossless
verification), or with several beams a beam search (top-k per depth, each beam attending to the
context and its own ancestors), verified by the engine's tree verification.

A greedy chain also brings a second branch when ``lookup_branch`` is on (by default on CUDA):
the prompt-lookup (n-gram) continuation of the row's own tokens, verified beside the chain in one
tree, the longer accepted branch kept. The head cannot name the rare words a problem repeats (7%
of the default model's agent tokens lie outside its 4096-token draft vocabulary) and drafts a
repeated sentence badly; the lookup copies exactly those. On the default model's GSM8K agent
transcripts the replayed walk goes from 2.51 to 3.84 tokens per step, and on the H200 the live
acceptance from 2.66 to 3.61 (benchmarks/GPU_NOTES.md, session four, run 48), for a verify of
``1 + 2k`` nodes instead of ``1 + k``. A copied continuation that is right is often right for
longer than the head's chain, and costs nothing to draft, so the lookup may bring more drafts
than the chain (``lookup_len``, :meth:`Eagle3Proposer.lookup_depth`).

One module, over the usual size, because the sink, the layer's per-slot K/V (settled, reused
across requests that share tokens, moved with a tree's path) and the drafting paths all work on
the same per-slot buffers, which a split would have to hand around.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from mathagent.serving.engine.model import rope_table
from mathagent.serving.engine.quant import Int8Linear
from mathagent.serving.engine.sampler import Cuts
from mathagent.serving.engine.scheduler import common_prefix
from mathagent.serving.engine.spec_decode.chain_step import (
    Branches,
    ChainStep,
    sampling_of,
    windows_of,
)
from mathagent.serving.engine.spec_decode.eagle3_chain import Eagle3Chain
from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Head, attend
from mathagent.serving.engine.spec_decode.eagle3_loader import aux_layers
from mathagent.serving.engine.spec_decode.ngram import NgramProposer
from mathagent.serving.engine.spec_decode.ngram_device import DeviceNgram
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.sequence import Sequence


class Eagle3Proposer:
    """Drafts with an EAGLE-3 head over the target's fused hidden states."""

    def __init__(self, head: Eagle3Head, runner: ModelRunner, beams: int) -> None:
        model, dev, cfg = runner.model, runner.device, head.config
        # a one-row product is fastest in float32 on a CPU; on CUDA follow the target
        self.dtype = torch.float32 if dev.type == "cpu" else runner.config.dtype
        self.head = head.to(dev, self.dtype).eval()
        self.head.midlayer.fuse_projections()
        if dev.type == "cpu" and runner.config.quantization == "int4":
            self._int8_products()
        emb = (
            head.embed_tokens.weight
            if head.embed_tokens is not None
            else model.tok_embeddings.weight
        )
        self.embedding = emb.detach().to(dev, self.dtype)  # [V, H]
        self.ids = self.head.target_ids()  # [V'] target id of each draft column
        self.beams = beams
        slots, seq = runner.cache.num_slots, runner.max_seq_len
        self.feats = torch.zeros(slots, seq, cfg.hidden_size, device=dev, dtype=self.dtype)
        kv = (slots, cfg.num_key_value_heads, seq, cfg.dim)
        self.k = torch.zeros(kv, device=dev, dtype=self.dtype)  # the layer's K/V by position
        self.v = torch.zeros(kv, device=dev, dtype=self.dtype)
        cos, sin = rope_table(cfg.layer_args(), seq)
        self.cos, self.sin = cos.to(dev, self.dtype), sin.to(dev, self.dtype)  # [S, D]
        self._project: Callable[[Tensor], Tensor] | None = None
        # the [V', H] rows scoring the draft columns when they are one float matrix (the
        # fused head step on CUDA multiplies them itself); None: through ``logits`` only
        own = None if cfg.lm_head_from_target else self.head.lm_head.weight
        self.draft_rows: Tensor | None = own
        # slot -> (the sequence whose tokens the slot's layer K/V follow, positions valid)
        self._slot_layer: dict[int, tuple[Sequence, int]] = {}
        self.layers = aux_layers(cfg, model.args)
        model.capture = self.layers
        runner.feature_sinks.append(self.fuse)
        self.max_seq = seq
        # greedy chains, batched (one graph on CUDA); None drafts them row by row
        self.chains: Eagle3Chain | None = Eagle3Chain(self, runner.graphs)
        self.lookup = NgramProposer() if runner.config.lookup_branch else None
        self.table: DeviceNgram | None = None  # the lookup's token table on CUDA graphs
        # whole chain steps in one graph (CUDA graphs only), the lookup as a 2nd branch
        self.steps = None
        if runner.graphs is not None:
            if self.lookup is None:
                self.steps = ChainStep(self.chains, runner.graphs)
            else:
                self.table = DeviceNgram(self.lookup, slots, seq, dev)
                branches = Branches(self.chains, self.table, depth=self.lookup_depth)
                self.steps = ChainStep(branches, runner.graphs, 2)
        self._lookup_len = runner.config.lookup_len
        self._fill_rows = 0  # verify rows a lookup of 'auto' fills a chain's tree to
        if dev.type == "cuda":  # a CPU engine imports no CUDA module
            from mathagent.serving.engine.cuda.skinny import MAX_ROWS

            self._fill_rows = MAX_ROWS

    def lookup_depth(self, k: int) -> int:
        """Drafts of the prompt-lookup branch beside a chain of ``k``: the engine's
        ``lookup_len`` when set (at least ``k``); else on CUDA as many as fill a row's verify to
        the 16 rows its skinny products compute anyway (``1 + k + d = 16``), elsewhere ``k``.

        A copied continuation that is right is often right past the chain's end: CPU float32,
        20 GSM8K agent prompts x 256, chains of 6 with lookups of 6 / 9: 4.05 / 4.38 tokens a
        step, output plain greedy (benchmarks/eagle3_acceptance_cpu_lookup_len.json). H200,
        bf16, the default model, 64 GSM8K agent prompts x 256: chains of 4 with lookups of 11
        2.600x plain, chains of 6 with 6 2.409x; in float32 on 32 of them every output plain
        greedy (benchmarks/GPU_NOTES.md, runs 110-111)."""
        if self._lookup_len:
            return max(k, self._lookup_len)
        return max(k, self._fill_rows - 1 - k)

    def _int8_products(self) -> None:
        """The layer's four products from int8 rows (one scale each, bf16 activations), as
        the int4 target's own head: in float32 a draft step of the CPU int4 engine streamed
        the layer's 12.8 MB from L3 after each target forward; as 3.2 MB they stay in the
        cores' L2 (benchmarks/eagle3_cpu_int8_ab.py: drafting 3 tokens 4.7-4.8 -> 3.4-3.6 ms a
        step, acceptance kept, 4-7% more tokens/s). ``fc`` stays float32: its rows are near
        the identity, and one scale a row put 6% of error into the features."""
        mid = self.head.midlayer
        assert mid.qkv is not None and mid.mlp.gate_up is not None
        weights = (mid.qkv, mid.self_attn.o_proj.weight, mid.mlp.gate_up,
                   mid.mlp.down_proj.weight)  # fmt: skip
        mid.products = tuple(Int8Linear(w) for w in weights)

    def use_head(self, project: Callable[[Tensor], Tensor]) -> None:
        """Score draft columns with ``project`` (normed output [N, H] -> [N, V']), e.g. the
        target's own (possibly quantized) head rows when the head is tied to it."""
        self._project = project
        rows = getattr(project, "rows_weight", None)  # a float head's rows as one matrix
        self.draft_rows = None if rows is None else rows.to(self.dtype)

    def logits(self, out: Tensor) -> Tensor:
        """Draft-vocabulary logits [N, V'] (float32) of the layer's output [N, H]."""
        if self._project is None:
            return self.head.logits(out)
        return self._project(self.head.norm(out)).float()

    @torch.inference_mode()
    def fuse(self, slots: Tensor, write: Tensor, captured: Tensor) -> None:
        """``fc`` of the captured streams [B, T, 3H] into the features of ``slots [B]`` at
        ``write [B, T]`` (device tensors: the runner's feature sink, and captured step graphs
        call it too)."""
        fused = _fc(self.head.fc, captured.to(self.dtype))
        self.feats[slots[:, None].expand_as(write), write] = fused

    @torch.inference_mode()
    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        out: list[Draft | None] = [None] * len(rows)
        chains = []  # greedy one-beam rows: drafted together
        for i, row in enumerate(rows):
            seq = row.seq
            if seq.slot is None or k < 1 or seq.num_cached < 1:
                # a one-token prompt's first step: no position has the target's features yet
                out[i] = Draft.chain(seq.last_token, [])
            elif row.greedy and self.beams == 1 and seq.num_cached > k and self.chains:
                chains.append(i)
            else:
                last = self._settle(row)  # [1, H] the layer's output at the last position
                if not row.greedy:
                    out[i] = self._sample_chain(row, last, k)
                else:
                    out[i] = Draft(self._beam_search(row, last, k).cpu())
        if chains:
            for i, draft in zip(chains, self._chains([rows[i] for i in chains], k), strict=True):
                out[i] = draft
        return [d for d in out if d is not None]

    def _chains(self, rows: list[SpecRow], k: int) -> list[Draft]:
        """Greedy chains of ``k`` for ``rows`` in one batched draft (one graph on CUDA)."""
        assert self.chains is not None
        beams = self.chains.draft(*self._windows(rows, k), k)  # [B, 1 + k]
        d = self.lookup_depth(k)
        return [self._with_lookup(row, beams[b : b + 1], k, d) for b, row in enumerate(rows)]

    def _with_lookup(self, row: SpecRow, chain: Tensor, k: int, d: int) -> Draft:
        """The chain ``[1, 1 + k]``, and beside it the row's prompt-lookup draft of up to
        ``d`` (padded with -1, which nothing accepts; the chain too, to ``d``: on this path
        padding costs its verify rows) when there is one and the row has room for both."""
        if self.lookup is None or row.seq.num_cached + 1 + 2 * d > self.max_seq:
            return Draft(chain)
        found = self.lookup.propose(torch.tensor(row.seq.all_ids), d)
        if not found:
            return Draft(chain)
        other = chain.new_full((1, 1 + d), -1)
        other[0, 0] = chain[0, 0]
        other[0, 1 : 1 + len(found)] = chain.new_tensor(found)
        chain = F.pad(chain, (0, d - k), value=-1)
        return Draft(torch.cat([chain, other]))

    def fused_step(
        self, rows: list[SpecRow], k: int, sinks: int, ahead: bool = False
    ) -> tuple[list[Draft], list[list[int]], Tensor] | None:
        """Draft, verify and accept chains in one CUDA graph (sampled rows by speculative
        sampling of the head's chain: :class:`ChainStep`), when every row allows it
        and this head is the runner's only feature sink (``sinks``); else None. Returns the
        drafts' shapes, each row's ``[accepted, committed tokens..., -1...]`` and the target's
        hidden state [B, H] at each row's last accepted node. ``ahead``: launch the same rows'
        next step before reading this one (:meth:`ChainStep.step`)."""
        steps = self.steps
        if steps is None:
            return None
        cuts = Cuts.of_rows(sampling_of(rows))
        d, nodes = steps.depth(k, cuts), steps.nodes(k, cuts)
        fits = (
            steps.fits(len(rows), k) and self.beams == 1 and sinks == 1
            and all(d < r.seq.num_cached <= self.max_seq - nodes for r in rows)
        )  # fmt: skip
        if not fits:
            self.drop_ahead()
            return None
        # the step launched ahead writes its nodes after up to d + 1 more committed positions
        ahead = ahead and all(r.seq.num_cached + d + 1 + nodes <= self.max_seq for r in rows)
        return steps.step_rows(rows, k, ahead, lambda row: self._before_step(row, d))

    def _before_step(self, row: SpecRow, d: int) -> None:
        """Host bookkeeping before a fused step whose window holds ``d + 1`` tokens: the layer
        settled up to it, the lookup table whole."""
        self._settled(row, d)
        if self.table is not None:
            self.table.sync(row.seq, d + 1)

    def drop_ahead(self) -> None:
        """Forget a step launched ahead: the next step is not the one it guessed."""
        if self.steps is not None:
            self.steps.drop()

    def _windows(self, rows: list[SpecRow], k: int) -> tuple[list[int], list[int], list]:
        """Each row's slot, window start and window tokens for a chain of ``k``, its layer
        settled (eagerly, after a prefill or plain steps) up to the window's start."""
        for row in rows:
            self._settled(row, k)
        return windows_of(rows, k)

    def _settled(self, row: SpecRow, k: int) -> None:
        """Settle the row's layer (eagerly, after a prefill or plain steps) up to the start of
        its window of ``k + 1`` (what a verify step of ``k`` drafts can have committed)."""
        st, c = row.state, row.seq.num_cached
        if "n" not in st:
            st["n"] = self._reusable(row.seq)
        if min(st["n"], c - 1) < c - (k + 1):
            self._settle(row)
        st["n"] = c
        # after this step's graph the window is settled too; what drafts wrote lies past c
        self._slot_layer[row.seq.slot] = (row.seq, c)  # type: ignore[index]

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        """Nothing to remember: a tree's accepted features were moved by :meth:`moved`."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """The engine copied slot ``src``'s first ``length`` positions into ``dst``: their
        features and the layer's K/V follow (as far as they are settled there)."""
        self.feats[dst, :length] = self.feats[src, :length]
        self.k[dst, :, :length] = self.k[src, :, :length]
        self.v[dst, :, :length] = self.v[src, :, :length]
        known = self._slot_layer.get(src)
        if known is None:
            self._slot_layer.pop(dst, None)
        else:
            self._slot_layer[dst] = (known[0], min(known[1], length))

    def moved(self, slots: Tensor, base: Tensor, path: Tensor) -> None:
        """A tree verify's accepted path ``[B, 1 + D]`` (node indices, written from ``base``)
        moved to consecutive positions: the features the sink wrote there follow, as the
        target's K/V do (:func:`~.tree_batch.move_path`)."""
        src = base[:, None] + path
        dst = base[:, None] + torch.arange(path.shape[1], device=path.device)
        self.feats[slots[:, None], dst] = self.feats[slots[:, None], src]

    def _settle(self, row: SpecRow) -> Tensor:
        """Bring the layer's KV cache up to the committed length; its output at the end."""
        seq, st = row.seq, row.state
        slot, c = seq.slot, seq.num_cached
        assert slot is not None
        ids = seq.all_ids  # the committed tokens, then the root (not yet cached)
        if "n" not in st:
            st["n"] = self._reusable(seq)
        n = min(st["n"], c - 1)
        emb = self.embedding[torch.tensor(ids[n + 1 : c + 1], device=self.embedding.device)]
        out = self._layer(slot, emb[None], self.feats[slot, n:c][None], n, c)
        st["n"] = c
        self._slot_layer[slot] = (seq, c)
        return out[:, -1]

    def _reusable(self, seq: Sequence) -> int:
        """Positions of a new row's slot whose layer K/V an earlier request there (or the one
        its prefix was copied from) computed for the same tokens: position ``t`` holds the pair
        (features at ``t``, token ``t + 1``), so up to the tokens they share, less one. A new
        turn of a conversation or a repeated prompt then settles only what is new (run 57: a
        first step that settled a ~300-token prompt eagerly took ~6.5 ms on the H200)."""
        known = self._slot_layer.get(seq.slot)  # type: ignore[arg-type]
        if known is None or known[0] is seq:
            return 0
        old, valid = known
        same = common_prefix(old.all_ids, seq.all_ids)
        return max(0, min(valid, same - 1, seq.num_cached))

    def _layer(self, slot: int, emb: Tensor, hidden: Tensor, start: int, end: int) -> Tensor:
        """Run the layer on one row's positions ``start..end-1`` (emb, hidden [1, T, H]),
        writing their K/V and attending causally over the slot's positions ``< end``."""
        pos = torch.arange(start, end, device=self.k.device)
        cos, sin = self.cos[pos][None, :, None], self.sin[pos][None, :, None]
        residual, q, k, v = self.head.midlayer.project(emb, hidden.to(self.dtype), cos, sin)
        self.k[slot, :, start:end] = k[0]
        self.v[slot, :, start:end] = v[0]
        mask = None
        if end - start > 1:
            mask = (torch.arange(end, device=pos.device)[None] <= pos[:, None])[None, None]
        out = attend(q, self.k[slot : slot + 1, :, :end], self.v[slot : slot + 1, :, :end], mask)
        return self.head.midlayer.finish(residual, out)  # [1, T, H]

    def _sample_chain(self, row: SpecRow, last: Tensor, k: int) -> Draft:
        """One chain drawn from the warped draft distribution; ``q`` over the target vocab."""
        seq, c = row.seq, row.seq.num_cached
        assert row.warp is not None and seq.slot is not None
        hidden, toks, qs = last[None], [], []
        for j in range(k):
            if j:
                emb = self.embedding[toks[-1]].view(1, 1, -1)
                hidden = self._layer(seq.slot, emb, hidden, c - 1 + j, c + j)
            q = row.warp(self.logits(hidden[:, -1]))  # [1, V']
            col = torch.multinomial(q.cpu(), 1, generator=seq.generator).to(q.device)[0]
            toks.append(self.ids[col])
            qs.append(q.new_zeros(1, self.embedding.shape[0]).index_copy_(1, self.ids, q))
        tokens = [int(t) for t in torch.cat(toks).tolist()]
        return Draft.chain(seq.last_token, tokens, torch.cat(qs))

    def _beam_search(self, row: SpecRow, last: Tensor, k: int, width: int | None = None) -> Tensor:
        """Beams [W, 1 + k] starting with the root: the top-W continuations by draft
        log-probability, each beam attending to the context and its own drafted tokens."""
        seq, c = row.seq, row.seq.num_cached
        slot = seq.slot
        assert slot is not None
        w = min(width or self.beams, self.ids.numel())
        score, col = F.log_softmax(self.logits(last), dim=-1)[0].topk(w)  # [W]
        toks = self.ids[col]
        beams = torch.stack([torch.full_like(toks, seq.last_token), toks], 1)  # [W, 2]
        hidden = last.expand(w, -1)[:, None]  # [W, 1, H]
        ctx_k, ctx_v = (
            self.k[slot, :, :c].expand(w, -1, -1, -1),
            self.v[slot, :, :c].expand(w, -1, -1, -1),
        )
        spec_k = ctx_k[:, :, :0]
        spec_v = spec_k
        mid = self.head.midlayer
        for j in range(1, k):
            pos = c - 1 + j
            emb = self.embedding[toks][:, None]  # [W, 1, H]
            cos, sin = self.cos[pos].view(1, 1, 1, -1), self.sin[pos].view(1, 1, 1, -1)
            residual, q, kk, vv = mid.project(emb, hidden, cos, sin)
            spec_k, spec_v = torch.cat([spec_k, kk], 2), torch.cat([spec_v, vv], 2)
            att = attend(q, torch.cat([ctx_k, spec_k], 2), torch.cat([ctx_v, spec_v], 2), None)
            hidden = mid.finish(residual, att)  # [W, 1, H]
            logp = F.log_softmax(self.logits(hidden[:, 0]), dim=-1)  # [W, V']
            vocab = logp.shape[-1]
            score, flat = (score[:, None] + logp).view(-1).topk(w)
            src, toks = flat // vocab, self.ids[flat % vocab]
            beams = torch.cat([beams[src], toks[:, None]], 1)
            hidden, spec_k, spec_v = hidden[src], spec_k[src], spec_v[src]
        return beams


def _fc(fc: torch.nn.Linear, rows: Tensor) -> Tensor:
    """``fc(rows)``; on CUDA, up to 16 rows by the skinny product: cuBLAS took 5.5 us for a
    plain step's one row, on the side branch its tail waits for (GPU_NOTES, 2026-12-04)."""
    if rows.is_cuda and fc.bias is None and rows[..., 0].numel() <= 16:
        from mathagent.serving.engine.cuda import skinny

        if skinny.skinny_fits(fc.weight):
            return skinny.skinny(rows, fc.weight)
    return fc(rows)
