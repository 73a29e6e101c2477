"""Decode with the next step already on the GPU while the host handles this one.

A batch-1 decode step on the CUDA path is a fraction of a millisecond of GPU work plus host
work (scheduling, detokenising, stop checks) during which the GPU would sit idle. The next
step's inputs are known on the device as soon as this step's tokens are: the argmax for greedy
rows, and for sampled rows the warped law sampled at a uniform the row's generator drew on the
host when the step was launched (one draw a step, as the host sampler takes). So the next step
is launched from them before the host reads this step's tokens, and used when the engine asks
for exactly that step (same slots, positions and tokens); otherwise it is dropped. A dropped
step only wrote K/V at positions the real step rewrites, or in freed slots; a dropped sampled
step has used its rows' draws, so a seeded request's tokens follow the same law but may differ
from a run that never launched ahead.

What follows the model's graph is a graph too (the *tail*, one per batch bucket, warp and
feature sinks): feeding the kept streams to the sinks (EAGLE-3's features), the argmax and
the sampling. Run eagerly, its ~20 small launches were host time the step did not hide: at T
0.7 the default model decoded 1115 tok/s against 1623 greedy (benchmarks/GPU_NOTES.md run 66).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda.graphs import CudaGraphRunner
from mathagent.serving.engine.sampler import (
    Cuts,
    RowSampling,
    Sampler,
    SamplingBatch,
    greedy_tokens,
)

# A feature sink: (slots [B], write positions [B, T], kept streams [B, T, n*H]), device work.
Sink = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class _Step:
    """One launched decode step and where its tokens land."""

    slots: list[int]
    positions: list[int]
    tokens: list[int] | None  # its input tokens, once known on the host
    device_tokens: torch.Tensor  # [rows] on the device
    host_tokens: torch.Tensor  # [rows] pinned copy of them
    done: torch.cuda.Event


@dataclass
class _Tail:
    """The captured work after one decode graph: its source, inputs and output."""

    source: tuple  # the decode graph's entry it reads (recaptured if the runner's changed)
    graph: torch.cuda.CUDAGraph
    table: torch.Tensor  # [bucket, 4] float64: temperature, top-p, top-k, uniform per row
    tokens: torch.Tensor  # [bucket]


class DecodeLookahead:
    """Runs one-token steps through ``graphs`` with one step in flight."""

    def __init__(self, graphs: CudaGraphRunner, sinks: list[Sink] | None = None) -> None:
        self.graphs = graphs
        self.sinks = sinks if sinks is not None else []  # the runner's own list: may grow
        self.ahead: _Step | None = None
        self.claimed = 0  # steps launched ahead and then used (tests and benchmarks read it)
        self._tails: dict[tuple[int, Cuts | None, int], _Tail] = {}  # (bucket, cuts, sinks)
        # the feature sinks run on a branch of the tail's graph: a plain step of a model with an
        # EAGLE-3 head cost 2% more than without one while they ran in line (GPU_NOTES run 72)
        self._side = torch.cuda.Stream(device=graphs.forward.cos.device)

    def drop(self) -> None:
        """Forget the step in flight (anything else touching the cache calls this first)."""
        self.ahead = None

    @torch.inference_mode()
    def decode(
        self, tokens: list[int], positions: list[int], slots: list[int], ahead: bool = True,
        sampling: list[RowSampling] | None = None,
    ) -> list[int]:  # fmt: skip
        """Next tokens of rows at ``positions`` whose last tokens are ``tokens``: greedy, or
        per row as ``sampling`` says (its warp and generator; None for a greedy row); with
        ``ahead`` the next step is launched before this one is read."""
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
        sampling: list[RowSampling] | None,
    ) -> _Step:  # fmt: skip
        rows = len(positions)
        bucket = self.graphs.bucket(rows)
        cuts = Cuts.of_rows(sampling)
        self.graphs.launch_decode(tokens, positions, slots)
        tail = self._tail(bucket, cuts)
        if cuts is not None:
            table = torch.zeros(bucket, 4, dtype=torch.float64)  # padded rows: greedy
            table[:rows] = Sampler.table(sampling or [], rows)
            tail.table.copy_(table.pin_memory(), non_blocking=True)
        tail.graph.replay()
        device_tokens = tail.tokens[:rows].clone()  # the next replay overwrites the graph's
        host_tokens = torch.empty(rows, dtype=torch.long, pin_memory=True)
        host_tokens.copy_(device_tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        known = tokens if isinstance(tokens, list) else None
        return _Step(slots, positions, known, device_tokens, host_tokens, done)

    def _tail(self, bucket: int, cuts: Cuts | None) -> _Tail:
        """The tail after the decode graph of ``bucket`` rows, captured now if new (or if the
        runner captured its decode graph again)."""
        key = (bucket, cuts, len(self.sinks))
        source = self.graphs.graphs[(bucket, 1)]
        tail = self._tails.get(key)
        if tail is None or tail.source is not source:
            tail = self._capture(source, bucket, cuts)
            self._tails[key] = tail
        return tail

    def _capture(self, source: tuple, bucket: int, cuts: Cuts | None) -> _Tail:
        _, inp, (logits, _, captured) = source
        table = torch.zeros(bucket, 4, dtype=torch.float64, device=logits.device)
        sinks = list(self.sinks)
        side = self._side

        def body() -> torch.Tensor:
            main = torch.cuda.current_stream()
            if sinks:  # beside the argmax and sampling: nothing this step reads waits for them
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    for sink in sinks:  # padded rows write to the scratch slot
                        sink(inp.slots, inp.write, captured)
            last = logits[:, -1]
            greedy = greedy_tokens(last)  # as the sampler's greedy rows
            if cuts is not None:
                batch = SamplingBatch.of_table(table, cuts)
                greedy = Sampler.sample(last, batch, table[:, 3], greedy)
            if sinks:
                main.wait_stream(side)  # the graph ends with its branch joined
            return greedy

        graph, tokens = self.graphs.capture_body(body)
        return _Tail(source, graph, table, tokens)
