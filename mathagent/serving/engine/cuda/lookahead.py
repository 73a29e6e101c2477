"""Greedy decode with the next step already on the GPU while the host handles this one.

A batch-1 decode step on the CUDA path is a few milliseconds of GPU work plus ~0.1 ms of host
work (scheduling, detokenising, stop checks) during which the GPU would sit idle. For greedy
rows the next step's inputs are known on the device as soon as this step's argmax is: the
next step is launched from them before the host reads this step's tokens, and used when the
engine asks for exactly that step (same slots, positions and tokens); otherwise it is
dropped. A dropped step only wrote K/V at positions the real step rewrites, or in freed slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda.graphs import CudaGraphRunner


@dataclass
class _Step:
    """One launched decode step and where its greedy tokens land."""

    slots: list[int]
    positions: list[int]
    tokens: list[int] | None  # its input tokens, once known on the host
    device_tokens: torch.Tensor  # [rows] argmax on the device
    host_tokens: torch.Tensor  # [rows] pinned copy of them
    done: torch.cuda.Event


class GreedyLookahead:
    """Runs greedy one-token steps through ``graphs`` with one step in flight."""

    def __init__(self, graphs: CudaGraphRunner) -> None:
        self.graphs = graphs
        self.ahead: _Step | None = None

    def drop(self) -> None:
        """Forget the step in flight (anything else touching the cache calls this first)."""
        self.ahead = None

    @torch.inference_mode()
    def decode(
        self, tokens: list[int], positions: list[int], slots: list[int], ahead: bool = True
    ) -> list[int]:
        """Greedy next tokens of rows at ``positions`` whose last tokens are ``tokens``; with
        ``ahead`` the next step is launched before this one is read."""
        step, self.ahead = self.ahead, None
        if step is None or (step.slots, step.positions, step.tokens) != (slots, positions, tokens):
            step = self._launch(tokens, positions, slots)
        if ahead and all(p + 1 < self.graphs.max_seq for p in positions):
            self.ahead = self._launch(step.device_tokens, [p + 1 for p in positions], slots)
        step.done.synchronize()
        out = step.host_tokens.tolist()
        if self.ahead is not None:
            self.ahead.tokens = out
        return out

    def _launch(
        self, tokens: list[int] | torch.Tensor, positions: list[int], slots: list[int]
    ) -> _Step:
        logits, _ = self.graphs.launch_decode(tokens, positions, slots)
        device_tokens = logits[:, -1].argmax(dim=-1)  # [rows], as the sampler's greedy rows
        host_tokens = torch.empty(len(positions), dtype=torch.long, pin_memory=logits.is_cuda)
        host_tokens.copy_(device_tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        known = tokens if isinstance(tokens, list) else None
        return _Step(slots, positions, known, device_tokens, host_tokens, done)
