"""Self-distillation: the base writes the drafter's training text, and its training rows, at once.

When the base's original data is unavailable, the drafter learns from the base's own outputs
(the ReDrafter/EAGLE recipe). :class:`BatchDistiller` continues prompts on the frozen base's own
slots: ``LLMEngine`` admits one prompt per step, which is fair to live traffic but makes a fixed
list of short prompts admission-bound (about 15 prompts/s on an H200), so here the slots are
filled in padded batches whenever half of them are free. Every decode step keeps what drafter
training needs of the row it ran: the base's final hidden state at the fed token and its greedy
prediction there. A finished transcript is thus already a set of training rows, identical to
what ``build_positions`` computes over ``prompt + completion_ids[:-1]`` (the base's argmax
after the last token is the one label it lacks), so no second pass over the text is needed.
Tokens are drawn as the engine draws them: the engine's sampler, one generator per job, and a
job stops where the engine's request would. ``train-drafter --self-distill`` and
``scripts/drafter_sweep.py`` both generate through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import Positions, example_rows, length_batches
from mathagent.serving.engine.sampler import Sampler, SamplingBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchJob:
    """One prompt to continue, greedily (temperature 0) or sampled (seeded, when given)."""

    prompt_ids: list[int]
    temperature: float = 0.0
    tag: str = ""
    seed: int | None = None  # None: the distiller's seed + the job's index


@dataclass
class Transcript:
    """A finished job: the base's tokens and its training rows (None when too short)."""

    job: BatchJob
    completion_ids: list[int]  # a final stop token included
    rows: Positions | None
    stopped: bool = False  # the last of ``completion_ids`` is a stop token

    @property
    def output_ids(self) -> list[int]:
        """The completion as the engine returns it: without its stop token."""
        return self.completion_ids[:-1] if self.stopped else self.completion_ids


