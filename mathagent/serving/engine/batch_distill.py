"""Self-distillation at batch speed: the base writes drafter training text and its features at once.

``LLMEngine`` admits one prompt per step, which is fair to live traffic but makes a fixed list
of short prompts admission-bound (about 15 prompts/s on an H200). Here the runner's slots are
filled in padded batches whenever half of them are free, and every decode step keeps what drafter
training needs of the row it ran: the base's final hidden state at the fed token and its greedy
prediction there. A finished transcript is thus already a set of training rows, identical to what
``build_positions`` computes over ``prompt + completion[:-1]`` (the base's argmax after the last
token is the one label it lacks), so no second pass over the text is needed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mathagent.serving.engine.drafter_data import Positions, example_rows, length_batches

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchJob:
    """One prompt to continue, greedily (temperature 0) or sampled."""

    prompt_ids: list[int]
    temperature: float = 0.0
    tag: str = ""


@dataclass
class Transcript:
    """A finished job: the base's tokens and its training rows (None when too short)."""

    job: BatchJob
    completion_ids: list[int]
    rows: Positions | None


class BatchDistiller:
    """Runs jobs over the runner's KV-cache slots with batched admission."""

    def __init__(
        self,
        runner: ModelRunner,
        eos_ids: Sequence[int],
        max_tokens: int,
        draft_len: int = 3,
        teacher: bool = False,
        seed: int = 0,
        prefill_tokens: int = 16384,
    ) -> None:
        self.runner, self.eos, self.max_tokens = runner, set(eos_ids), max_tokens
        self.k, self.teacher, self.prefill_tokens = draft_len, teacher, prefill_tokens
        slots, hidden = runner.config.max_batch_size, runner.model.args.hidden_size
        width = max_tokens + draft_len + 1  # the prompt's last k + 1 positions, then the text
        dev = runner.device
        self.hbuf = torch.zeros(slots, width, hidden, device=dev)  # hidden state per position
        self.pbuf = torch.zeros(slots, width, dtype=torch.long, device=dev)  # argmax there
        self.tbuf = torch.zeros(slots, width, dtype=torch.long, device=dev)  # the tokens
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.free = list(range(slots))
        self.live: dict[int, _Row] = {}

    def run(
        self,
        jobs: Sequence[BatchJob],
        time_budget_s: float | None = None,
        report: Callable[[dict], None] = lambda m: log.info("%s", m),
    ) -> list[Transcript]:
        """Continue every job (in order of admission) until EOS, ``max_tokens`` or the budget;
        at the budget, running jobs end as they stand and waiting ones are dropped."""
        waiting, done = list(jobs), []
        t0 = time.perf_counter()
        while waiting or self.live:
            over = time_budget_s is not None and time.perf_counter() - t0 > time_budget_s
            if over:
                waiting = []
                done += [self._finish(s) for s in list(self.live)]
                break
            if waiting and 2 * len(self.free) >= len(self.free) + len(self.live):
                take = min(len(self.free), len(waiting))
                done += self._admit(waiting[:take])
                waiting = waiting[take:]
            if self.live:
                done += self._decode()
        tokens = sum(len(t.completion_ids) for t in done)
        report({"event": "batch_distill_done", "records": len(done), "tokens": tokens,
                "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        return done

    @torch.inference_mode()
    def _admit(self, jobs: list[BatchJob]) -> list[Transcript]:
        """Prefill ``jobs`` into free slots in padded batches; sample each one's first token."""
        lengths = [len(j.prompt_ids) for j in jobs]
        if max(lengths) >= self.runner.max_seq_len:
            raise ValueError(f"a prompt of {max(lengths)} tokens fills the context")
        finished = []
        rows = max(1, len(jobs))
        for group in length_batches(lengths, rows, self.prefill_tokens):
            slots = [self.free.pop(0) for _ in group]
            longest = max(lengths[i] for i in group)
            toks = torch.zeros(len(group), longest, dtype=torch.long)
            for r, i in enumerate(group):
                toks[r, : lengths[i]] = torch.tensor(jobs[i].prompt_ids)
            toks = toks.to(self.runner.device)
            pos = torch.arange(longest, device=self.runner.device)[None].expand(len(group), -1)
            _, hidden = self.runner.forward(toks, pos, slots, hidden_only=True)  # [B, T, H]
            last = torch.tensor([lengths[i] - 1 for i in group], device=self.runner.device)
            pick = torch.arange(len(group), device=self.runner.device)
            logits = self.runner.model.logits(hidden[pick, last])  # [B, V]
            first = self._sample(logits, [jobs[i].temperature for i in group])
            for r, (i, slot) in enumerate(zip(group, slots, strict=True)):
                ctx = min(self.k + 1, lengths[i])
                self.hbuf[slot, :ctx] = hidden[r, lengths[i] - ctx : lengths[i]].float()
                self.tbuf[slot, :ctx] = toks[r, lengths[i] - ctx : lengths[i]]
                self.pbuf[slot, ctx - 1] = logits[r].argmax()
                row = _Row(jobs[i], ctx, lengths[i], [first[r]])
                self.live[slot] = row
                if self._ended(row):
                    finished.append(self._finish(slot))
        return finished

    @torch.inference_mode()
    def _decode(self) -> list[Transcript]:
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
        nxt = self._sample(logits, [r.job.temperature for r in rows])
        finished = []
        for slot, row, tok in zip(slots, rows, nxt, strict=True):
            row.text.append(tok)
            if self._ended(row):
                finished.append(self._finish(slot))
        return finished

    def _sample(self, logits: torch.Tensor, temps: list[float]) -> list[int]:
        """Argmax rows where the temperature is 0, else a draw from softmax(logits / t)."""
        out = logits.argmax(-1)
        if any(t > 0 for t in temps):
            t = torch.tensor(temps, device=logits.device)
            probs = torch.softmax(logits.float() / t.clamp(min=1e-6)[:, None], dim=-1)
            drawn = torch.multinomial(probs, 1, generator=self.gen).squeeze(1)
            out = torch.where(t > 0, drawn, out)
        return out.tolist()

    def _ended(self, row: _Row) -> bool:
        return (
            row.text[-1] in self.eos
            or len(row.text) >= self.max_tokens
            or row.position >= self.runner.max_seq_len
        )

    def _finish(self, slot: int) -> Transcript:
        """Free the slot; the rows of positions ``prompt[-k-1:] + text[:-1]`` (all computed)."""
        row = self.live.pop(slot)
        self.free.append(slot)
        self.free.sort()  # low slots first keeps batches contiguous
        n = row.column  # buffered positions
        rows = example_rows(self.hbuf[slot, :n].clone(), self.pbuf[slot, :n].clone(),
                            self.tbuf[slot, :n].clone(), row.ctx, self.k, self.teacher)  # fmt: skip
        return Transcript(row.job, row.text, rows)


@dataclass
class _Row:
    """A live job: ``ctx`` prompt positions buffered, then one per decoded token."""

    job: BatchJob
    ctx: int
    prompt_len: int
    text: list[int]

    @property
    def position(self) -> int:
        """Position of the newest token (the next one fed to the base)."""
        return self.prompt_len + len(self.text) - 1

    @property
    def column(self) -> int:
        """Buffer column of the newest token."""
        return self.ctx + len(self.text) - 1
