"""ReDrafter's beam search inside the one-graph chain step (CUDA graphs, greedy rows).

:class:`DeviceReDrafter` is a :class:`~.chain_step.ChainDrafter`: it keeps each slot's
drafting context (the target's hidden state at the row's last accepted node) on the device,
runs the drafter's beam search from it and the window's root, and takes the next context from
the step's own verify (:meth:`DeviceReDrafter.settled`), so a step launched ahead drafts from
the state its predecessor left. The host writes a slot's context only when the device's is not
current: after a step the engine's general path ran for that row (after plain steps a row has
no context, and that path refreshes it). Sampled rows keep the general path, which samples the
chain from the drafter's q.

On since run 71-72 (H200): `tests/serving/engine/cuda/test_redrafter_cuda.py` passed (1 and 3
beams), and on the default model (bf16, 1 beam, 3 tokens, 20 agent prompts x 256) a fixed
ReDrafter step took 1.036 ms against the general path's 1.398 + 2.139 ms of host drafting:
1.185x plain against 0.353x (benchmarks/GPU_NOTES.md, tenth session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, OneGraphStep
from mathagent.serving.engine.spec_decode.proposal import SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.spec_decode.redrafter import ReDrafterProposer

ENABLED = True  # the one-graph ReDrafter step (CUDA graphs); see the module's docstring


class DeviceReDrafter:
    """Beam search of ``proposer``'s drafter from per-slot contexts on ``device``."""

    def __init__(self, proposer: ReDrafterProposer, slots: int, device: torch.device) -> None:
        self.p, self.device = proposer, device
        hidden = proposer.embedding.shape[1]
        self.context = torch.zeros(slots, hidden, dtype=proposer.dtype, device=device)
        self._current: dict[int, str] = {}  # slot -> request whose context the device holds

    def sync(self, row: SpecRow) -> None:
        """Write the row's context from the host unless the device already holds it."""
        slot, rid = row.seq.slot, row.seq.request_id
        assert slot is not None and row.hidden is not None
        if self._current.get(slot) != rid:
            self.context[slot] = row.hidden.to(self.context.dtype)
            self._current[slot] = rid

    def forget(self, slot: int | None) -> None:
        """The general path drafted for this slot: the device's context is behind."""
        self._current.pop(slot, None)  # type: ignore[arg-type]

    def run(self, inp: ChainInputs, k: int) -> Tensor:
        """Beams ``[B, W, 1 + k]``: the root, then each beam's drafts."""
        p = self.p
        context = self.context[inp.slots].to(p.dtype)
        return p.drafter.beam_search(context, inp.window[:, -1], p.embedding, p.beams, k)

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        pass

    def settled(self, inp: ChainInputs, last: Tensor) -> None:
        """The target's hidden state at each row's last accepted node: its next context."""
        self.context[inp.slots] = last.to(self.context.dtype)


class FusedReDrafter(OneGraphStep):
    """The one-graph ReDrafter step of a :class:`~.redrafter.ReDrafterProposer`."""

    name = "ReDrafter one-graph"

    def __init__(self, proposer: ReDrafterProposer, runner: ModelRunner) -> None:
        assert runner.graphs is not None
        slots = runner.cache.k.shape[1]  # the scratch slot included
        drafter = DeviceReDrafter(proposer, slots, runner.device)
        super().__init__(drafter, runner.graphs, width=proposer.beams)

    def takes(self, rows: list[SpecRow], k: int) -> bool:
        """Greedy rows with a context (a row after plain steps has none) and room."""
        return super().takes(rows, k) and all(r.greedy and r.hidden is not None for r in rows)

    def before(self, row: SpecRow, k: int) -> None:
        self.drafter.sync(row)  # type: ignore[attr-defined]
