"""Greedy EAGLE-3 chains for a whole batch in one pass over static shapes.

Each row settles again the window of its last ``T = k + 1`` committed positions (features at
``c-T .. c-1`` paired with tokens ``c-T+1 .. c``; re-running a settled position writes the K/V
it already holds), which covers everything a verify step can have committed, then drafts ``k``
tokens with ``k - 1`` one-token steps of the head's layer. The shapes depend only on the batch
bucket and ``k``, so on CUDA the whole draft is one captured graph: drafting row by row launched
about 40 small kernels per drafted token, 4.9 ms per step against a 1 ms target step on the
H200 (benchmarks/GPU_NOTES.md, run 19). The CPU runs the same code eagerly, attention cut at
the batch's longest row.

:meth:`Eagle3Chain.step` goes one further on CUDA: drafting, the target's verify forward, the
head's feature fusion and greedy acceptance in one graph, so a step is one host-to-device copy,
one replay and one read of the outcome (TensorRT-LLM's one-model EAGLE-3 runs the same way).
The graph also advances its own inputs to the next step's (window start and tokens from the
accepted count), so the host can launch step n + 1 before it reads step n: the ~0.5 ms of host
work between steps (commit, stop checks, scheduling) then overlaps the device's next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Head, attend
from mathagent.serving.engine.spec_decode.tree_batch import TreeBatch

if TYPE_CHECKING:
    from mathagent.serving.engine.cuda.graphs import CudaGraphRunner


class HeadState(Protocol):
    """What the drafter reads of an EAGLE-3 proposer: the head and its per-slot buffers."""

    head: Eagle3Head
    dtype: torch.dtype
    embedding: Tensor  # [V, H]
    ids: Tensor  # [V'] target id of each draft column
    feats: Tensor  # [slots, seq, H] fused target features by position
    k: Tensor  # [slots, Hkv, seq, D] the layer's K/V by position
    v: Tensor
    cos: Tensor  # [seq, D]
    sin: Tensor

    def logits(self, out: Tensor) -> Tensor: ...

    def fuse(self, slots: Tensor, write: Tensor, captured: Tensor) -> None: ...


@dataclass
class ChainInputs:
    """One draft's inputs: per row its slot, window start ``c - T`` and window tokens."""

    packed: Tensor  # [B * (2 + T)] int64: slots, starts, then the windows row by row
    slots: Tensor  # [B]
    start: Tensor  # [B]
    window: Tensor  # [B, T] tokens at c-T+1 .. c (the last one is the root)
    causal: Tensor  # [B, T, T] int8, the window's own mask
    single: Tensor  # [B, 1, 1] int8, a drafted token sees itself

    @classmethod
    def allocate(cls, batch: int, width: int, device: torch.device) -> ChainInputs:
        packed = torch.zeros(batch * (2 + width), dtype=torch.long, device=device)
        causal = torch.tril(torch.ones(width, width, dtype=torch.int8, device=device))
        return cls(
            packed=packed,
            slots=packed[:batch],
            start=packed[batch : 2 * batch],
            window=packed[2 * batch :].view(batch, width),
            causal=causal.expand(batch, width, width).contiguous(),
            single=torch.ones(batch, 1, 1, dtype=torch.int8, device=device),
        )

    @staticmethod
    def columns(slots: list[int], starts: list[int], windows: list[list[int]]) -> list[int]:
        """The values of ``packed`` in its order."""
        return [*slots, *starts, *(t for w in windows for t in w)]


@dataclass
class _Launch:
    """One replayed step: where its outcome lands and, for a step launched ahead, the inputs
    it ran on once the host knows them."""

    key: tuple[int, int, bool]
    host: Tensor  # [bucket, 2 + k] pinned copy of the outcome
    last: Tensor  # [rows, H] the hidden state at each row's last accepted node
    done: torch.cuda.Event
    expect: tuple | None = None  # (slots, starts, windows)


def advanced(starts: list[int], windows: list[list[int]], outcome: list[list[int]]) -> tuple:
    """The window starts and tokens of the step after one whose outcome rows are ``[accepted,
    committed tokens..., -1...]`` (the host's copy of what the graph computes)."""
    width = len(windows[0]) if windows else 0
    nxt = [(w + o[1 : o[0] + 2])[-width:] for w, o in zip(windows, outcome, strict=True)]
    return [s + o[0] + 1 for s, o in zip(starts, outcome, strict=True)], nxt


