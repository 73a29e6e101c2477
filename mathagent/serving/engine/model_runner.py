"""Runs model steps over the KV cache: the one place where compilation would be applied.

:meth:`ModelRunner.forward` is the seam for speculative decoding: it scores ``T >= 1`` tokens
per row at arbitrary positions (a verify step, or a token tree with its own attention mask)
and returns logits and the last hidden states (which ReDrafter drafts from). The CUDA path
(:mod:`mathagent.serving.engine.cuda`) is imported only by a runner that uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mathagent.serving.engine import packed_linear
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.kv_cache import KVCache
from mathagent.serving.engine.model import (
    Block,
    ForwardContext,
    Transformer,
    call_layer,
    rope_table,
)
from mathagent.serving.engine.sampler import Sampler, SamplingBatch
from mathagent.serving.engine.sequence import Sequence
from mathagent.serving.engine.transfer import to_device

if TYPE_CHECKING:
    from mathagent.serving.engine.cuda.graphs import CudaGraphRunner
    from mathagent.serving.engine.cuda.lookahead import DecodeLookahead


class ModelRunner:
    """Owns the model, its KV cache, rope tables and sampler; runs prefill and decode."""

    def __init__(self, model: Transformer, config: EngineConfig) -> None:
        args = model.args
        self.model = model
        self.config = config
        self.device = config.device
        self.max_seq_len = config.max_seq_len
        use_graphs = config.device.type == "cuda" and not config.eager and _cuda_path_available()
        self.cache = KVCache(
            args.num_layers,
            config.max_batch_size + int(use_graphs),  # + the graphs' scratch slot for padded rows
            args.num_kv_heads,
            config.max_seq_len,
            args.head_dim,
            config.dtype,
            config.device,
        )
        cos, sin = rope_table(args, config.max_seq_len)
        self.cos = cos.to(config.device, config.dtype)  # [max_seq, D]
        self.sin = sin.to(config.device, config.dtype)
        self.kv_positions = torch.arange(config.max_seq_len, device=config.device)  # [max_seq]
        self.sampler = Sampler()
        if config.device.type == "cuda":
            # torch 2.11 sends masked bf16 SDPA (prefill, the EAGLE-3 head's catch-up) to cuDNN
            # first, which builds an execution plan per new length: ~0.25 s per prompt length on
            # the H200 (benchmarks/GPU_NOTES.md run 25; FunASR#3704 saw 0.44 s on a B200)
            torch.backends.cuda.enable_cudnn_sdp(False)
        # called after every forward with device tensors (slots [B], write positions [B, T],
        # captured streams): the eager model's ``captured`` or the CUDA graph's kept copy; a
        # decode step's graph calls them too (cuda/lookahead.py)
        self.feature_sinks: list[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]] = []
        # Compilation lives here only, so eager and compiled runs can be compared. On CUDA,
        # decode and verify steps replay CUDA graphs; prefill (many tokens) stays eager.
        self.graphs: CudaGraphRunner | None = None
        self.lookahead: DecodeLookahead | None = None
        if use_graphs:
            from mathagent.serving.engine.cuda.graphs import CudaGraphRunner
            from mathagent.serving.engine.cuda.lookahead import DecodeLookahead

            slots = config.max_batch_size  # the scratch slot is the one past the sequences'
            self.graphs = CudaGraphRunner(model, self.cache, self.cos, self.sin, slots, slots)
            self.lookahead = DecodeLookahead(self.graphs, self.feature_sinks)
            # What the graphs do not take (a prefill, a window wider than their widths) runs
            # the model's blocks; eager, a block is ~45 kernels launched from Python: 13 ms of
            # host time for any prompt length on the default model, against 4.6 ms on the
            # H100 (benchmarks/GPU_NOTES.md, ttft_probe.py). Compiled: opt-in, measured no faster (run 121).
            if config.compiled_prefill:
                model.layer_call = compiled_layer_call()
        if (
            config.pack_weights
            and config.device.type == "cpu"
            and config.dtype == torch.float32
            and packed_linear.available()
        ):
            packed_linear.pack_linears(model)
        compiled = not config.eager and not use_graphs
        self._model = torch.compile(model, dynamic=True) if compiled else model

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: list[int],
        attn_mask: torch.Tensor | None = None,
        write_positions: torch.Tensor | None = None,
        logits_last_only: bool = False,
        hidden_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score ``tokens [B, T]`` at rope ``positions [B, T]`` in cache ``slots``.

        K/V go to ``write_positions`` (default ``positions``). ``attn_mask [B, T, kv_len]``
        (True = attend) overrides the default causal-by-position mask, e.g. for a token tree.
        Returns ``(logits [B, T or 1, V] float32, hidden [B, T or 1, H])``.
        """
        write = positions if write_positions is None else write_positions
        if self.lookahead is not None:
            self.lookahead.drop()  # this step changes what a step in flight would have read
        if (
            self.graphs is not None
            and not hidden_only
            and self.graphs.accepts(*tokens.shape)
            and (
                (attn_mask is None and write_positions is None)
                or self.graphs.fits(positions, write, attn_mask)
            )
        ):
            slot_ids = torch.tensor(slots, device=self.device)
            logits, hidden = self.graphs.run(tokens, positions, slot_ids, write, attn_mask)
            self._feed(slots, write, self.graphs.captured)
            if logits_last_only:
                logits, hidden = logits[:, -1:], hidden[:, -1:]
            return logits, hidden
        kv_len = int(write.max()) + 1 if attn_mask is None else attn_mask.shape[-1]
        mask, causal = self._mask(positions, kv_len, attn_mask)
        ctx = ForwardContext(
            cache=self.cache,
            rows=self.cache.rows(slots, write, kv_len),
            attn_mask=mask,
            is_causal=causal,
            cos=self.cos[positions][:, :, None],  # [B, T, 1, D]
            sin=self.sin[positions][:, :, None],
        )
        hidden = self._model(tokens, ctx)  # [B, T, H]
        self._feed(slots, write, self.model.captured)
        if hidden_only:  # drafter training needs every hidden state and no logits
            return hidden.new_empty(0), hidden
        if logits_last_only:
            hidden = hidden[:, -1:]
        return self.model.logits(hidden), hidden

    @torch.inference_mode()
    def verify(
        self, tokens: torch.Tensor, depths: torch.Tensor, slots: list[int], base: list[int],
        tree: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Score draft nodes ``tokens [B, n]`` of rows whose committed length is ``base``.

        Node ``j`` sits at rope position ``base + depths[j]`` and writes its K/V at ``base + j``
        (consecutive, so the CUDA graphs take it without checking); ``tree [n, n]`` (True =
        attend) is shared by all rows, None for chains (causal). Returns logits [B, n, V] and
        hidden [B, n, H]. Nothing here waits for the device.
        """
        rows, n = tokens.shape
        start = torch.tensor(base, device=self.device)
        write = start[:, None] + torch.arange(n, device=self.device)
        positions = start[:, None] + depths[None]
        if tree is None:  # a chain: causal by position, the plain verify layout
            return self.forward(tokens, positions, slots)
        if self.graphs is not None and self.graphs.accepts(rows, n):
            if self.lookahead is not None:
                self.lookahead.drop()
            slot_ids = torch.tensor(slots, device=self.device)
            out = self.graphs.run(tokens, positions, slot_ids, write, tree=tree)
            self._feed(slots, write, self.graphs.captured)
            return out
        kv_len = max(base) + n
        seen = self.kv_positions[:kv_len] < start[:, None, None]  # [B, 1, kv_len]
        mask = seen.expand(rows, n, kv_len).clone()
        mask.scatter_(2, write[:, None, :].expand(rows, n, n), tree[None].expand(rows, n, n))
        return self.forward(tokens, positions, slots, attn_mask=mask, write_positions=write)

    def _mask(
        self, positions: torch.Tensor, kv_len: int, attn_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, bool]:
        """The additive attention mask ``[B, 1, T, kv_len]``, or None when SDPA needs none.

        Built once per step in the model's dtype, so no layer converts a boolean mask again.
        """
        if attn_mask is not None:
            return self._additive(attn_mask[:, None]), False
        seqlen = positions.shape[1]
        # Common cases without a mask tensor: decode where every row sees its whole cache,
        # and a prefill from position 0 (plain causal).
        if seqlen == 1 and bool((positions == kv_len - 1).all()):
            return None, False
        if seqlen == kv_len and positions.shape[0] == 1:
            return None, True
        return self._additive((self.kv_positions[:kv_len] <= positions[:, :, None])[:, None]), False

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """0 where ``allowed``, -inf elsewhere, in the cache's dtype."""
        mask = torch.zeros(allowed.shape, dtype=self.cache.k.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))

    def prefill(self, seq: Sequence) -> int | None:
        """Cache the next chunk of ``seq``'s prompt; return the first token when it completes."""
        assert seq.slot is not None
        start = seq.num_cached
        end = min(len(seq.prompt_ids), start + self.config.prefill_chunk)
        tokens = torch.tensor([seq.prompt_ids[start:end]], device=self.device)  # [1, T]
        positions = torch.arange(start, end, device=self.device)[None]  # [1, T]
        logits, hidden = self.forward(tokens, positions, [seq.slot], logits_last_only=True)
        self.last_hidden = hidden[0, -1]  # [H] ReDrafter drafts from it
        seq.num_cached = end
        if end < len(seq.prompt_ids):
            return None
        return self.sample(logits[:, -1], [seq])[0]

    def decode(self, seqs: list[Sequence], ahead: bool = True) -> list[int]:
        """One token for each running sequence, in a single batched forward; ``ahead=False``
        launches no next step (the caller's next step is not a plain one)."""
        slots = [s.slot for s in seqs if s.slot is not None]
        if self.graphs is not None and self.graphs.accepts(len(seqs), 1):
            out = self._decode_graphs(seqs, slots, ahead)
            for s in seqs:
                s.num_cached += 1
            return out
        tokens = torch.tensor([[s.last_token] for s in seqs], device=self.device)  # [B, 1]
        positions = torch.tensor([[s.num_cached] for s in seqs], device=self.device)  # [B, 1]
        logits, _ = self.forward(tokens, positions, slots)
        for s in seqs:
            s.num_cached += 1
        return self.sample(logits[:, -1], seqs)

    def _decode_graphs(self, seqs: list[Sequence], slots: list[int], ahead: bool) -> list[int]:
        """Decode through the CUDA graphs from host values, with a step in flight (greedy or
        sampled rows; the feature sinks fed inside the step's graph)."""
        assert self.graphs is not None and self.lookahead is not None
        positions = [s.num_cached for s in seqs]
        tokens = [s.last_token for s in seqs]
        sampling = [None if s.params.greedy else (s.params, s.generator) for s in seqs]
        return self.lookahead.decode(tokens, positions, slots, ahead, sampling)

    def _feed(self, slots: list[int], write: torch.Tensor, captured: torch.Tensor | None) -> None:
        """Hand a forward's kept streams to the feature sinks (EAGLE-3), if any."""
        if captured is None or not self.feature_sinks:
            return
        slot_ids = to_device(slots, torch.long, write.device)
        for sink in self.feature_sinks:
            sink(slot_ids, write, captured)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """Sample one token per row of ``logits [B, V]`` with each sequence's parameters."""
        if all(s.params.greedy for s in seqs):
            return logits.argmax(dim=-1).tolist()
        batch = SamplingBatch.build(
            [s.params for s in seqs], [s.generator for s in seqs], self.device
        )
        with torch.inference_mode():
            return self.sampler(logits, batch).tolist()


def compiled_layer_call() -> Callable[[Block, torch.Tensor, ForwardContext, int], torch.Tensor]:
    """:func:`call_layer` compiled once for every layer and every number of tokens.

    With ``dynamic=True`` the layer index and the lengths are symbolic and the weights, cache
    and mask are inputs, so a new layer or length reuses the graph. It compiles a mask tensor
    and ``is_causal`` (a prefill from position 0) apart, and each for layer 0 (dynamo
    specialises an int argument of 0) and for the rest: four graphs for any depth.
    """
    return torch.compile(call_layer, dynamic=True)


def _cuda_path_available() -> bool:
    """Triton and a CUDA device are there (asked only when a runner would use them)."""
    from mathagent.serving.engine.cuda import kernels

    return kernels.available()
