"""A draft model's greedy chain inside the one-graph chain step (CUDA graphs, greedy rows).

:class:`DeviceDraftModel` is a :class:`~.chain_step.ChainDrafter`: it runs the draft model over
the step's window (the last ``k + 1`` committed tokens, ending with the root; re-writing K/V the
draft cache already holds changes nothing), which covers everything the step before can have
committed, then ``k - 1`` one-token steps of its own, so a step launched ahead drafts from the
cache its predecessor left. The host catches a row's draft cache up (the general path's
:meth:`~.draft_model.DraftModelProposer.catch_up_to`) only when it lags behind the window: after
a prefill, plain steps, or a step the general path ran. Sampled rows keep the general path,
which samples the chain and hands its q.

On since run 69, where `tests/serving/engine/cuda/test_draft_model_cuda.py` passed on an H200:
output equal to plain greedy, one graph a step, steps launched ahead used, and the device chain
accepted at least half as often as the host's (benchmarks/GPU_NOTES.md, tenth session). Its
speed against the general path is not yet measured (the default model ships no draft model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, OneGraphStep
from mathagent.serving.engine.spec_decode.proposal import SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.spec_decode.draft_model import DraftModelProposer

ENABLED = True  # the one-graph draft-model step (CUDA graphs); see the module's docstring


class DeviceDraftModel:
    """Greedy chains of ``proposer``'s draft model from the step's window."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self.p, self.runner = proposer, proposer.runner
        self.device = self.runner.device
        self._inputs: dict[tuple[int, int], object] = {}  # (rows, tokens) -> StepInputs

    def run(self, inp: ChainInputs, k: int) -> Tensor:
        """Beams ``[B, 1 + k]``: the root, then the draft model's argmax chain."""
        last = self._forward(inp.slots, inp.start, inp.window)  # the window at c-k .. c
        root = inp.start + k + 1  # [B] the root's position c
        drafted = [inp.window[:, -1]]
        for j in range(k):
            drafted.append(last.argmax(-1))
            if j + 1 < k:  # the draft just made, at position c + j + 1
                last = self._forward(inp.slots, root + j, drafted[-1][:, None])
        return torch.stack(drafted, 1)

    def _forward(self, slots: Tensor, before: Tensor, tokens: Tensor) -> Tensor:
        """The draft model over ``tokens [B, T]`` at positions ``before + 1 ..``, writing
        their K/V; its logits after the last one ``[B, V]``."""
        t = tokens.shape[1]
        pos = before[:, None] + 1 + torch.arange(t, device=tokens.device)
        graphs = self.runner.graphs
        if graphs is None:  # eager (a CPU): the runner's own forward, same positions
            logits, _ = self.runner.forward(tokens, pos, slots.tolist(), logits_last_only=True)
            return logits[:, -1]
        from mathagent.serving.engine.cuda.forward import StepInputs

        step = self._inputs.get((tokens.shape[0], t))
        if step is None:  # allocated on the warm-up, before the capture, and kept
            step = self._inputs[(tokens.shape[0], t)] = StepInputs.allocate(
                tokens.shape[0], t, self.device
            )
        assert isinstance(step, StepInputs)
        step.tokens.copy_(tokens)
        step.positions.copy_(pos)
        step.write.copy_(pos)
        step.write_slot.copy_(slots[:, None].expand_as(pos))
        step.slots.copy_(slots)
        step.start.copy_(pos[:, 0])
        logits, _, _ = graphs.forward(step)
        return logits[:, -1]

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        pass


class FusedDraftModel(OneGraphStep):
    """The one-graph step of a :class:`~.draft_model.DraftModelProposer`."""

    name = "draft-model one-graph"

    def __init__(self, proposer: DraftModelProposer, target: ModelRunner) -> None:
        assert target.graphs is not None and proposer.runner.graphs is not None
        self.p = proposer
        super().__init__(DeviceDraftModel(proposer), target.graphs)

    def takes(self, rows: list[SpecRow], k: int) -> bool:
        return super().takes(rows, k) and all(r.greedy for r in rows)

    def before(self, row: SpecRow, k: int) -> None:
        """Catch the row's draft cache up to its window's start; the step writes the rest."""
        c = row.seq.num_cached
        self.p.catch_up_to([row], c - k)
        row.state["cached"] = c + 1  # the window's forward writes c - k .. c
