"""Greedy EAGLE-3 chains for a whole batch in one pass over static shapes.

Each row settles again the window of its last ``T = k + 1`` committed positions (more when a
longer lookup branch is verified beside the chain: the step's longest branch plus one; features
at ``c-T .. c-1`` paired with tokens ``c-T+1 .. c``; re-running a settled position writes the K/V
it already holds), which covers everything a verify step can have committed, then drafts ``k``
tokens with ``k - 1`` one-token steps of the head's layer. The shapes depend only on the batch
bucket and ``k``, so on CUDA the whole draft is one captured graph: drafting row by row launched
about 40 small kernels per drafted token, 4.9 ms per step against a 1 ms target step on the
H200 (benchmarks/GPU_NOTES.md, run 19). The CPU runs the same code eagerly, attention cut at
the batch's longest row.

On CUDA the whole step goes one further: :class:`~.chain_step.ChainStep` captures this draft,
the target's verify forward, the head's feature fusion (:meth:`Eagle3Chain.verified`) and
greedy acceptance in one graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from mathagent.serving.engine.sampler import Cuts, Sampler, SamplingBatch
from mathagent.serving.engine.spec_decode.chain_step import ChainInputs
from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Head, attend

if TYPE_CHECKING:
    from mathagent.serving.engine.cuda.graphs import CudaGraphRunner


# Sampled chains on CUDA draw from the head's distribution at the row's temperature and top-k
# only; top-p stays on the target's side of the rule (lossless: q is what the chain was drawn
# from). Cutting q by top-p too sorts at every draft step: run 79 (default model, bf16, T 0.6,
# top-p 0.95, chains of 6), with the cut 1.829 ms a step, acceptance 2.67, 1.128x plain;
# without it 1.638 ms, 2.75, 1.298x.
DRAFT_TOP_P = False


class HeadState(Protocol):
    """What the drafter reads of an EAGLE-3 proposer: the head and its per-slot buffers."""

    head: Eagle3Head
    dtype: torch.dtype
    embedding: Tensor  # [V, H]
    ids: Tensor  # [V'] target id of each draft column
    feats: Tensor  # [slots, seq, H] fused target features by position
    draft_rows: Tensor | None  # [V', H] the rows scoring draft columns, when one float matrix
    k: Tensor  # [slots, Hkv, seq, D] the layer's K/V by position
    v: Tensor
    cos: Tensor  # [seq, D]
    sin: Tensor

    def logits(self, out: Tensor) -> Tensor: ...

    def fuse(self, slots: Tensor, write: Tensor, captured: Tensor) -> None: ...


class Eagle3Chain:
    """Drafts greedy chains for many rows at once; one CUDA graph per (batch bucket, k)."""

    def __init__(self, proposer: HeadState, graphs: CudaGraphRunner | None) -> None:
        self.p = proposer
        self.graphs = graphs
        self.device = proposer.k.device
        self._captured: dict[tuple[int, int], tuple] = {}  # (bucket, k) -> draft graph
        # On CUDA each head step is a compiled region whose norms, rotary, SiLU and adds Inductor
        # fuses: eager, one head step was ~45 small kernels, 0.3-0.45 ms of a ~2 ms chain step
        # (benchmarks/GPU_NOTES.md, runs 23 and 27)
        self._next, self._cuda_step = self._next_token, self._cuda_layer
        self._sample, self._cuda_window = self._sampled_token, self._window_layer
        if graphs is not None:
            self._next = torch.compile(self._next_token, dynamic=False)
            self._cuda_step = torch.compile(self._cuda_layer, dynamic=False)
            self._sample = torch.compile(self._sampled_token, dynamic=False)
            self._cuda_window = torch.compile(self._window_layer, dynamic=False)

    def draft(
        self, slots: list[int], starts: list[int], windows: list[list[int]], k: int
    ) -> Tensor:
        """Beams ``[B, 1 + k]`` (root, then the chain) for rows whose window of ``k + 1``
        tokens starts at ``starts`` (each ``>= 0``, the row's layer settled before it)."""
        if self.graphs is None:
            inp = ChainInputs.allocate(len(slots), k + 1, self.device)
            values = ChainInputs.columns(slots, starts, windows)
            inp.packed.copy_(torch.tensor(values, dtype=torch.long))
            return self.run(inp, k, kv_len=max(starts) + 2 * k)
        out = self._replay(slots, starts, windows, k)
        return out[: len(slots)].clone()  # the graph's buffer is overwritten by the next draft

    def _replay(self, slots: list[int], starts: list[int], windows: list[list[int]], k: int):
        """Fill the captured draft's inputs of (bucket, k) from the host in one copy; replay."""
        assert self.graphs is not None
        rows = len(slots)
        key = (self.graphs.bucket(rows), k)
        if key not in self._captured:
            self._capture(*key)
        graph, inp, host, out = self._captured[key]
        pad = key[0] - rows
        scratch = self.graphs.scratch_slot
        values = ChainInputs.columns(
            slots + [scratch] * pad, starts + [0] * pad, windows + [[0] * (k + 1)] * pad
        )
        if host[1] is not None:
            host[1].synchronize()  # the previous copy out of the pinned buffer has run
        host[0].numpy()[:] = values
        inp.packed.copy_(host[0], non_blocking=True)
        host[1] = torch.cuda.Event()
        host[1].record()
        graph.replay()
        return out

    def run(self, inp: ChainInputs, k: int, kv_len: int | None = None) -> Tensor:
        """The draft itself: settle the windows, then ``k - 1`` one-token steps."""
        return self._draft(inp, k, kv_len, lambda j, last: self._next(last))

    def run_sampled(
        self, inp: ChainInputs, k: int, warp: SamplingBatch, u: Tensor, kv_len: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`run`, each draft of a sampled row drawn from the head's distribution warped
        as the row asks, at its uniform ``u [B, k]`` (greedy rows: the argmax); with ``q [B, k,
        V]``, those distributions over the target's vocabulary, for lossless acceptance. At T
        0.7 the argmax chain was accepted at 2.02 tokens a step against 3.82 greedy (run 65)."""
        qs: list[Tensor] = []
        cuts = warp.cuts

        def pick(j: int, last: Tensor) -> Tensor:
            token, q = self._sample(last, warp.temperature, warp.top_p, warp.top_k, u[:, j],
                                    cuts.top_k, cuts.top_p and DRAFT_TOP_P)  # fmt: skip
            qs.append(q)
            return token

        beams = self._draft(inp, k, kv_len, pick)
        return beams, torch.stack(qs, 1)

    def _draft(
        self, inp: ChainInputs, k: int, kv_len: int | None, pick: Callable[[int, Tensor], Tensor]
    ) -> Tensor:
        """Settle the windows, then draft ``k`` tokens, ``pick(j, layer output [B, H])`` the
        ``j``-th, with ``k - 1`` one-token steps of the layer between them."""
        width = inp.window.shape[1]
        if self.graphs is not None:  # the window's positions and features inside the region
            out = self._cuda_window(inp.window, inp.slots, inp.start, inp.causal)
        else:
            pos = inp.start[:, None] + torch.arange(width, device=self.device)  # [B, T]
            hidden = self.p.feats[inp.slots[:, None], pos]  # [B, T, H]
            out = self._layer(inp, inp.window, hidden, pos, inp.causal, kv_len)
        last = out[:, -1:]  # [B, 1, H] the layer's output at c - 1
        drafted = [inp.window[:, -1]]
        # positions c .. c + k - 2 of the one-token steps, made at once: an add per step was a
        # kernel of its own between the compiled regions (1.4 us each on the H200)
        # ([k - 1, B]: each step's row of them is contiguous, as the attention reads it)
        ats = torch.arange(width, width + k - 1, device=self.device)[:, None] + inp.start
        for j in range(k):
            drafted.append(pick(j, last[:, 0]))
            if j + 1 < k:
                at = ats[j]  # [B] position c - 1 + (j + 1)
                step = ChainInputs(inp.packed, inp.slots, at, inp.window, inp.causal, inp.single)
                last = self._layer(step, drafted[-1][:, None], last, at[:, None], inp.single,
                                   kv_len)  # fmt: skip
        return torch.stack(drafted, 1)

    def _layer(
        self, inp: ChainInputs, tokens: Tensor, hidden: Tensor, pos: Tensor, tree: Tensor,
        kv_len: int | None,
    ) -> Tensor:  # fmt: skip
        """The head's layer on new positions ``pos [B, T]`` (consecutive from ``inp.start``)
        holding ``tokens [B, T]``: writes their K/V and attends to everything before them and
        causally among them. The embedding lookup is the layer's own (on CUDA inside its
        compiled region: eager, each lookup was a 3.9 us index kernel, GPU_NOTES run 64)."""
        if self.graphs is not None:
            return self._cuda_step(tokens, hidden, pos, inp.slots, inp.start, tree)
        p = self.p
        mid = p.head.midlayer
        cos, sin = p.cos[pos][:, :, None], p.sin[pos][:, :, None]
        residual, q, k, v = mid.project(p.embedding[tokens], hidden.to(p.dtype), cos, sin)
        rows = inp.slots[:, None]
        p.k[rows, :, pos] = k.transpose(1, 2)  # [B, T, Hkv, D]
        p.v[rows, :, pos] = v.transpose(1, 2)
        assert kv_len is not None
        seen = torch.arange(kv_len, device=self.device)[None, None, None] <= pos[:, None, :, None]
        keys, values = p.k[inp.slots, :, :kv_len], p.v[inp.slots, :, :kv_len]
        return mid.finish(residual, attend(q, keys, values, seen))

    def _cuda_layer(self, tokens: Tensor, hidden: Tensor, pos: Tensor, slots: Tensor,
                    start: Tensor, tree: Tensor) -> Tensor:  # fmt: skip
        """:meth:`_layer` on CUDA: the Triton split-KV attention over the head's slot cache.
        Up to 16 rows the layer is the target's fused one-row form (:func:`_fused_layer`)."""
        from mathagent.serving.engine.cuda import skinny
        from mathagent.serving.engine.cuda.attention import decode_attention

        p = self.p
        qkv = p.head.midlayer.qkv
        if tokens.numel() <= skinny.MAX_ROWS and qkv is not None and skinny.skinny_fits(qkv):
            return _fused_layer(p, tokens, hidden, pos, slots, start, tree)
        mid = p.head.midlayer
        cos, sin = p.cos[pos][:, :, None], p.sin[pos][:, :, None]
        residual, q, k, v = mid.project(p.embedding[tokens], hidden.to(p.dtype), cos, sin)
        rows = slots[:, None]
        p.k[rows, :, pos] = k.transpose(1, 2)  # [B, T, Hkv, D]
        p.v[rows, :, pos] = v.transpose(1, 2)
        att = decode_attention(q.transpose(1, 2), p.k, p.v, slots, start, tree)
        return mid.finish(residual, att.transpose(1, 2))

    def _window_layer(self, window: Tensor, slots: Tensor, start: Tensor, causal: Tensor) -> Tensor:
        """:meth:`_cuda_layer` over each row's window ``[B, T]`` from ``start``, its features
        read from the per-slot buffer."""
        pos = start[:, None] + torch.arange(window.shape[1], device=start.device)  # [B, T]
        return self._cuda_layer(
            window, self.p.feats[slots[:, None], pos], pos, slots, start, causal
        )

    def _draft_logits(self, last: Tensor) -> Tensor:
        """Draft-vocabulary logits [B, V'] (float32) of the layer's output ``last [B, H]``; on
        CUDA with the rows as one matrix, the head's norm runs inside the product."""
        from mathagent.serving.engine.cuda import skinny

        p, rows = self.p, self.p.draft_rows
        if self.graphs is None or rows is None or last.shape[0] > skinny.MAX_ROWS:
            return p.logits(last)
        norm = p.head.norm
        return skinny.skinny(last, rows, norm=norm.weight, eps=norm.eps).float()

    def _next_token(self, last: Tensor) -> Tensor:
        """The target id of the head's greedy draft from the layer's output ``last [B, H]``."""
        return self.p.ids[self._draft_logits(last).argmax(-1)]

    def _sampled_token(
        self, last: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, u: Tensor,
        top_k_max: int, cut_p: bool,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """The target id of each row's draft, sampled at ``u [B]`` from the head's warped
        distribution (argmax where the temperature is 0), and that distribution ``[B, V]``
        over the target's vocabulary (zero outside the draft vocabulary)."""
        logits = self._draft_logits(last)  # [B, V']
        batch = SamplingBatch(temperature, top_p, top_k, [], False, Cuts(top_k_max, cut_p))
        probs = Sampler.probs(logits, batch)
        col = torch.where(temperature == 0, logits.argmax(-1), Sampler.sample_at(probs, u))
        q = probs.new_zeros(probs.shape[0], self.p.embedding.shape[0])
        return self.p.ids[col], q.scatter_(1, self.p.ids.expand_as(probs), probs)

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        """After the target verified the chains at ``pos``: fuse their kept streams into
        the head's features (inside the whole step's graph)."""
        assert captured is not None
        self.p.fuse(inp.slots, pos, captured)

    def _capture(self, batch: int, k: int) -> None:
        """Capture one draft of ``batch`` rows and ``k`` drafts; padded rows work on the
        scratch slot."""
        assert self.graphs is not None
        inp = ChainInputs.allocate(batch, k + 1, self.device)
        inp.slots.fill_(self.graphs.scratch_slot)
        inp.start.fill_(k + 1)
        graph, out = self.graphs.capture_body(lambda: self.run(inp, k))
        host = torch.zeros(inp.packed.numel(), dtype=torch.long).pin_memory()
        self._captured[(batch, k)] = (graph, inp, [host, None], out)


def _fused_layer(p: HeadState, tokens: Tensor, hidden: Tensor, pos: Tensor, slots: Tensor,
                 start: Tensor, tree: Tensor) -> Tensor:  # fmt: skip
    """The head's layer on up to 16 rows as the target's fused layer runs (``forward.layer_step``):
    the products in the skinny kernel with the norms, the SiLU product and the residual adds
    inside them, rotary and the K/V write inside the attention: 7 kernels where Inductor's
    form around cuBLAS products (3-5 us each) took 12 (benchmarks/GPU_NOTES.md, runs 75, 77)."""
    from mathagent.serving.engine.cuda import skinny
    from mathagent.serving.engine.cuda.attention import rope_attention

    mid = p.head.midlayer
    hidden = hidden.to(p.dtype)
    normed = mid.hidden_norm(hidden)
    residual = normed if mid.cfg.norm_before_residual else hidden
    x = torch.cat([mid.input_layernorm(p.embedding[tokens]), normed], dim=-1)  # [B, T, 2H]
    qkv = skinny.skinny(x, mid.qkv)
    b, t = tokens.shape
    att = rope_attention(qkv, p.k, p.v, slots, start, tree, pos, p.cos, p.sin,
                         mid.cfg.num_attention_heads)  # fmt: skip
    h = skinny.skinny(att.reshape(b, t, -1), mid.self_attn.o_proj.weight, residual=residual)
    post, gate_up, down = mid.post_attention_layernorm, mid.mlp.gate_up, mid.mlp.down_proj.weight
    if skinny.glu_form(gate_up, b * t):
        act = skinny.skinny(h, gate_up, norm=post.weight, eps=post.eps, glu=True)
        return skinny.skinny(act, down, residual=h)
    both = skinny.skinny(h, gate_up, norm=post.weight, eps=post.eps)
    return skinny.skinny(both, down, residual=h, silu_mul=True)
