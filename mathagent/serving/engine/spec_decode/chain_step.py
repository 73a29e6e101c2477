"""Greedy chain steps drafted on the device: draft, verify, accept and advance in one CUDA graph.

A drafter that drafts a batch of greedy chains from device-side inputs alone (EAGLE-3's head
over the target's features, a replayed continuation) hands its draft to :class:`ChainStep`,
which captures one graph per (batch bucket, ``k``): the drafter's ``run``, the target's verify
forward over the chains, the drafter's ``verified`` hook (EAGLE-3 fuses the new features there),
greedy acceptance, and the advance of the graph's own inputs to the next step's (window start
and tokens from the accepted count). A step is one host-to-device copy, one replay and one read
of the outcome, as TensorRT-LLM's one-model EAGLE-3 runs; and the host can launch step n + 1
before it reads step n, so its work between steps (commit, stop checks, scheduling: ~0.5 ms on
the H200, benchmarks/GPU_NOTES.md run 23) overlaps the device's next step. A drafter may return
several chains per row (:class:`Branches`: EAGLE-3's chain and the prompt-lookup chain), which
the step verifies as one tree. It stays one file because the capture, the replay, the launches
ahead and the step's body share one graph's buffers and its input layout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from mathagent.serving.engine.sampler import Cuts, RowSampling, SamplingBatch
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow
from mathagent.serving.engine.spec_decode.tree_batch import (
    SAMPLING_COLUMNS,
    TreeBatch,
    accept_longest,
    accept_sampled,
    move_path,
    sampling_row,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from mathagent.serving.engine.cuda.graphs import CudaGraphRunner

# A step graph's key: (batch bucket, k, the cuts of its sampled rows; None: all greedy)
GraphKey = tuple[int, int, Cuts | None]


def sampling_of(rows: list[SpecRow]) -> list[RowSampling]:
    """Each row's warp and generator (None for a greedy row)."""
    return [None if r.greedy else (r.seq.params, r.seq.generator) for r in rows]


@dataclass
class ChainInputs:
    """One draft's inputs: per row its slot, window start ``c - T`` and window tokens (the
    last ``T = D + 1`` committed tokens, ending with the root at ``c``; ``D`` the step's longest
    branch, :meth:`ChainStep.depth`)."""

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


class ChainDrafter(Protocol):
    """What :class:`ChainStep` needs of a drafter: a capturable batched greedy draft."""

    device: torch.device

    def run(self, inp: ChainInputs, k: int) -> Tensor:
        """Beams ``[B, 1 + k]`` (each row's root, then its chain of ``k`` drafts), or
        ``[B, W, 1 + k]``: ``W`` chains from the same root, verified as one tree."""
        ...

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        """After the verify forward: ``pos [B, 1 + D]`` are the positions the step can commit
        (root first) and ``captured`` the kept streams of the nodes on the accepted path there."""
        ...


class Branches:
    """Several chain drafters from the same root as one tree of ``len(parts)`` beams: the
    verify scores every chain and greedy acceptance keeps the longest (the first on ties).
    Sampled rows accept on the first part's chain, which that part samples if it can.

    ``depth(k)``: how many drafts the parts after the first bring beside the first's ``k`` in
    a greedy step (at least ``k``; the first's chain is padded to it and its padding gets no
    verify node): a copied continuation is cheap to draft and, when right, often right for
    longer than the head's chain (:meth:`lengths`)."""

    def __init__(self, *parts: ChainDrafter, depth: Callable[[int], int] | None = None):
        self.parts = parts
        self.device = parts[0].device
        self.samples = samples_drafts(parts[0])
        self._depth = depth

    def lengths(self, k: int) -> tuple[int, ...]:
        """Drafts each part verifies in a greedy step drafting ``k``."""
        d = k if self._depth is None else max(k, self._depth(k))
        return (k, *(d,) * (len(self.parts) - 1))

    def run(self, inp: ChainInputs, k: int) -> Tensor:
        """``[B, W, 1 + D]``: the first part's ``k`` drafts (padded with -1), the others' ``D``,
        ``D`` the window's ``T - 1`` (the step sizes its window to the longest branch)."""
        d = inp.window.shape[1] - 1
        first = self.parts[0].run(inp, k)
        if d > k:
            first = torch.nn.functional.pad(first, (0, d - k), value=-1)
        return torch.stack([first, *(part.run(inp, d) for part in self.parts[1:])], 1)

    def run_sampled(
        self, inp: ChainInputs, k: int, warp: SamplingBatch, u: Tensor
    ) -> tuple[Tensor, Tensor]:
        first, q = self.parts[0].run_sampled(inp, k, warp, u)  # type: ignore[attr-defined]
        rest = [part.run(inp, k) for part in self.parts[1:]]
        return torch.stack([first, *rest], 1), q

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        for part in self.parts:
            part.verified(inp, pos, captured)


