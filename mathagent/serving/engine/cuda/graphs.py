"""CUDA graphs of the decode/verify step, one per (batch bucket, tokens per row).

A batch-1 decode step of an 8B model is ~300 kernels of a few microseconds each; launched from
Python they cost more than the step's weight reads. Capturing the step once per static shape
and replaying it removes the launch cost (benchmarks/GPU_NOTES.md). Rows are padded up to the
bucket (and tokens per row up to a width bucket); padded rows and columns write their K/V
into a scratch slot no sequence owns, and no real token sees them. Inputs are copied
into the graph's static buffers on the device, so a step never waits on the host.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mathagent.serving.engine.cuda.forward import CudaForward, StepInputs
from mathagent.serving.engine.model import Transformer

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
# Tokens per row a graph takes: decode 1, verify draft_len + 1, a flattened draft tree.
WIDTH_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
MAX_WIDTH = WIDTH_BUCKETS[-1]


class CudaGraphRunner:
    """Replays captured steps of :class:`CudaForward`; captures a shape on first use."""

    def __init__(
        self,
        model: Transformer,
        cache: object,
        cos: torch.Tensor,
        sin: torch.Tensor,
        max_batch: int,
        scratch_slot: int,
    ) -> None:
        # Each (batch, width) shape compiles its own layer region, and every engine of a process
        # (tests, drafters) adds its own: at the limit a fullgraph region fails hard, so the
        # limits sit far above what one engine's buckets x widths can reach.
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), 1024))
        if hasattr(cfg, "accumulated_recompile_limit"):
            cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 8192)
        self.forward = CudaForward(model, cache, cos, sin)
        self.device = cos.device
        self.max_batch = max_batch
        self.scratch_slot = scratch_slot
        self.max_seq = cache.k.shape[3]  # [L, S, Hkv, max_seq, D]
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, StepInputs, tuple]] = {}
        self.causal: dict[tuple[int, int], int] = {}  # shape -> width its tree holds causal
        self.padded: dict[tuple[int, int], tuple[int, int]] = {}  # shape -> rows, width padded
        self.model = model
        self._capture = tuple(model.capture)  # the layers every captured graph keeps
        self.captured: torch.Tensor | None = None  # the latest step's kept streams [B, T, n*H]
        self.captures = 0  # graphs captured so far (here and by drafters): a step that captured
        # one took seconds of compilation, not what its shape costs

    def accepts(self, batch: int, width: int) -> bool:
        """Whether a step of this shape runs here (else the caller runs it eagerly)."""
        return batch <= self.max_batch and width <= MAX_WIDTH

    @staticmethod
    def fits(positions: torch.Tensor, write: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
        """Whether explicit write positions / masks have the layout the graphs assume.

        Each row's K/V must go to consecutive positions, every cached position before them
        must be visible (``attn_mask``), and without a mask the writes must be the rope
        positions (causal by position). One host sync; plain decode and verify skip it.
        """
        ok = (write[:, 1:] - write[:, :-1] == 1).all()
        if attn_mask is None:
            ok &= (write == positions).all()
        else:
            before = torch.arange(attn_mask.shape[-1], device=write.device) < write[:, :1]
            ok &= (attn_mask | ~before[:, None, :]).all()  # [B, T, kv_len]
        return bool(ok)

    def bucket(self, batch: int) -> int:
        """The captured batch size that serves ``batch`` rows."""
        fits = [b for b in BATCH_BUCKETS if b >= batch]
        return min(fits[0], self.max_batch) if fits else self.max_batch

    def capture(self, batch: int, width: int) -> None:
        """Compile, warm up (Triton autotuning included) and capture one step shape."""
        self.captures += 1
        inp = StepInputs.allocate(batch, width, self.device)
        inp.slots.fill_(self.scratch_slot)
        inp.write_slot.fill_(self.scratch_slot)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                self.forward(inp)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode():
            out = self.forward(inp)
        self.graphs[(batch, width)] = (graph, inp, out)

    def capture_body(self, body: Callable[[], object]) -> tuple:
        """Warm ``body`` up twice on a side stream (compilation, Triton autotuning), then capture
        it in this runner's pool; ``(graph, body's outputs)``. For steps built around the
        model's graphs (a chain step, a decode step's tail)."""
        self.captures += 1
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), torch.inference_mode():
            out = body()
        return graph, out

    def _graph(self, key: tuple[int, int]) -> tuple:
        """The graph of ``key``, captured now if new; all graphs are captured again when the
        model's kept layers changed (an EAGLE-3 head loaded after the first captures)."""
        if tuple(self.model.capture) != self._capture:
            self.graphs.clear()
            self.padded.clear()
            self.causal.clear()
            self._capture = tuple(self.model.capture)
        if key not in self.graphs:
            self.capture(*key)
        return self.graphs[key]

    @torch.inference_mode()
    def run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        write_positions: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        tree: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of ``tokens [B, T]``; returns views ``(logits [B, T, V], hidden [B, T, H])``.

        K/V go to ``write_positions``, which must be consecutive per row; ``attn_mask
        [B, T, kv_len]`` (True = attend) may restrict which new tokens see each other, and
        everything before a row's first write position is visible; ``tree [T, T]`` gives the
        new tokens' mask directly, the same for every row. The views stay valid until the
        next step.
        """
        rows, width = tokens.shape
        key = (self.bucket(rows), self.width_bucket(width))
        graph, inp, (logits, hidden, captured) = self._graph(key)
        inp.tokens[:rows, :width].copy_(tokens)
        inp.positions[:rows, :width].copy_(positions)
        inp.slots[:rows].copy_(slots)
        inp.start[:rows].copy_(write_positions[:, 0])
        inp.write[:rows, :width].copy_(write_positions)
        inp.write_slot[:rows, :width].copy_(slots[:, None].expand(rows, width))
        if tree is not None:
            self.causal.pop(key, None)
            inp.tree.zero_()
            inp.tree[:rows, :width, :width] = tree
        else:
            self._set_tree(key, rows, width, attn_mask, write_positions)
        if self.padded.get(key) != (rows, width):
            self._pad(inp, rows, width)
            self.padded[key] = (rows, width)
        graph.replay()
        self.captured = None if captured is None else captured[:rows, :width]
        # Hidden states may be kept across steps (ReDrafter drafts from them): copy them out of
        # the graph's memory; logits (and ``captured``) are read before the next step.
        return logits[:rows, :width], hidden[:rows, :width].clone()

    def decode_entry(self, rows: int) -> tuple[tuple[int, int], tuple]:
        """The key and entry ``(graph, inputs, outputs)`` of the one-token step that serves
        ``rows`` rows (captured now if new); the lookahead captures its steps around them."""
        key = (self.bucket(rows), 1)
        return key, self._graph(key)

    def write_decode(self, tokens: list[int], positions: list[int], slots: list[int]) -> None:
        """Enqueue the copy of a one-token-per-row step's inputs from the host into its graph's
        buffers (one copy of a pinned twin); padded rows go to the scratch slot."""
        rows = len(positions)
        key, (_, inp, _) = self.decode_entry(rows)
        batch, pad = key[0], key[0] - rows
        twin = self._host_twin(inp)
        host = inp.host[twin].numpy()
        scratch, zeros = [self.scratch_slot] * pad, [0] * pad
        # Layout of ``packed``: tokens, positions, write, write_slot, slots, start ([B] each).
        columns = (tokens + zeros, positions + zeros, positions + zeros, slots + scratch,
                   slots + scratch, positions + zeros)  # fmt: skip
        for i, column in enumerate(columns):
            host[i * batch : (i + 1) * batch] = column
        inp.packed.copy_(inp.host[twin], non_blocking=True)
        inp.host_done[twin] = torch.cuda.Event()
        inp.host_done[twin].record()
        self._set_tree(key, rows, 1, None, None)
        self.padded.pop(key, None)

    @staticmethod
    def _host_twin(inp: StepInputs) -> int:
        """A pinned staging buffer whose previous copy to the device has run."""
        twin = 0 if inp.host_done[0] is None or inp.host_done[0].query() else 1
        if inp.host_done[twin] is not None:
            inp.host_done[twin].synchronize()
        return twin

    def width_bucket(self, width: int) -> int:
        """The captured tokens-per-row that serves ``width``."""
        return next(w for w in WIDTH_BUCKETS if w >= width)

    def _pad(self, inp: StepInputs, rows: int, width: int) -> None:
        """Point padded rows and columns at the scratch slot (their outputs are ignored)."""
        inp.slots[rows:].fill_(self.scratch_slot)
        inp.start[rows:].zero_()
        inp.write_slot[rows:].fill_(self.scratch_slot)
        inp.write_slot[:, width:].fill_(self.scratch_slot)
        inp.write[:, width:].copy_(torch.arange(width, inp.write.shape[1], device=self.device))

    def _set_tree(
        self,
        key: tuple[int, int],
        rows: int,
        width: int,
        attn_mask: torch.Tensor | None,
        write_positions: torch.Tensor | None,
    ) -> None:
        """Fill the new tokens' mask: causal by default, else read off ``attn_mask``."""
        tree = self.graphs[key][1].tree
        if attn_mask is None:
            if self.causal.get(key) == width:
                return
            tree.zero_()
            tree[:, :width, :width] = torch.tril(torch.ones_like(tree[0, :width, :width]))
            self.causal[key] = width
            return
        self.causal.pop(key, None)
        assert write_positions is not None
        cols = write_positions[:, None, :].expand(rows, width, width)
        tree.zero_()
        tree[:rows, :width, :width] = attn_mask.gather(2, cols)
