"""Batched token sampling: greedy, temperature, top-k, top-p, seeded per request.

Each request owns a ``torch.Generator``; only the single uniform draw per row uses it, so a
seeded request yields the same tokens whatever else shares its batch. :meth:`Sampler.probs`
is public because speculative verification needs the same warped distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine.sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling settings of one step as tensors ``[B]``."""

    temperature: torch.Tensor  # [B] float32, 0 = greedy
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64, 0 = off
    generators: list[torch.Generator | None]  # None for greedy rows
    all_greedy: bool

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        device: torch.device,
    ) -> SamplingBatch:
        """Collect the rows' parameters into tensors."""
        temps = [0.0 if p.greedy else p.temperature for p in params]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            generators=generators,
            all_greedy=all(t == 0.0 for t in temps),
        )


class Sampler:
    """Turns logits ``[B, V]`` into tokens ``[B]``."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)  # [B]
        if batch.all_greedy:
            return greedy
        probs = self.probs(logits, batch)  # [B, V]
        sampled = self.sample_from_probs(probs, batch.generators)
        return torch.where(batch.temperature == 0.0, greedy, sampled)

    @staticmethod
    def probs(logits: torch.Tensor, batch: SamplingBatch, static: bool = False) -> torch.Tensor:
        """Probabilities ``[B, V]`` after temperature, top-k and top-p (greedy rows: t=1).

        ``static``: both cuts run whatever the rows ask (a row with top-k 0 or top-p 1 is left
        whole by them), so nothing waits on the device: a captured CUDA graph runs it.
        """
        temp = torch.where(batch.temperature > 0, batch.temperature, 1.0)
        logits = logits.float() / temp[:, None]
        vocab = logits.shape[-1]
        if static or bool((batch.top_k > 0).any()):
            k = torch.where(batch.top_k > 0, batch.top_k, vocab).clamp(max=vocab)
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if static or bool((batch.top_p < 1.0).any()):
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            # Keep a token while the mass before it is below top_p (always keeps the first);
            # a row at top_p 1 keeps everything (its float32 sum may reach 1 before the tail).
            drop_sorted = (cum - sorted_logits.softmax(-1)) >= batch.top_p[:, None]
            drop_sorted &= (batch.top_p < 1.0)[:, None]
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(dim=-1)

    @staticmethod
    def sample_from_probs(
        probs: torch.Tensor, generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        """Inverse-CDF sampling, one uniform draw per row from that row's generator."""
        # Generators live on the CPU so a request's draws do not depend on the device.
        draws = [
            torch.rand(1, generator=g) if g is not None else torch.zeros(1) for g in generators
        ]
        u = torch.cat(draws).to(probs.device)  # [B]
        cdf = probs.cumsum(dim=-1)
        u = u * cdf[:, -1]  # normalise away float drift in the total mass
        idx = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1)
        return idx.clamp(max=probs.shape[-1] - 1)
