"""What ``mathagent train-drafter`` runs: self-distillation (optional), then drafter training.

The CLI parses its options into :class:`TrainDrafterOptions`, resolves the base model into an
``EngineConfig`` and hands over; :func:`train_drafter` loads the base once (on a runner and KV
cache of its own), writes the self-distilled text, trains, saves the checkpoint and returns the
held-out metrics. Problems are rendered into prompts by a callable the caller passes (the CLI
renders the agent's chat prompt; this package knows nothing of the agent).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import load_examples, open_text
from mathagent.drafter.distill import BatchDistiller, BatchJob
from mathagent.drafter.eagle3_train import Eagle3TrainConfig, train_eagle3
from mathagent.drafter.train import TrainConfig, train
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.loader import LoadedModel

log = logging.getLogger(__name__)

# a problem statement and the loaded base -> the prompt the base continues
RenderProblem = Callable[[str, LoadedModel], str]


class TrainDrafterError(ValueError):
    """The job cannot run as asked (no tokenizer, no training data, unrenderable problems)."""


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


@dataclass(frozen=True)
class DistillOptions:
    """``--self-distill``: which prompts to continue, and how."""

    prompts: Path  # JSONL of ``prompt`` or ``problem`` records (``id``; ``heldout: true``)
    skip: int = 0  # records to skip first
    limit: int | None = None  # records to use at most
    config: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True)
class TrainDrafterOptions:
    """What ``train-drafter`` was asked for, apart from the base model and engine settings."""

    data: Path  # the training text (written first when ``distill`` is set)
    out: Path  # the drafter's checkpoint folder
    train: TrainConfig = field(default_factory=TrainConfig)  # max_seq_len, base_batch: engine
    distill: DistillOptions | None = None
    extra_data: tuple[Path, ...] = ()  # more training text, as data
    compact: bool = False  # leave a base-tied vocabulary head out of the checkpoint
    method: str = "redrafter"  # or "eagle3" (trained with ``eagle3``'s knobs)
    eagle3: Eagle3TrainConfig = field(default_factory=Eagle3TrainConfig)


def train_drafter(
    options: TrainDrafterOptions,
    config: EngineConfig,
    model_dir: Path,
    render: RenderProblem | None = None,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> dict[str, float]:
    """Self-distil if asked, train on the data, save the drafter; return the held-out metrics.

    ``config.model`` is the resolved base; ``model_dir`` is where a GGUF base is converted.
    """
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    base = FrozenBase.load(config, model_dir)
    if base.tokenizer is None:
        raise TrainDrafterError(f"{base.loaded.name} has no tokenizer; train-drafter reads text")
    if options.distill is not None:
        prompts = read_prompts(options.distill, base.loaded, render)
        self_distill(base, prompts, options.data, options.distill.config, report)
    paths = [options.data, *options.extra_data]
    for path in paths:
        if not path.is_file():
            raise TrainDrafterError(f"no training data at {path}")
    cfg = replace(options.train, max_seq_len=base.max_seq_len, base_batch=base.slots)
    examples = [ex for path in paths for ex in load_examples(path, base.encode, cfg.max_seq_len)]
    if options.method == "eagle3":
        ecfg = replace(options.eagle3, max_seq_len=base.max_seq_len, base_batch=base.slots)
        return train_eagle3(base, examples, ecfg, options.out, report)
    emb = base.model.tok_embeddings.weight.detach()
    head = base.model.output.weight.detach()
    return train(base.features, emb, examples, cfg, options.out, options.compact, report, head)


def read_prompts(
    options: DistillOptions, loaded: LoadedModel, render: RenderProblem | None
) -> list[DistillPrompt]:
    """The records of ``options.prompts`` (after ``skip``, at most ``limit``) as prompts: a
    ``prompt`` as it stands, a ``problem`` rendered by ``render``."""
    lines = options.prompts.read_text().splitlines()
    records = [json.loads(x) for x in lines if x.strip()][options.skip :][: options.limit]
    prompts = []
    for rec in records:
        ident, heldout = str(rec.get("id", "")), bool(rec.get("heldout", False))
        if "prompt" in rec:
            prompts.append(DistillPrompt(rec["prompt"], ident, heldout))
        elif render is None:
            raise TrainDrafterError(f"{options.prompts}: problem records need a prompt renderer")
        else:
            prompts.append(DistillPrompt(render(rec["problem"], loaded), ident, heldout))
    return prompts


def self_distill(
    base: FrozenBase,
    prompts: list[DistillPrompt],
    out: Path,
    cfg: DistillConfig,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> int:
    """Write the base's continuations of ``prompts`` to ``out`` (JSONL, ``.gz`` allowed).

    Records: ``id``, ``prompt``, ``completion``, ``completion_ids``, ``temperature``,
    ``heldout``, in job order: held-out prompts, the others, then each sampled round. When
    ``cfg.time_budget_s`` runs out the running ones are written as they stand (a prefix of the
    base's own text is still its own text) and the waiting ones are dropped. Returns the number
    of records written.
    """
    encoded = {}
    for i, p in enumerate(prompts):
        ids = base.encode(p.prompt)
        if 0 < len(ids) < base.max_seq_len:
            encoded[i] = ids
        else:  # what the engine refuses too: an empty prompt, or one that fills the context
            reason = f"a prompt of {len(ids)} tokens; the context is {base.max_seq_len}"
            report({"event": "skip", "id": p.id, "reason": reason})
    heldout_first = sorted(encoded, key=lambda i: not prompts[i].heldout)  # a stable sort
    jobs = [BatchJob(encoded[i], 0.0, str(i)) for i in heldout_first if cfg.greedy]
    jobs += [  # a job's tag finds its prompt again
        BatchJob(encoded[i], cfg.temperature, str(i), cfg.seed + k * len(prompts) + i)
        for k in range(cfg.samples)
        for i in encoded
        if not prompts[i].heldout
    ]
    done = BatchDistiller(base, cfg.max_tokens).run(jobs, cfg.time_budget_s, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open_text(out, "w") as f:
        for t in done:
            if not t.output_ids:
                continue
            p = prompts[int(t.job.tag)]
            rec = {"id": p.id, "prompt": p.prompt, "completion": base.tokenizer.decode(t.output_ids),
                   "completion_ids": t.output_ids, "temperature": t.job.temperature,
                   "heldout": p.heldout}  # fmt: skip
            f.write(json.dumps(rec) + "\n")
            written += 1
    return written
