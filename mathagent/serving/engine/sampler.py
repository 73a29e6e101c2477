"""Batched token sampling: greedy, temperature, top-k, top-p, seeded per request.

Each request owns a ``torch.Generator``; only the single uniform draw per row uses it, so a
seeded request yields the same tokens whatever else shares its batch. :meth:`Sampler.probs`
is public because speculative verification needs the same warped distribution.

The warp never reads the device to decide what to run: which cuts a batch needs (:class:`Cuts`)
is known on the host from the requests' parameters, so the same code runs eagerly, behind a
decode step already in flight, and inside a captured CUDA graph (where :class:`Cuts` is part of
the graph's key). Both cuts come from one descending order of the logits: a full sort when
some row cuts by top-p, else ``topk`` of the largest top-k asked. A batch of plain temperature
rows sorts nothing (on the H200 the two sorts of a 49152-word vocabulary were 0.4-0.6 ms of a
step, benchmarks/GPU_NOTES.md run 65).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.transfer import to_device


@dataclass(frozen=True)
class Cuts:
    """The cuts a batch's warp runs: how many of the largest logits top-k looks at (at least
    the largest top-k a row asks, rounded up to a power of two; 0: no row cuts by top-k), and
    whether a row asks for top-p. Rows that ask for neither are left whole by them. Captured
    graphs are keyed on it, hence the rounding: requests asking top-k 20, 30 and 40 share one
    graph instead of capturing three."""

    top_k: int = 0
    top_p: bool = False

    @classmethod
    def of(cls, params: list[SamplingParams]) -> Cuts:
        top_k = max((p.top_k for p in params), default=0)
        return cls(
            1 << (top_k - 1).bit_length() if top_k else 0, any(p.top_p < 1.0 for p in params)
        )

    @classmethod
    def of_rows(cls, sampling: list[RowSampling] | None) -> Cuts | None:
        """The warp of a batch's rows: None when every row is greedy (or no list)."""
        params = [s[0] for s in sampling or () if s is not None]
        return cls.of(params) if params else None


# A sampled row's parameters and generator (None: a greedy row).
RowSampling = tuple[SamplingParams, torch.Generator | None] | None