def samples_drafts(drafter: object) -> bool:
    """Whether a chain drafter samples its chain for sampled rows (``run_sampled(inp, k, warp,
    u [B, k]) -> (beams, q [B, k, V])``: EAGLE-3's head) rather than drafting its argmax."""
    return bool(getattr(drafter, "samples", hasattr(drafter, "run_sampled")))


def windows_of(rows: list[SpecRow], k: int) -> tuple[list[int], list[int], list[list[int]]]:
    """Each row's slot, window start ``c - (k + 1)`` and window (its last ``k + 1`` tokens,
    ending with the root at ``c = num_cached``)."""
    slots, starts, windows = [], [], []
    for row in rows:
        seq, c = row.seq, row.seq.num_cached
        assert seq.slot is not None
        slots.append(seq.slot)
        starts.append(c - (k + 1))
        windows.append(seq.all_ids[c - k : c + 1])
    return slots, starts, windows


def advanced(starts: list[int], windows: list[list[int]], outcome: list[list[int]]) -> tuple:
    """The window starts and tokens of the step after one whose outcome rows are ``[accepted,
    committed tokens..., -1...]`` (the host's copy of what the graph computes)."""
    width = len(windows[0]) if windows else 0
    nxt = [(w + o[1 : o[0] + 2])[-width:] for w, o in zip(windows, outcome, strict=True)]
    return [s + o[0] + 1 for s, o in zip(starts, outcome, strict=True)], nxt


@dataclass
class _Launch:
    """One replayed step: where its outcome lands and, for a step launched ahead, the inputs
    it ran on once the host knows them."""

    key: GraphKey
    host: Tensor  # [bucket, 2 + D] pinned copy of the outcome
    last: Tensor  # [rows, H] the hidden state at each row's last accepted node
    done: torch.cuda.Event
    expect: tuple | None = None  # (slots, starts, windows)


@dataclass
class _Graph:
    """A captured whole step and the buffers it owns."""

    graph: torch.cuda.CUDAGraph
    inp: ChainInputs
    verify: object  # the verify forward's StepInputs: read and written on every replay
    outcome: Tensor  # [bucket, 2 + D] (D: the longest branch)
    last: Tensor  # [bucket, H]
    staging: Tensor  # pinned host copy of ``inp.packed``
    pinned: list[Tensor]  # two pinned outcome buffers, used in turn
    copied: torch.cuda.Event | None = None  # the last copy out of ``staging`` has run
    # a sampled step's rows: warp and uniforms [bucket, 3 + k + 1] (tree_batch.sampling_row),
    # filled from two pinned buffers in turn, each with the event of its last copy
    sampling: Tensor | None = None
    sampling_staging: list[Tensor] = field(default_factory=list)
    sampling_copied: list = field(default_factory=lambda: [None, None])