class BatchDistiller:
    """Runs jobs over the frozen base's KV-cache slots with batched admission."""

    def __init__(
        self,
        base: FrozenBase,
        max_tokens: int,
        draft_len: int = 3,
        teacher: bool = False,
        seed: int = 0,
        prefill_tokens: int = 16384,
        eos_ids: Sequence[int] | None = None,
    ) -> None:
        self.base, self.runner, self.max_tokens = base, base.runner, max_tokens
        self.eos = set(base.loaded.eos_token_ids if eos_ids is None else eos_ids)
        self.k, self.teacher, self.seed = draft_len, teacher, seed
        self.prefill_tokens = prefill_tokens
        slots, hidden, dev = base.slots, base.model.args.hidden_size, self.runner.device
        width = max_tokens + draft_len + 1  # the prompt's last k + 1 positions, then the text
        self.hbuf = torch.zeros(slots, width, hidden, device=dev)  # hidden state per position
        self.pbuf = torch.zeros(slots, width, dtype=torch.long, device=dev)  # argmax there
        self.tbuf = torch.zeros(slots, width, dtype=torch.long, device=dev)  # the tokens
        self.sampler = Sampler()
        self.free = list(range(slots))
        self.live: dict[int, _Row] = {}

    def run(
        self,
        jobs: Sequence[BatchJob],
        time_budget_s: float | None = None,
        report: Callable[[dict], None] = lambda m: log.info("%s", m),
    ) -> list[Transcript]:
        """Continue every job until a stop token, ``max_tokens``, the context or the budget, in
        order of the jobs; at the budget, running jobs end as they stand and waiting ones are
        dropped."""
        waiting = [_Row(job, i, self._generator(job, i)) for i, job in enumerate(jobs)]
        self.done: dict[int, Transcript] = {}
        t0, reported = time.perf_counter(), 0
        while waiting or self.live:
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                for slot in list(self.live):
                    self._finish(slot)
                break
            if waiting and 2 * len(self.free) >= len(self.free) + len(self.live):
                take = min(len(self.free), len(waiting))
                self._admit(waiting[:take])
                waiting = waiting[take:]
            if self.live:
                self._decode()
            if len(self.done) >= reported + 256:
                reported = len(self.done)
                report({"event": "distill", **self._totals(t0)})
        report({"event": "distill_done", **self._totals(t0)})
        return [self.done[i] for i in sorted(self.done)]

    def _totals(self, t0: float) -> dict:
        tokens = sum(len(t.completion_ids) for t in self.done.values())
        return {"records": len(self.done), "tokens": tokens,
                "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip

    def _generator(self, job: BatchJob, index: int) -> torch.Generator | None:
        """A sampled job's own generator (CPU, as the engine's), so batching never changes it."""
        if job.temperature == 0:
            return None
        seed = job.seed if job.seed is not None else self.seed + index
        return torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def _admit(self, rows: list[_Row]) -> None:
        """Prefill jobs into free slots in padded batches; sample each one's first token."""
        lengths = [len(r.job.prompt_ids) for r in rows]
        if max(lengths) >= self.runner.max_seq_len:
            raise ValueError(f"a prompt of {max(lengths)} tokens fills the context")
        dev = self.runner.device
        for group in length_batches(lengths, len(rows), self.prefill_tokens):
            slots = [self.free.pop(0) for _ in group]
            longest = max(lengths[i] for i in group)
            toks = torch.zeros(len(group), longest, dtype=torch.long)
            for r, i in enumerate(group):
                toks[r, : lengths[i]] = torch.tensor(rows[i].job.prompt_ids)
            toks = toks.to(dev)
            pos = torch.arange(longest, device=dev)[None].expand(len(group), -1)
            _, hidden = self.runner.forward(toks, pos, slots, hidden_only=True)  # [B, T, H]
            last = torch.tensor([lengths[i] - 1 for i in group], device=dev)
            logits = self.base.model.logits(hidden[torch.arange(len(group), device=dev), last])
            first = self._sample(logits, [rows[i] for i in group])  # logits [B, V]
            for r, (i, slot) in enumerate(zip(group, slots, strict=True)):
                row, n = rows[i], lengths[i]
                row.ctx, row.prompt_len = min(self.k + 1, n), n
                self.hbuf[slot, : row.ctx] = hidden[r, n - row.ctx : n].float()
                self.tbuf[slot, : row.ctx] = toks[r, n - row.ctx : n]
                self.pbuf[slot, row.ctx - 1] = logits[r].argmax()
                row.text.append(first[r])
                self.live[slot] = row
                if self._ended(row):
                    self._finish(slot)

    @torch.inference_mode()
    def _decode(self) -> None:
        """One token for every live row; its hidden state and argmax go to the row's buffer."""
        slots = sorted(self.live)
        rows = [self.live[s] for s in slots]
        dev = self.runner.device
        toks = torch.tensor([[r.text[-1]] for r in rows], device=dev)  # [B, 1]
        pos = torch.tensor([[r.position] for r in rows], device=dev)  # [B, 1]
        logits, hidden = self.runner.forward(toks, pos, slots)
        logits = logits[:, -1]  # [B, V]
        slot_t = torch.tensor(slots, device=dev)
        col = torch.tensor([r.column for r in rows], device=dev)
        self.hbuf[slot_t, col] = hidden[:, -1].float()
        self.pbuf[slot_t, col] = logits.argmax(-1)
        self.tbuf[slot_t, col] = toks[:, 0]
        for slot, row, tok in zip(slots, rows, self._sample(logits, rows), strict=True):
            row.text.append(tok)
            if self._ended(row):
                self._finish(slot)

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> list[int]:
        """Argmax where the temperature is 0, else a draw from softmax(logits / t)."""
        temps = [r.job.temperature for r in rows]
        batch = SamplingBatch(
            temperature=torch.tensor(temps, dtype=torch.float32, device=logits.device),
            top_p=torch.ones(len(rows), device=logits.device),
            top_k=torch.zeros(len(rows), dtype=torch.long, device=logits.device),
            generators=[r.generator for r in rows],
            all_greedy=all(t == 0 for t in temps),
        )
        return self.sampler(logits, batch).tolist()

    def _ended(self, row: _Row) -> bool:
        """Stopped as the engine stops: a stop token, ``max_tokens``, or the full context."""
        return (
            row.text[-1] in self.eos
            or len(row.text) >= self.max_tokens
            or row.prompt_len + len(row.text) >= self.runner.max_seq_len
        )

    def _finish(self, slot: int) -> None:
        """Free the slot; keep the transcript with the rows of positions ``prompt[-k-1:] +
        text[:-1]`` (all computed)."""
        row = self.live.pop(slot)
        self.free.append(slot)
        self.free.sort()  # low slots first keeps batches contiguous
        n = row.column  # buffered positions
        rows = example_rows(self.hbuf[slot, :n].clone(), self.pbuf[slot, :n].clone(),
                            self.tbuf[slot, :n].clone(), row.ctx, self.k, self.teacher)  # fmt: skip
        self.done[row.index] = Transcript(row.job, row.text, rows, row.text[-1] in self.eos)


@dataclass
class _Row:
    """A job, live once admitted: ``ctx`` prompt positions buffered, then one per token."""

    job: BatchJob
    index: int  # the job's place in the run (results come back in this order)
    generator: torch.Generator | None
    ctx: int = 0
    prompt_len: int = 0
    text: list[int] = field(default_factory=list)

    @property
    def position(self) -> int:
        """Position of the newest token (the next one fed to the base)."""
        return self.prompt_len + len(self.text) - 1

    @property
    def column(self) -> int:
        """Buffer column of the newest token."""
        return self.ctx + len(self.text) - 1