@dataclass
class SamplingBatch:
    """Per-row sampling settings of one step as tensors ``[B]``."""

    temperature: torch.Tensor  # [B] float32, 0 = greedy
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64, 0 = off
    generators: list[torch.Generator | None]  # None for greedy rows
    all_greedy: bool
    cuts: Cuts = field(default_factory=Cuts)

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        device: torch.device,
    ) -> SamplingBatch:
        """Collect the rows' parameters into tensors (copied without waiting on the device,
        so a step already launched keeps running)."""
        temps = [0.0 if p.greedy else p.temperature for p in params]
        return cls(
            temperature=to_device(temps, torch.float32, device),
            top_p=to_device([p.top_p for p in params], torch.float32, device),
            top_k=to_device([p.top_k for p in params], torch.int64, device),
            generators=generators,
            all_greedy=all(t == 0.0 for t in temps),
            cuts=Cuts.of(params),
        )

    @classmethod
    def of_table(cls, table: torch.Tensor, cuts: Cuts) -> SamplingBatch:
        """A batch from a device table of :meth:`Sampler.table` rows (inside a captured graph)."""
        return cls(table[:, 0].float(), table[:, 1].float(), table[:, 2].long(), [], False, cuts)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``; on CUDA by the split kernel (``cuda/argmax.py``: torch's took
    ~11 us over a 49152-wide vocabulary), imported only there, so a CPU engine never loads the
    CUDA path."""
    if logits.is_cuda:
        from mathagent.serving.engine.cuda.argmax import argmax

        return argmax(logits)
    return logits.argmax(-1)


class Sampler:
    """Turns logits ``[B, V]`` into tokens ``[B]``."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        greedy = greedy_tokens(logits)  # [B]
        if batch.all_greedy:
            return greedy
        u = self.draw(batch.generators).to(logits.device)
        return self.sample(logits, batch, u, greedy)

    @classmethod
    def sample(
        cls, logits: torch.Tensor, batch: SamplingBatch, u: torch.Tensor, greedy: torch.Tensor
    ) -> torch.Tensor:
        """Tokens ``[B]``: ``greedy`` where the temperature is 0, else the warped law sampled
        at the uniforms ``u [B]`` (no host sync: runs behind a launched step)."""
        sampled = cls.sample_at(cls.probs(logits, batch), u)
        return torch.where(batch.temperature == 0.0, greedy, sampled)

    @staticmethod
    def probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Probabilities ``[B, V]`` after temperature, top-k and top-p (greedy rows: t=1).

        A token is kept when its logit is at least the row's floor: the k-th largest logit,
        and the last one (in descending order) whose preceding mass is below top_p; ties
        with the floor are kept.
        """
        temp = torch.where(batch.temperature > 0, batch.temperature, 1.0)
        logits = logits.float() / temp[:, None]
        floor = _floor(logits, batch)
        if floor is not None:
            logits = logits.masked_fill(logits < floor, float("-inf"))
        return logits.softmax(dim=-1)

    @staticmethod
    def draw(generators: list[torch.Generator | None]) -> torch.Tensor:
        """One uniform per row from that row's generator (0 for rows without one), on the CPU:
        generators live there so a request's draws do not depend on the device."""
        draws = [
            torch.rand(1, generator=g) if g is not None else torch.zeros(1) for g in generators
        ]
        return torch.cat(draws) if draws else torch.zeros(0)

    @staticmethod
    def table(sampling: list[RowSampling], rows: int) -> torch.Tensor:
        """Per row its temperature, top-p, top-k and a uniform its generator draws now
        (``[rows, 4]`` float64 on the host; greedy rows: temperature 0, no draw)."""
        values = [[0.0, 1.0, 0.0, 0.0] for _ in range(rows)]  # one tensor built at the end
        for i, row in enumerate(sampling[:rows]):
            if row is None or row[0].greedy:
                continue
            params, gen = row
            u = float(torch.rand(1, generator=gen)) if gen is not None else 0.0
            values[i] = [params.temperature, params.top_p, float(params.top_k), u]
        return torch.tensor(values, dtype=torch.float64).reshape(rows, 4)

    @staticmethod
    def sample_at(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF sampling of each row of ``probs [B, V]`` at its uniform ``u [B]``."""
        cdf = probs.cumsum(dim=-1)
        u = u.to(cdf.dtype) * cdf[:, -1]  # normalise away float drift in the total mass
        idx = torch.searchsorted(cdf, u[:, None], right=True).squeeze(1)
        return idx.clamp(max=probs.shape[-1] - 1)

    @classmethod
    def sample_from_probs(
        cls, probs: torch.Tensor, generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        """Inverse-CDF sampling, one uniform draw per row from that row's generator."""
        return cls.sample_at(probs, cls.draw(generators).to(probs.device))


def _floor(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor | None:
    """Each row's smallest kept logit ``[B, 1]`` under its top-k and top-p (-inf: no cut),
    or None when no row of the batch cuts."""
    cuts = batch.cuts
    if not cuts.top_k and not cuts.top_p:
        return None
    vocab = logits.shape[-1]
    if cuts.top_p:
        ordered = logits.sort(dim=-1, descending=True).values
    else:
        ordered = logits.topk(min(cuts.top_k, vocab), dim=-1).values  # sorted, descending
    none = torch.full_like(ordered[:, :1], float("-inf"))
    floor = none
    if cuts.top_k:
        k = batch.top_k.clamp(min=1, max=ordered.shape[-1])
        kth = ordered.gather(1, (k - 1)[:, None])
        floor = torch.where((batch.top_k > 0)[:, None], kth, none)
        ordered = ordered.masked_fill(ordered < floor, float("-inf"))
    if cuts.top_p:
        mass = ordered.softmax(-1)
        before = F.pad(mass.cumsum(-1)[:, :-1], (1, 0))  # mass before each token: rising
        # at least the first token: a graph's warm-up runs on zeros (top_p 0)
        kept = (before < batch.top_p[:, None]).sum(-1, keepdim=True).clamp(min=1)
        last = ordered.gather(1, kept - 1)
        floor = torch.where((batch.top_p < 1.0)[:, None], torch.maximum(floor, last), floor)
    return floor