class ChainStep:
    """Whole chain steps of ``drafter`` on ``graphs``; one graph per (bucket, k, cuts).

    A batch with sampled rows takes a graph that also accepts by lossless speculative sampling
    (:func:`~.tree_batch.accept_sampled`: the chain's drafts are deterministic, q one-hot), at
    uniforms each row's own generator drew for the step on the host (``k + 1`` a launch, a step
    launched ahead and thrown away included) and copied in with the inputs; greedy rows of that
    batch accept as in a greedy one.
    """

    def __init__(self, drafter: ChainDrafter, graphs: CudaGraphRunner, width: int = 1) -> None:
        self.drafter = drafter
        self.graphs = graphs
        self.width = width  # chains per row the drafter returns (a tree when > 1)
        self._lengths = getattr(drafter, "lengths", None)  # ragged greedy branches (Branches)
        self.samples = samples_drafts(drafter)  # sampled rows draw its drafts: k more uniforms
        self._graphs: dict[GraphKey, _Graph] = {}
        self._ahead: _Launch | None = None  # a step launched before its inputs were read
        self.claimed = 0  # steps launched ahead and then used (tests and benchmarks read it)
        self.sampled_launches = 0  # replays of graphs with sampled rows (tests read it)
        self._too_wide: set[int] = set()  # draft lengths whose verify no graph takes (warned)
        # acceptance as one compiled region: eager, the argmax over the vocabulary and ~30
        # small index kernels took ~60 us of a 1.5 ms step (benchmarks/GPU_NOTES.md, run 51)
        self._accept = accept_longest
        self._glue = None  # cuda.chain_glue when on: the tensor work around the verify
        if drafter.device.type == "cuda":
            self._accept = torch.compile(accept_longest, dynamic=False)
            from mathagent.serving.engine.cuda import chain_glue

            self._glue = chain_glue if chain_glue.usable(drafter.device) else None

    def lengths(self, k: int, cuts: Cuts | None = None) -> tuple[int, ...]:
        """Drafts each chain of a step drafting ``k`` verifies: ``k`` each, or for an
        all-greedy step (``cuts`` None) what a ragged drafter asks (the lookup beside EAGLE-3's
        chain). The step's window is the longest plus its root."""
        if cuts is None and self._lengths is not None:
            return tuple(self._lengths(k))
        return (k,) * self.width

    def depth(self, k: int, cuts: Cuts | None = None) -> int:
        """The most drafts a chain of the step verifies (its window is this plus the root)."""
        return max(self.lengths(k, cuts))

    def nodes(self, k: int, cuts: Cuts | None = None) -> int:
        """The verify nodes of each row of the step."""
        return 1 + sum(self.lengths(k, cuts))

    def fits(self, rows: int, k: int) -> bool:
        """Whether :meth:`step` takes ``rows`` rows drafting ``k`` (a captured verify shape)."""
        nodes = self.nodes(k)  # the step's own verify shape
        if not self.graphs.accepts(1, nodes) and k not in self._too_wide:
            self._too_wide.add(k)  # the host path runs every such step: say so once
            log.warning(
                "chains of %d drafts verify %d tokens a row, more than the CUDA graphs take: "
                "each step runs on the host path, ~30x slower (H200, GPU_NOTES run 81); "
                "choose a shorter draft length",
                k,
                nodes,
            )
        return self.graphs.accepts(rows, nodes)

    def prepare(self, rows: int, k: int, cuts: Cuts | None = None) -> None:
        """Capture the step of ``rows`` rows drafting ``k`` now (a warm-up outside timing);
        ``cuts``: with sampled acceptance and this warp (None: all rows greedy)."""
        key = (self.graphs.bucket(rows), k, cuts)
        if key not in self._graphs:
            self._capture(*key)

    def captured(self) -> list[tuple[int, int]]:
        """The (bucket, k) shapes captured so far (greedy or sampled)."""
        return list(dict.fromkeys((b, k) for b, k, _ in self._graphs))

    def step(
        self, slots: list[int], starts: list[int], windows: list[list[int]], k: int,
        ahead: bool = False, sampling: list[RowSampling] | None = None,
    ) -> tuple[list[list[int]], Tensor]:  # fmt: skip
        """Draft, verify and accept rows whose windows (:meth:`depth` + 1 tokens) start at
        ``starts``: per row ``[accepted, committed tokens..., -1...]`` on the host and the
        target's hidden state ``[B, H]`` at the last accepted node. The outcome is the step's
        one host sync; with ``ahead`` the same rows' next step is launched before it (each row
        must have room for ``2 (D + 1)`` more positions). ``sampling``: per row its warp and
        generator, None for a greedy row."""
        rows = len(slots)
        cuts = Cuts.of_rows(sampling)
        if cuts is None:
            sampling = None  # every row greedy: the greedy graph
        key = (self.graphs.bucket(rows), k, cuts)
        self.prepare(rows, k, cuts)
        launch, self._ahead = self._ahead, None
        if launch is None or launch.key != key or launch.expect != (slots, starts, windows):
            self._fill(key, slots, starts, windows)
            if sampling is not None:
                self._fill_sampling(key, sampling)
            launch = self._launch(key, rows)
        else:
            self.claimed += 1
        if ahead:
            if sampling is not None:  # the next step's own draws
                self._fill_sampling(key, sampling)
            self._ahead = self._launch(key, rows)  # on the inputs the last replay advanced
        launch.done.synchronize()
        outcome = launch.host[:rows].tolist()
        if self._ahead is not None:
            self._ahead.expect = (slots, *advanced(starts, windows, outcome))
        return outcome, launch.last

    def step_rows(
        self, rows: list[SpecRow], k: int, ahead: bool,
        before: Callable[[SpecRow], None] | None = None,
    ) -> tuple[list[Draft], list[list[int]], Tensor]:  # fmt: skip
        """:meth:`step` for rows with room: each row's window is its last :meth:`depth` + 1
        tokens, ending with the root at ``c = num_cached`` (``before(row)`` runs first: a
        drafter's bookkeeping). Returns the drafts' shapes, the outcome rows and the hidden
        states, as a proposer's ``fused_step`` does."""
        for row in rows if before is not None else ():
            before(row)
        sampling = sampling_of(rows)
        d = self.depth(k, Cuts.of_rows(sampling))
        slots, starts, windows = windows_of(rows, d)
        host, last = self.step(slots, starts, windows, k, ahead, sampling)
        drafts = [Draft(torch.tensor([w[-1:] + [0] * d])) for w in windows]  # shapes only
        return drafts, host, last

    def drop(self) -> None:
        """Forget a step launched ahead (the batch changed, or the next step is not this one)."""
        self._ahead = None

    def _fill(self, key: GraphKey, slots: list[int], starts: list[int],
              windows: list[list[int]]) -> None:  # fmt: skip
        """Copy the rows' inputs (padded rows on the scratch slot) into the graph's, in one copy."""
        g = self._graphs[key]
        pad = key[0] - len(slots)
        width = g.inp.window.shape[1]
        values = ChainInputs.columns(
            slots + [self.graphs.scratch_slot] * pad,
            starts + [0] * pad,
            windows + [[0] * width] * pad,
        )
        if g.copied is not None:
            g.copied.synchronize()  # the previous copy out of the staging buffer has run
        g.staging.numpy()[:] = values
        g.inp.packed.copy_(g.staging, non_blocking=True)
        g.copied = torch.cuda.Event()
        g.copied.record()

    def _fill_sampling(self, key: GraphKey, sampling: list[RowSampling]) -> None:
        """Each row's warp and ``k + 1`` fresh uniforms from its generator (padded and greedy
        rows: temperature 0) into the graph's sampling buffer, in one copy."""
        g = self._graphs[key]
        draws = self._draws(key[1])
        assert g.sampling is not None
        greedy = torch.zeros(SAMPLING_COLUMNS + draws, dtype=torch.float64)
        values = torch.stack([
            greedy if s is None else sampling_row(
                s[0].temperature, s[0].top_p, s[0].top_k,
                torch.rand(draws, generator=s[1], dtype=torch.float64),
            )
            for s in [*sampling, *[None] * (key[0] - len(sampling))]
        ])  # fmt: skip
        g.sampling_staging.reverse()
        g.sampling_copied.reverse()
        if g.sampling_copied[0] is not None:
            g.sampling_copied[0].synchronize()  # this buffer's last copy has run
        g.sampling_staging[0].copy_(values)
        g.sampling.copy_(g.sampling_staging[0], non_blocking=True)
        g.sampling_copied[0] = torch.cuda.Event()
        g.sampling_copied[0].record()

    def _draws(self, k: int) -> int:
        """Uniforms a sampled row draws a step: ``k + 1`` to verify, ``k`` more to draft."""
        return k + 1 + (k if self.samples else 0)

    def _launch(self, key: GraphKey, rows: int) -> _Launch:
        """Replay, then queue the copy of the outcome out of the graph's buffers (the next
        replay overwrites them) into the pinned buffer not used last time."""
        g = self._graphs[key]
        g.graph.replay()
        self.sampled_launches += key[2] is not None
        g.pinned.reverse()
        host = g.pinned[0]
        host.copy_(g.outcome, non_blocking=True)
        last = g.last[:rows].clone()
        done = torch.cuda.Event()
        done.record()
        return _Launch(key, host, last, done)

    def _body(
        self, inp: ChainInputs, k: int, verify: object, sampling: Tensor | None = None,
        cuts: Cuts | None = None,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """Draft, then verify the chains (a tree of them, nodes written at ``c ..``, the root
        at ``c``; ``verify``: the step's StepInputs), accept (greedily, or by speculative
        sampling for the rows ``sampling`` gives a temperature), move the accepted path's K/V
        into place, let the drafter see the committed nodes, and advance ``inp``;
        ``(outcome [B, 2 + D], last hidden [B, H])``."""
        q = None
        if sampling is not None and self.samples:
            assert cuts is not None
            warp = SamplingBatch.of_table(sampling, cuts)
            run_sampled = self.drafter.run_sampled  # type: ignore[attr-defined]
            beams, q = run_sampled(inp, k, warp, sampling[:, SAMPLING_COLUMNS + k + 1 :])
        else:
            beams = self.drafter.run(inp, k)
        lengths = self.lengths(k, cuts)
        ragged = lengths if len(set(lengths)) > 1 else None
        tree = TreeBatch(beams if beams.dim() == 3 else beams[:, None], [], ragged)
        lay = tree.layout()
        if self._glue is not None:
            c = self._glue.feed(tree.beams, lay.depths, lay.gather, inp.slots, inp.start,
                                verify.packed)  # type: ignore[attr-defined]  # fmt: skip
        else:
            c = self.feed(tree, inp, verify)  # [B] the roots' positions
        logits, hidden, captured = self.graphs.forward(verify)
        # path [B, 1 + D]
        accepted, path, tokens = self._accept(tree.beams, logits, lay.parents, lay.offsets)
        if sampling is not None:
            greedy = (accepted, path, tokens)
            assert cuts is not None
            accepted, path, tokens = accept_sampled(tree.beams, logits, sampling, greedy, cuts, q)
        return self.finish(inp, c, accepted, path, tokens, hidden, captured, tree.width)

    @staticmethod
    def feed(tree: TreeBatch, inp: ChainInputs, verify: object) -> Tensor:
        """Write the verify forward's inputs (``verify``'s packed buffer, in one copy) for
        ``tree`` (beams ``[B, W, 1 + D]``) rooted at each row's ``c``; returns ``c [B]``."""
        c = inp.start + tree.beams.shape[-1]  # the root's position (the window ends there)
        tokens, depths = tree.tokens(), tree.node_depths()  # [B, nodes], [nodes]
        write = c[:, None] + torch.arange(tokens.shape[1], device=c.device)
        pos = c[:, None] + depths[None]  # rope positions: root, then each depth
        slot = inp.slots[:, None].expand_as(write)
        grids = torch.stack([tokens, pos, write, slot]).flatten()  # StepInputs.packed's order
        verify.packed.copy_(torch.cat([grids, inp.slots, c]))  # type: ignore[attr-defined]
        return c

    def finish(
        self, inp: ChainInputs, c: Tensor, accepted: Tensor, path: Tensor, tokens: Tensor,
        hidden: Tensor, captured: Tensor | None, width: int,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """After acceptance: move a tree's accepted path into place, let the drafter see the
        committed nodes, and advance ``inp``; ``(outcome [B, 2 + D], last hidden [B, H])``."""
        glue = self._glue
        if width > 1:
            forward = self.graphs.forward
            (move_path if glue is None else glue.move_path)(
                (forward.k, forward.v), inp.slots, c, path
            )
        kept = None if captured is None else captured.gather(
            1, path[..., None].expand(-1, -1, captured.shape[-1])
        )  # fmt: skip
        steps = torch.arange(path.shape[1], device=c.device)
        self.drafter.verified(inp, c[:, None] + steps, kept)
        scratch = self.graphs.scratch_slot
        if glue is not None:  # the outcome, the last hidden state and the advance in one launch
            outcome, last = glue.advance(inp.slots, inp.start, inp.window, accepted,
                                               tokens, path, hidden, scratch)  # fmt: skip
        else:
            node = path.gather(1, accepted[:, None])[..., None].expand(-1, 1, hidden.shape[-1])
            outcome, last = torch.cat([accepted[:, None], tokens], 1), hidden.gather(1, node)[:, 0]
            self.advance(inp, accepted, tokens, scratch)
        settled = getattr(self.drafter, "settled", None)  # a drafter that drafts from it
        if settled is not None:
            settled(inp, last)
        return outcome, last

    @staticmethod
    def advance(inp: ChainInputs, accepted: Tensor, tokens: Tensor, scratch: int) -> None:
        """Turn ``inp`` into the next step's inputs (what :func:`advanced` computes on the
        host); padded rows, on the ``scratch`` slot, stay where they are."""
        width = inp.window.shape[1]
        real = (inp.slots != scratch).long()
        offsets = torch.arange(width, device=inp.window.device)
        cols = (accepted + 1)[:, None] * real[:, None] + offsets
        window = torch.cat([inp.window, tokens.clamp(min=0)], 1).gather(1, cols)
        inp.start.add_((accepted + 1) * real)
        inp.window.copy_(window)

    def _capture(self, batch: int, k: int, cuts: Cuts | None = None) -> None:
        """Capture the whole step of ``batch`` rows drafting ``k`` (``cuts``: with sampled
        acceptance and this warp); padded rows (and the warm-up) work on the scratch slot, whose inputs
        :meth:`advance` leaves alone."""
        from mathagent.serving.engine.cuda.forward import StepInputs

        dev = self.drafter.device
        lengths = self.lengths(k, cuts)
        d = max(lengths)
        inp = ChainInputs.allocate(batch, d + 1, dev)
        inp.slots.fill_(self.graphs.scratch_slot)
        inp.start.fill_(d + 1)
        nodes = 1 + sum(lengths)
        verify = StepInputs.allocate(batch, nodes, dev)
        ragged = lengths if len(set(lengths)) > 1 else None
        mask = TreeBatch(torch.zeros(1, self.width, d + 1, dtype=torch.long, device=dev), [],
                         ragged).mask()  # fmt: skip
        if mask is not None:  # the tree's own mask, the same every step (causal for a chain)
            verify.tree.copy_(mask.to(torch.int8).expand_as(verify.tree))
        sampling = None  # zeros in the warm-up: every row greedy
        if cuts is not None:
            sampling = torch.zeros(batch, SAMPLING_COLUMNS + self._draws(k), dtype=torch.float64,
                                   device=dev)  # fmt: skip
        graph, (outcome, last) = self.graphs.capture_body(
            lambda: self._body(inp, k, verify, sampling, cuts)
        )
        staging = torch.zeros(inp.packed.numel(), dtype=torch.long).pin_memory()
        pinned = [torch.zeros(outcome.shape, dtype=torch.long).pin_memory() for _ in range(2)]
        g = _Graph(graph, inp, verify, outcome, last, staging, pinned, sampling=sampling)
        if sampling is not None:
            g.sampling_staging = [torch.zeros_like(sampling, device="cpu").pin_memory()
                                  for _ in range(2)]  # fmt: skip
        self._graphs[(batch, k, cuts)] = g


class OneGraphStep:
    """A proposer's one-graph step: :class:`ChainStep` over its drafter for the rows
    :meth:`takes` allows (else None: the engine's general path), and the general path for good
    once a shape fails to capture (a new path on a GPU: the method still works without it)."""

    name = "one-graph"  # for the log

    def __init__(self, drafter: ChainDrafter, graphs: CudaGraphRunner, width: int = 1) -> None:
        self.drafter = drafter
        self.steps = ChainStep(drafter, graphs, width)
        self.broken = False

    def takes(self, rows: list[SpecRow], k: int) -> bool:
        """Whether these rows may take the step (beyond the captured shapes)."""
        return all(r.seq.num_cached > k and r.seq.slot is not None for r in rows)

    def before(self, row: SpecRow, k: int) -> None:
        """Host bookkeeping for a row before its step."""

    def step(self, rows: list[SpecRow], k: int, ahead: bool):
        """:meth:`ChainStep.step_rows` for the rows, or None."""
        if self.broken or not self.steps.fits(len(rows), k) or not self.takes(rows, k):
            self.steps.drop()
            return None
        try:
            self.steps.prepare(len(rows), k, Cuts.of_rows(sampling_of(rows)))
        except Exception:
            log.exception("%s step failed to capture; drafting on the host", self.name)
            self.broken = True
            return None
        return self.steps.step_rows(rows, k, ahead, lambda row: self.before(row, k))


class OneGraphProposer:
    """A proposer whose greedy steps may take a :class:`OneGraphStep` (``fused``)."""

    fused: OneGraphStep | None = None

    def fused_step(self, rows: list[SpecRow], k: int, sinks: int, ahead: bool = False):
        """Rows in one CUDA graph (None: the general path, as while ``sinks``: another
        method's head reads the target's streams, which this step does not feed)."""
        return None if self.fused is None or sinks else self.fused.step(rows, k, ahead)

    def drop_ahead(self) -> None:
        if self.fused is not None:
            self.fused.steps.drop()
