"""Self-distillation: the base model writes the drafter's training text on given prompts.

When the base's original data is unavailable, the drafter learns from the base's own outputs
(the ReDrafter/EAGLE recipe). Every prompt gets one greedy transcript and optionally some
sampled ones (diversity: the drafter also sees contexts greedy decoding never reaches), all
generated together by the engine's continuous batching. Held-out prompts are queued first, so a
time budget never cuts them. Records carry the generated token ids, so training sees exactly
the tokens the base produced (re-encoding text may tokenise differently).
"""

from __future__ import annotations

import gzip
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from mathagent.serving.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillPrompt:
    """One prompt to continue; ``heldout`` transcripts only measure the drafter."""

    prompt: str
    id: str = ""
    heldout: bool = False


@dataclass(frozen=True)
class DistillConfig:
    """How many transcripts per prompt, how long, and when to stop."""

    max_tokens: int = 512
    samples: int = 0  # sampled transcripts per training prompt, besides the greedy one
    temperature: float = 0.7
    seed: int = 0  # sample k of prompt i uses seed + k * len(prompts) + i
    greedy: bool = True  # False: sampled transcripts only (e.g. more data after a greedy run)
    time_budget_s: float | None = None


def open_text(path: Path, mode: str) -> IO[str]:
    """Open a text file, gzipped when its name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return path.open(mode, encoding="utf-8")


def self_distill(
    engine: LLMEngine,
    prompts: list[DistillPrompt],
    out: Path,
    cfg: DistillConfig,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> int:
    """Write the base's continuations of ``prompts`` to ``out`` (JSONL, ``.gz`` allowed).

    Records: ``id``, ``prompt``, ``completion``, ``completion_ids``, ``temperature``,
    ``heldout``. They are written as requests finish; when ``cfg.time_budget_s`` runs out the
    running ones are written as they stand (a prefix of the base's own text is still its own
    text) and the waiting ones are dropped. Returns the number of records written.
    """
    from mathagent.serving.engine.llm_engine import PromptError
    from mathagent.serving.engine.sampling_params import SamplingParams

    jobs = [(p, 0.0, None) for p in prompts if p.heldout and cfg.greedy]
    jobs += [(p, 0.0, None) for p in prompts if not p.heldout and cfg.greedy]
    jobs += [
        (p, cfg.temperature, cfg.seed + k * len(prompts) + i)
        for k in range(cfg.samples)
        for i, p in enumerate(prompts)
        if not p.heldout
    ]
    pending: dict[str, tuple[DistillPrompt, float]] = {}
    for p, temp, seed in jobs:
        params = SamplingParams(max_tokens=cfg.max_tokens, temperature=temp, seed=seed)
        try:
            pending[engine.add_request(p.prompt, params)] = (p, temp)
        except PromptError as exc:  # a prompt longer than the context: skip it, say so
            report({"event": "skip", "id": p.id, "reason": str(exc)})
    ids: dict[str, list[int]] = {rid: [] for rid in pending}
    t0, written, tokens = time.perf_counter(), 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open_text(out, "w") as f:

        def emit(rid: str) -> None:
            nonlocal written, tokens
            p, temp = pending.pop(rid)
            toks = ids.pop(rid)
            if not toks:
                return
            text = engine.tokenizer.decode(toks) if engine.tokenizer is not None else ""
            rec = {"id": p.id, "prompt": p.prompt, "completion": text, "completion_ids": toks,
                   "temperature": temp, "heldout": p.heldout}  # fmt: skip
            f.write(json.dumps(rec) + "\n")
            written, tokens = written + 1, tokens + len(toks)
            if written % 256 == 0:
                secs = round(time.perf_counter() - t0, 1)
                report({"event": "distill", "records": written, "tokens": tokens, "seconds": secs})

        while engine.has_unfinished():
            if cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s:
                for rid in list(pending):
                    engine.abort(rid)
                    emit(rid)
                break
            for res in engine.step():
                ids[res.request_id] += res.delta_token_ids
                if res.finished:
                    emit(res.request_id)
    secs = round(time.perf_counter() - t0, 1)
    report({"event": "distill_done", "records": written, "tokens": tokens, "seconds": secs})
    return written
