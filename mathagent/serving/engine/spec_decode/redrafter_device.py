"""ReDrafter's beam search inside the one-graph chain step (CUDA graphs, greedy rows).

:class:`DeviceReDrafter` is a :class:`~.chain_step.ChainDrafter`: it keeps each slot's
drafting context (the target's hidden state at the row's last accepted node) on the device,
runs the drafter's beam search from it and the window's root, and takes the next context from
the step's own verify (:meth:`DeviceReDrafter.settled`), so a step launched ahead drafts from
the state its predecessor left. The host writes a slot's context only when the device's is not
current: after a step the engine's general path ran for that row (after plain steps a row has
no context, and that path refreshes it). Sampled rows keep the general path, which samples the
chain from the drafter's q.

Built after run 68 and **not yet run on a GPU**, so it is off (``ENABLED``) until the CUDA test
(`tests/serving/engine/cuda/test_redrafter_cuda.py`) passes there and a benchmark shows it
faster than the general path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, ChainStep
from mathagent.serving.engine.spec_decode.proposal import SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.spec_decode.redrafter import ReDrafterProposer

log = logging.getLogger(__name__)

ENABLED = False  # the one-graph ReDrafter step (CUDA graphs); see the module's docstring


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


class FusedReDrafter:
    """The one-graph ReDrafter step of a :class:`~.redrafter.ReDrafterProposer`."""

    def __init__(self, proposer: ReDrafterProposer, runner: ModelRunner) -> None:
        assert runner.graphs is not None
        slots = runner.cache.k.shape[1]  # the scratch slot included
        self.drafter = DeviceReDrafter(proposer, slots, runner.device)
        self.steps = ChainStep(self.drafter, runner.graphs, width=proposer.beams)
        self.broken = False  # a shape failed to capture: the general path from then on

    def step(self, rows: list[SpecRow], k: int, ahead: bool):
        """:meth:`ChainStep.step_rows` for greedy rows with a context and room (else None)."""
        if (
            self.broken
            or not self.steps.fits(len(rows), k)
            or not all(r.greedy and r.hidden is not None and r.seq.slot is not None
                       and r.seq.num_cached > k for r in rows)
        ):  # fmt: skip
            self.steps.drop()
            return None
        try:
            self.steps.prepare(len(rows), k)
        except Exception:  # a new path on a GPU: ReDrafter still works without it, so say so
            log.exception("ReDrafter one-graph step failed to capture; drafting on the host")
            self.broken = True
            return None
        return self.steps.step_rows(rows, k, ahead, self.drafter.sync)
