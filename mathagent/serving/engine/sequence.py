"""One request's state inside the engine, its metrics, and what a step reports back."""

from __future__ import annotations

import enum
import secrets
import time
from dataclasses import dataclass, field

import torch

from mathagent.serving.engine.detokenizer import Detokenizer
from mathagent.serving.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timings and counts of one request (speculative decoding adds acceptance here)."""

    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V were reused from another slot's prefix
    generated_tokens: int = 0
    target_forwards: int = 0  # decode/verify passes that produced output tokens for this request
    speculative: dict | None = None  # acceptance counters (SpecStats.as_dict) when drafting

    @property
    def ttft_s(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def decode_s(self) -> float | None:
        """Seconds from the first generated token to the end."""
        if self.first_token is None or self.finished is None:
            return None
        return self.finished - self.first_token

    @property
    def acceptance_length(self) -> float:
        """Generated tokens per target forward (1.0 without speculation)."""
        return self.generated_tokens / self.target_forwards if self.target_forwards else 1.0


@dataclass
class RequestOutput:
    """What one step produced for one request: the new text and tokens, and whether it ended."""

    request_id: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    metrics: RequestMetrics
    # What ended a "stop", as vLLM reports it: the stop string, the stop_token_ids member
    # (an int), or None for the model's own end-of-sequence token.
    stop_reason: int | str | None = None


class Sequence:
    """A request being decoded: its tokens, slot, sampling state and detokeniser."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        detokenizer: Detokenizer,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.detok = detokenizer
        eos = () if params.ignore_eos else eos_token_ids
        self.stop_token_ids = set(eos) | set(params.stop_token_ids)
        self.output_ids: list[int] = []
        self.status = Status.WAITING
        self.slot: int | None = None
        self.num_cached = 0  # tokens whose K/V are in the slot; the next write position
        self.prefix_source: tuple[int, int] | None = None  # (slot, length) to copy K/V from
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.metrics = RequestMetrics(prompt_tokens=len(prompt_ids))
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator()
            seed = params.seed if params.seed is not None else secrets.randbits(63)
            self.generator.manual_seed(seed)
        self._emitted_tokens = 0

    @property
    def all_ids(self) -> list[int]:
        """Prompt and generated ids."""
        return self.prompt_ids + self.output_ids

    @property
    def cached_ids(self) -> list[int]:
        """The tokens whose K/V the slot holds, in position order (a stop or length cut can
        leave accepted drafts cached past the output's end; those are not counted)."""
        return self.all_ids[: self.num_cached]

    @property
    def last_token(self) -> int:
        """The token to feed at the next decode step."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def prefill_done(self) -> bool:
        """True once the whole prompt is in the cache."""
        return self.num_cached >= len(self.prompt_ids)

    def append(self, tokens: list[int], max_seq_len: int) -> RequestOutput:
        """Add generated tokens (one, or several accepted drafts); decide whether to stop."""
        now = time.perf_counter()
        if self.metrics.first_token is None:
            self.metrics.first_token = now
        self.metrics.target_forwards += 1
        kept = len(self.output_ids)
        for tok in tokens:
            self.output_ids.append(tok)
            if tok in self.stop_token_ids:
                self.output_ids.pop()  # the stop token is not part of the output
                self.finish_reason = "stop"
                self.stop_reason = tok if tok in self.params.stop_token_ids else None
                break
            if len(self.output_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
                break
            if len(self.prompt_ids) + len(self.output_ids) >= max_seq_len:
                self.finish_reason = "length"
                break
        if len(self.output_ids) == kept:  # the step gave only a stop token: no output from it
            self.metrics.target_forwards -= 1
        delta_text = self.detok.add(self.output_ids, final=self.finish_reason is not None)
        if self.detok.stopped_by is not None and self.finish_reason != "stop":
            self.finish_reason, self.stop_reason = "stop", self.detok.stopped_by
            delta_text += self.detok.add(self.output_ids, final=True)
        self.metrics.generated_tokens = len(self.output_ids)
        return self._output(delta_text)

    def finish(self, reason: str) -> RequestOutput:
        """Mark finished for ``reason`` (e.g. abort) and report any held-back text."""
        self.finish_reason = self.finish_reason or reason
        return self._output(self.detok.add(self.output_ids, final=True))

    def _output(self, delta_text: str) -> RequestOutput:
        finished = self.finish_reason is not None
        if finished:
            self.status = Status.FINISHED
            self.metrics.finished = self.metrics.finished or time.perf_counter()
        new_ids = self.output_ids[self._emitted_tokens :]
        self._emitted_tokens = len(self.output_ids)
        return RequestOutput(
            self.request_id,
            delta_text,
            new_ids,
            finished,
            self.finish_reason,
            self.metrics,
            self.stop_reason if finished else None,
        )