class Eagle3Chain:
    """Drafts greedy chains for many rows at once; one CUDA graph per (batch bucket, k)."""

    def __init__(self, proposer: HeadState, graphs: CudaGraphRunner | None) -> None:
        self.p = proposer
        self.graphs = graphs
        self.device = proposer.k.device
        self._captured: dict[tuple[int, int, bool], tuple] = {}  # (bucket, k, whole step)
        self._ahead: _Launch | None = None  # a whole step launched before its inputs were read
        self.claimed = 0  # steps launched ahead and then used (tests and benchmarks read it)

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
        out = self._replay(False, slots, starts, windows, k)
        return out[: len(slots)].clone()  # the graph's buffer is overwritten by the next draft

    def fits(self, rows: int, k: int) -> bool:
        """Whether :meth:`step` takes ``rows`` rows drafting ``k`` (a captured verify shape)."""
        g = self.graphs
        return g is not None and g.accepts(rows, k + 1) and g.width_bucket(k + 1) == k + 1

    def step(
        self, slots: list[int], starts: list[int], windows: list[list[int]], k: int,
        ahead: bool = False,
    ) -> tuple[list[list[int]], Tensor]:  # fmt: skip
        """Draft, verify and accept greedily in one graph (CUDA, :meth:`fits`): per row
        ``[accepted, committed tokens..., -1...]`` on the host and the target's hidden state
        ``[B, H]`` at the last accepted node. The outcome is the step's one host sync; with
        ``ahead`` the next step of the same rows is launched before it (each row must have
        room for ``2 (k + 1)`` more positions)."""
        rows = len(slots)
        key = (self.graphs.bucket(rows), k, True) if self.graphs is not None else None
        launch, self._ahead = self._ahead, None
        if launch is None or launch.key != key or launch.expect != (slots, starts, windows):
            self._replay(True, slots, starts, windows, k)
            launch = self._collect(key, rows)
        else:
            self.claimed += 1
        if ahead:
            self._captured[key][0].replay()  # on the inputs the last replay advanced
            self._ahead = self._collect(key, rows)
        launch.done.synchronize()
        outcome = launch.host[:rows].tolist()
        if self._ahead is not None:
            self._ahead.expect = (slots, *advanced(starts, windows, outcome))
        return outcome, launch.last

    def drop(self) -> None:
        """Forget a step launched ahead (the batch changed, or the next step is not this one)."""
        self._ahead = None

    def _collect(self, key: tuple, rows: int) -> _Launch:
        """Queue the copy of the last replay's outcome out of the graph's buffers (the next
        replay overwrites them) into one of two pinned buffers used in turn."""
        _, _, _, (outcome, last), _, pinned = self._captured[key]
        pinned.reverse()
        host = pinned[0]
        host.copy_(outcome, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return _Launch(key, host, last[:rows].clone(), done)

    def _replay(self, verify: bool, slots: list[int], starts: list[int],
                windows: list[list[int]], k: int):  # fmt: skip
        """Fill the captured inputs of (bucket, k, verify) from the host in one copy; replay."""
        assert self.graphs is not None
        rows = len(slots)
        key = (self.graphs.bucket(rows), k, verify)
        if key not in self._captured:
            self._capture(*key)
        graph, inp, host, out = self._captured[key][:4]
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
        p, width = self.p, inp.window.shape[1]
        offsets = torch.arange(width, device=self.device)
        pos = inp.start[:, None] + offsets  # [B, T]
        hidden = p.feats[inp.slots[:, None], pos]  # [B, T, H]
        out = self._layer(inp, p.embedding[inp.window], hidden, pos, inp.causal, kv_len)
        last = out[:, -1:]  # [B, 1, H] the layer's output at c - 1
        drafted = [inp.window[:, -1]]
        for j in range(k):
            drafted.append(p.ids[p.logits(last[:, 0]).argmax(-1)])
            if j + 1 < k:
                at = inp.start + (width - 1 + j + 1)  # [B] position c - 1 + (j + 1)
                emb = p.embedding[drafted[-1]][:, None]
                step = ChainInputs(inp.packed, inp.slots, at, inp.window, inp.causal, inp.single)
                last = self._layer(step, emb, last, at[:, None], inp.single, kv_len)
        return torch.stack(drafted, 1)

    def _layer(
        self, inp: ChainInputs, emb: Tensor, hidden: Tensor, pos: Tensor, tree: Tensor,
        kv_len: int | None,
    ) -> Tensor:  # fmt: skip
        """The head's layer on new positions ``pos [B, T]`` (consecutive from ``inp.start``):
        writes their K/V and attends to everything before them and causally among them."""
        p = self.p
        mid = p.head.midlayer
        cos, sin = p.cos[pos][:, :, None], p.sin[pos][:, :, None]
        residual, q, k, v = mid.project(emb, hidden.to(p.dtype), cos, sin)
        rows = inp.slots[:, None]
        p.k[rows, :, pos] = k.transpose(1, 2)  # [B, T, Hkv, D]
        p.v[rows, :, pos] = v.transpose(1, 2)
        if self.graphs is not None:
            from mathagent.serving.engine.cuda.attention import decode_attention

            att = decode_attention(q.transpose(1, 2), p.k, p.v, inp.slots, inp.start, tree)
            return mid.finish(residual, att.transpose(1, 2))
        assert kv_len is not None
        seen = torch.arange(kv_len, device=self.device)[None, None, None] <= pos[:, None, :, None]
        keys, values = p.k[inp.slots, :, :kv_len], p.v[inp.slots, :, :kv_len]
        return mid.finish(residual, attend(q, keys, values, seen))

    def _verified(self, inp: ChainInputs, k: int, verify: object) -> tuple[Tensor, Tensor]:
        """Draft, then verify the chains at ``c .. c+k`` (``verify``: the step's StepInputs),
        fuse the new features and accept greedily; ``(outcome [B, 2 + k], last hidden [B, H])``."""
        assert self.graphs is not None
        beams = self.run(inp, k)  # [B, 1 + k]
        pos = inp.start[:, None] + (k + 1) + torch.arange(k + 1, device=self.device)
        for name, value in (("tokens", beams), ("positions", pos), ("write", pos)):
            getattr(verify, name).copy_(value)
        verify.write_slot.copy_(inp.slots[:, None].expand_as(pos))
        verify.slots.copy_(inp.slots)
        verify.start.copy_(pos[:, 0])
        logits, hidden, captured = self.graphs.forward(verify)
        self.p.fuse(inp.slots, pos, captured)
        accepted, _, tokens = TreeBatch(beams[:, None], []).greedy_accept(logits)
        node = accepted[:, None, None].expand(-1, 1, hidden.shape[-1])
        outcome = torch.cat([accepted[:, None], tokens], 1)
        self._advance(inp, accepted, tokens)
        return outcome, hidden.gather(1, node)[:, 0]

    def _advance(self, inp: ChainInputs, accepted: Tensor, tokens: Tensor) -> None:
        """Turn ``inp`` into the next step's inputs (what :func:`advanced` computes on the
        host); padded rows, on the scratch slot, stay where they are."""
        assert self.graphs is not None
        width = inp.window.shape[1]
        real = (inp.slots != self.graphs.scratch_slot).long()
        cols = (accepted + 1)[:, None] * real[:, None] + torch.arange(width, device=self.device)
        window = torch.cat([inp.window, tokens.clamp(min=0)], 1).gather(1, cols)
        inp.start.add_((accepted + 1) * real)
        inp.window.copy_(window)

    def _capture(self, batch: int, k: int, verify: bool) -> None:
        """Warm up (compilation, Triton autotuning) and capture one draft (or whole step) of
        ``batch`` rows and ``k`` drafts; padded rows work on the scratch slot."""
        assert self.graphs is not None
        from mathagent.serving.engine.cuda.forward import StepInputs

        self.graphs.captures += 1

        inp = ChainInputs.allocate(batch, k + 1, self.device)
        inp.slots.fill_(self.graphs.scratch_slot)
        inp.start.fill_(k + 1)
        checked = StepInputs.allocate(batch, k + 1, self.device) if verify else None

        def body() -> object:
            return self._verified(inp, k, checked) if verify else self.run(inp, k)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graphs.pool), torch.inference_mode():
            out = body()
        host = torch.zeros(inp.packed.numel(), dtype=torch.long).pin_memory()
        pinned = None  # two pinned outcome buffers of a whole step, used in turn
        if verify:
            pinned = [torch.zeros(out[0].shape, dtype=torch.long).pin_memory() for _ in range(2)]
        # the graph reads and writes ``checked`` (the verify's inputs) on every replay: it must
        # live as long as the graph, or its freed memory is handed to other tensors
        self._captured[(batch, k, verify)] = (graph, inp, [host, None], out, checked, pinned)
