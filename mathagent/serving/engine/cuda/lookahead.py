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

A step is one captured graph per batch bucket, warp and feature sinks: the model's
one-token forward, then the *tail* (feeding the kept streams to the sinks, EAGLE-3's features;
the argmax and the sampling; run eagerly its ~20 small launches were host time the step did not
hide, GPU_NOTES run 66), then :func:`~mathagent.serving.engine.cuda.decode_advance.advance`,
which stores the tokens in pinned host memory and writes them, one position on, into the graph's
own inputs. A step launched ahead is then one replay with nothing copied either way (run 157
measured 21.5 us of copies and switching between two steps before). Two captures of each step
are replayed in turn, each storing into its own host row, so one step's tokens stay readable
while the next runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda import decode_advance
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
class _StepGraphs:
    """The captured decode steps of one bucket, warp and sink count: two of the same work on
    the runner's inputs, each storing its tokens into its own row of ``host``."""

    source: tuple  # the runner's one-token entry whose inputs they read (recaptured if new)
    graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]
    table: torch.Tensor  # [bucket, 4] float64: temperature, top-p, top-k, uniform per row
    host: torch.Tensor  # [2, bucket] pinned: the tokens of each graph's latest replay
    sampled: bool  # whether the tail samples (a table each step) or takes the argmax
    turn: int = 0  # the graph the next replay runs


@dataclass
class _Step:
    """One launched decode step and where its tokens land."""

    slots: list[int]
    positions: list[int]
    tokens: list[int] | None  # its input tokens, once known on the host
    graphs: _StepGraphs  # a step launched ahead of it replays the other of them
    host_tokens: torch.Tensor  # [rows], a view of ``graphs.host``
    done: torch.cuda.Event


class DecodeLookahead:
    """Runs one-token steps through ``graphs`` with one step in flight."""

    def __init__(self, graphs: CudaGraphRunner, sinks: list[Sink] | None = None) -> None:
        self.graphs = graphs
        self.sinks = sinks if sinks is not None else []  # the runner's own list: may grow
        self.ahead: _Step | None = None
        self.claimed = 0  # steps launched ahead and then used (tests and benchmarks read it)
        self._steps: dict[tuple[int, Cuts | None, int], _StepGraphs] = {}  # (bucket, cuts, sinks)
        # the feature sinks run on a branch of the step's graph: a plain step of a model with an
        # EAGLE-3 head cost 2% more than without one while they ran in line (GPU_NOTES run 72)
        self._side = torch.cuda.Stream(device=graphs.forward.cos.device)

    def drop(self) -> None:
        """Forget the step in flight. Anything else touching the cache or the runner's graph
        inputs calls this first: a step launched ahead replays on the inputs the step before
        it left."""
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
            steps = self._step_graphs(self.graphs.bucket(len(positions)), Cuts.of_rows(sampling))
            self.graphs.write_decode(tokens, positions, slots)
            step = self._replay(steps, tokens, positions, slots, sampling)
        else:
            self.claimed += 1
        if ahead and all(p + 1 < self.graphs.max_seq for p in positions):
            # the replay just enqueued left the graphs' inputs at exactly this step
            nxt = [p + 1 for p in positions]
            self.ahead = self._replay(step.graphs, None, nxt, slots, sampling)
        step.done.synchronize()
        out = step.host_tokens.tolist()
        if self.ahead is not None:
            self.ahead.tokens = out
        return out

    def _replay(
        self, steps: _StepGraphs, tokens: list[int] | None, positions: list[int],
        slots: list[int], sampling: list[RowSampling] | None,
    ) -> _Step:  # fmt: skip
        """Enqueue the next of ``steps`` on the inputs its graphs read now."""
        rows = len(positions)
        if steps.sampled:
            table = torch.zeros(steps.table.shape, dtype=torch.float64)  # padded rows: greedy
            table[:rows] = Sampler.table(sampling or [], rows)
            steps.table.copy_(table.pin_memory(), non_blocking=True)
        turn, steps.turn = steps.turn, 1 - steps.turn
        steps.graphs[turn].replay()
        done = torch.cuda.Event()
        done.record()
        return _Step(slots, positions, tokens, steps, steps.host[turn, :rows], done)

    def _step_graphs(self, bucket: int, cuts: Cuts | None) -> _StepGraphs:
        """The steps of ``bucket`` rows, captured now if new (or if the runner captured its
        one-token graph again: an EAGLE-3 head's kept layers)."""
        key = (bucket, cuts, len(self.sinks))
        _, source = self.graphs.decode_entry(bucket)
        steps = self._steps.get(key)
        if steps is None or steps.source is not source:
            # steps around graphs the runner dropped (its kept layers changed) hold two captured
            # forwards each: let them go
            live = {id(entry) for entry in self.graphs.graphs.values()}
            self._steps = {k: v for k, v in self._steps.items() if id(v.source) in live}
            steps = self._capture(source, bucket, cuts)
            self._steps[key] = steps
        return steps

    def _capture(self, source: tuple, bucket: int, cuts: Cuts | None) -> _StepGraphs:
        inp = source[1]
        device = inp.packed.device
        table = torch.zeros(bucket, 4, dtype=torch.float64, device=device)
        host = torch.zeros(2, bucket, dtype=torch.long).pin_memory()
        staging = torch.zeros(bucket, dtype=torch.long, device=device)
        sinks, side, forward = list(self.sinks), self._side, self.graphs.forward
        scratch = self.graphs.scratch_slot
        # the warm-up runs write K/V and advance: every row in the scratch slot at position 0
        # (the advance leaves scratch rows as they are); write_decode fills them before use
        for field in (inp.slots, inp.write_slot):
            field.fill_(scratch)
        for field in (inp.positions, inp.write, inp.start):
            field.zero_()
        self.graphs.padded.pop((bucket, 1), None)

        def body(row: torch.Tensor) -> torch.Tensor:
            logits, _, captured = forward(inp)
            main = torch.cuda.current_stream()
            if sinks:  # beside the argmax and sampling: nothing this step reads waits for them
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    for sink in sinks:  # padded rows write to the scratch slot
                        sink(inp.slots, inp.write, captured)
            last = logits[:, -1]
            tokens = greedy_tokens(last)  # as the sampler's greedy rows
            if cuts is not None:
                batch = SamplingBatch.of_table(table, cuts)
                tokens = Sampler.sample(last, batch, table[:, 3], tokens)
            if sinks:
                main.wait_stream(side)  # the sinks read the write positions advance moves
            decode_advance.advance(tokens, inp.packed, scratch, row, staging)
            return tokens

        pair = tuple(self.graphs.capture_body(lambda row=row: body(row))[0] for row in host)
        return _StepGraphs(source, pair, table, host, cuts is not None)
