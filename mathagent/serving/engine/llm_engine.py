"""The embedded engine's public API: add requests, step, abort, and blocking ``generate``.

A step is a short pipeline: schedule (pick prefill or decode rows) -> run (one forward and
sampling in the model runner) -> postprocess (append tokens, detokenise, stop, free slots).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch

from mathagent.serving.engine.config import EngineConfig, EngineConfigError
from mathagent.serving.engine.detokenizer import Detokenizer
from mathagent.serving.engine.loader import LoadedModel, load_model
from mathagent.serving.engine.model_runner import ModelRunner
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.scheduler import ScheduledBatch, Scheduler
from mathagent.serving.engine.sequence import RequestMetrics, RequestOutput, Sequence
from mathagent.serving.engine.spec_config import SpecMethodError, embedded_method
from mathagent.serving.engine.spec_decode.registry import Proposers
from mathagent.serving.engine.spec_decode.speculator import Speculator
from mathagent.serving.engine.stand_in_tokenizer import load_tokenizer


class PromptError(ValueError):
    """A prompt the engine cannot take (empty, too long, or text without a tokenizer)."""


@dataclass
class GenerationResult:
    """A finished request, as returned by :meth:`LLMEngine.generate`."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics


class LLMEngine:
    """Continuous-batching text generation over one model on one device."""

    def __init__(self, config: EngineConfig, model_dir: Path, loaded: LoadedModel | None = None):
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.config = config
        if loaded is None:
            if config.model is None:
                raise EngineConfigError("no model named: give a model spec or a loaded model")
            loaded = load_model(config.model, model_dir, config.device, config.dtype,
                                config.quantization, config.fp8_activation_scales,
                                config.fp8_head)  # fmt: skip
        if config.tokenizer is not None:
            loaded.tokenizer = load_tokenizer(config.tokenizer, model_dir)
        self.loaded = loaded
        self.tokenizer = self.loaded.tokenizer
        self.model_name = self.loaded.name
        self.max_seq_len = config.max_seq_len
        self.runner = ModelRunner(self.loaded.model, config)
        self.scheduler = Scheduler(config.max_batch_size, config.prefix_caching)
        self.speculator = Speculator(
            self.runner,
            Proposers(self.runner, config.draft_beams, model_dir),
            embedded_method(config.speculative),
            config.draft_len,
            config.draft_beams,
            config.adaptive_draft,
        )
        try:  # a drafter that cannot load is a startup error, not a failed step later
            self.speculator.proposer(self.speculator.default)
        except SpecMethodError as exc:
            raise EngineConfigError(str(exc)) from exc
        self._seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of ``prompt`` (ids pass through); checked against the context limit."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError(f"{self.model_name} has no tokenizer: send token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            ids = list(prompt)
        if not ids:
            raise PromptError("the prompt is empty")
        vocab = self.loaded.model.args.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise PromptError(f"prompt token ids must lie in [0, {vocab})")
        if len(ids) >= self.max_seq_len:
            raise PromptError(
                f"the prompt has {len(ids)} tokens but the context is {self.max_seq_len} tokens "
                f"(prompt + generated); send at most {self.max_seq_len - 1} prompt tokens"
            )
        return ids

    def make_sequence(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> Sequence:
        """Validate and tokenise a request without queueing it (safe from any thread)."""
        ids = self.encode(prompt)
        if params.speculative is not None:  # load (once) now: a bad drafter is the request's error
            self.speculator.proposer(embedded_method(params.speculative))
        detok = Detokenizer(
            self.tokenizer,
            params.stop,
            params.include_stop_str_in_output,
            params.skip_special_tokens,
        )
        rid = request_id or f"req-{next(self._ids)}"
        seq = Sequence(rid, ids, params, detok, self.loaded.eos_token_ids)
        return seq

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence built by :meth:`make_sequence`."""
        if seq.request_id in self._seqs:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        """Queue a request; return its id."""
        seq = self.make_sequence(prompt, params, request_id)
        self.add_sequence(seq)
        return seq.request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its slot; None when it is unknown or already done."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq)
        return seq.finish("abort")

    def sequence(self, request_id: str) -> Sequence | None:
        """The running or waiting sequence of a request; None once it finished or is unknown."""
        return self._seqs.get(request_id)

    def has_unfinished(self) -> bool:
        """True while any request waits or runs."""
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return an output for every request it advanced."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        for seq in batch.seqs:
            if seq.prefix_source is not None and seq.slot is not None:
                source, length = seq.prefix_source  # a running slot holds this prompt's prefix
                self.runner.cache.copy_prefix(source, seq.slot, length)
                self.speculator.proposers.copied_prefix(source, seq.slot, length)
                seq.prefix_source = None
        tokens = self._run(batch)
        return self._postprocess(batch, tokens)

    def _run(self, batch: ScheduledBatch) -> list[list[int] | None]:
        if batch.kind == "prefill":
            seq = batch.seqs[0]
            token = self.runner.prefill(seq)
            if token is None:
                return [None]
            self.speculator.prefilled(seq, self.runner.last_hidden)
            return [[token]]
        if self._speculating(batch.seqs):  # the speculator picks the draft length, 0 = plain
            return self.speculator.run(batch.seqs, self.runner.decode)
        return [[t] for t in self.runner.decode(batch.seqs)]

    def _speculating(self, seqs: list[Sequence]) -> bool:
        """Whether this decode step drafts (the engine's method, or any request's own)."""
        return any(self.speculator.method_of(s).kind != "none" for s in seqs)

    def _postprocess(
        self, batch: ScheduledBatch, tokens: list[list[int] | None]
    ) -> list[RequestOutput]:
        outputs = []
        for seq, new in zip(batch.seqs, tokens, strict=True):
            if new is None:
                continue  # a prefill chunk that did not reach the prompt's end
            out = seq.append(new, self.max_seq_len)
            if out.finished:
                self.scheduler.finish(seq)
                self._seqs.pop(seq.request_id, None)
            outputs.append(out)
        return outputs

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[GenerationResult]:
        """Run ``prompts`` to completion, batched; results in prompt order.

        Every prompt is checked before any is queued, and an error mid-run aborts this call's
        requests: either way the engine is left with nothing of this call (a request left
        queued would surface, unknown, in the next call's outputs)."""
        per = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.make_sequence(p, sp) for p, sp in zip(prompts, per, strict=True)]
        ids = [seq.request_id for seq in seqs]
        texts = {i: "" for i in ids}
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        done: dict[str, RequestOutput] = {}
        try:
            for seq in seqs:
                self.add_sequence(seq)
            while len(done) < len(ids):
                for out in self.step():
                    texts[out.request_id] += out.delta_text
                    tokens[out.request_id] += out.delta_token_ids
                    if out.finished:
                        done[out.request_id] = out
        except BaseException:
            for i in ids:
                self.abort(i)
            raise
        return [
            GenerationResult(i, texts[i], tokens[i], done[i].finish_reason, done[i].metrics)
            for i in ids
        ]
