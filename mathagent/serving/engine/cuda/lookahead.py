"""Decode with the next step already on the GPU while the host handles this one.

A batch-1 decode step on the CUDA path is a few milliseconds of GPU work plus ~0.1 ms of host
work (scheduling, detokenising, stop checks) during which the GPU would sit idle. The next
step's inputs are known on the device as soon as this step's tokens are: the argmax for greedy
rows, and for sampled rows the warped law sampled at a uniform the row's generator drew on the
host when the step was launched (one draw a step, as the host sampler takes). So the next step
is launched from them before the host reads this step's tokens, and used when the engine asks
for exactly that step (same slots, positions and tokens); otherwise it is dropped. A dropped
step only wrote K/V at positions the real step rewrites, or in freed slots; a dropped sampled
step has used its rows' draws, so a seeded request's tokens follow the same law but may differ
from a run that never launched ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda.graphs import CudaGraphRunner
from mathagent.serving.engine.sampler import Sampler, SamplingBatch


@dataclass
class _Step:
    """One launched decode step and where its tokens land."""

    slots: list[int]
    positions: list[int]
    tokens: list[int] | None  # its input tokens, once known on the host
    device_tokens: torch.Tensor  # [rows] on the device
    host_tokens: torch.Tensor  # [rows] pinned copy of them
    done: torch.cuda.Event


class DecodeLookahead:
    """Runs one-token steps through ``graphs`` with one step in flight."""

    def __init__(
        self, graphs: CudaGraphRunner,
        launched: Callable[[list[int], list[int]], None] | None = None,
    ) -> None:  # fmt: skip
        self.graphs = graphs
        # runs right after each replay, before the next one can overwrite the graph's buffers:
        # the runner feeds the kept streams to its feature sinks there (device work, no sync)
        self.launched = launched
        self.ahead: _Step | None = None
        self.claimed = 0  # steps launched ahead and then used (tests and benchmarks read it)

    def drop(self) -> None:
        """Forget the step in flight (anything else touching the cache calls this first)."""
        self.ahead = None

    @torch.inference_mode()
    def decode(
        self, tokens: list[int], positions: list[int], slots: list[int], ahead: bool = True,
        sampling: SamplingBatch | None = None,
    ) -> list[int]:  # fmt: skip
        """Next tokens of rows at ``positions`` whose last tokens are ``tokens`` (greedy, or
        as ``sampling`` says); with ``ahead`` the next step is launched before this one is
        read."""
        step, self.ahead = self.ahead, None
        if step is None or (step.slots, step.positions, step.tokens) != (slots, positions, tokens):
            step = self._launch(tokens, positions, slots, sampling)
        else:
            self.claimed += 1
        if ahead and all(p + 1 < self.graphs.max_seq for p in positions):
            nxt = [p + 1 for p in positions]
            self.ahead = self._launch(step.device_tokens, nxt, slots, sampling)
        step.done.synchronize()
        out = step.host_tokens.tolist()
        if self.ahead is not None:
            self.ahead.tokens = out
        return out

    def _launch(
        self, tokens: list[int] | torch.Tensor, positions: list[int], slots: list[int],
        sampling: SamplingBatch | None,
    ) -> _Step:  # fmt: skip
        logits, _ = self.graphs.launch_decode(tokens, positions, slots)
        if self.launched is not None:
            self.launched(slots, positions)
        last = logits[:, -1]
        device_tokens = last.argmax(dim=-1)  # [rows], as the sampler's greedy rows
        if sampling is not None and not sampling.all_greedy:
            u = Sampler.draw(sampling.generators).pin_memory().to(last.device, non_blocking=True)
            device_tokens = Sampler.sample(last, sampling, u, device_tokens)
        host_tokens = torch.empty(len(positions), dtype=torch.long, pin_memory=logits.is_cuda)
        host_tokens.copy_(device_tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        known = tokens if isinstance(tokens, list) else None
        return _Step(slots, positions, known, device_tokens, host_tokens, done)
