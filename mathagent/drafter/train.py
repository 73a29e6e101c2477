"""Train a ReDrafter head on a frozen base model (teacher-forced hidden states).

The base runs once over every training sequence (:class:`~mathagent.drafter.base.FrozenBase`, on
its own runner and device); its final hidden
states and greedy predictions become a flat table of positions, and the drafter trains on
random minibatches of positions, so the base's cost is paid once and a step is a few large
matmuls. The loss at position t sums cross-entropy over the next ``draft_len`` tokens
(t + 2 ... t + 1 + draft_len), as in apple/ml-recurrent-drafter, optionally mixed with the KL
to the base's whole distribution (``kd_weight``, see ``mathagent.drafter.loss``); held-out sequences give
``redrafter{i}_top1`` / ``_top5`` (step i predicts token t + 2 + i with teacher forcing).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mathagent.drafter.data import Example, Positions, build_positions
from mathagent.drafter.loss import draft_loss
from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig

log = logging.getLogger(__name__)

# token-id lists -> per list (final hidden states [T, H], the base's greedy next token [T])
BaseFn = Callable[[list[list[int]]], list[tuple[Tensor, Tensor]]]


@dataclass(frozen=True)
class TrainConfig:
    """Drafter shape and optimisation knobs."""

    draft_len: int = 3
    layers: int = 2
    exit_dim: int | None = None  # None = the base's hidden size, head tied to the base embedding
    epochs: int = 3
    lr: float = 3e-3
    batch_positions: int = 4096
    max_seq_len: int = 1024
    holdout: float = 0.1  # used only when no example is marked held out
    seed: int = 0
    top_k: int = 5
    time_budget_s: float | None = None  # training stops (annealed) when this runs out
    base_batch: int = 1  # sequences per base forward (at most the base runner's KV-cache slots)
    draft_vocab: int = 0  # >0: keep this many most frequent training tokens as draft vocab
    kd_weight: float = 0.0  # share of the loss that is KL to the base's soft distribution


def new_drafter(embedding: Tensor, cfg: TrainConfig) -> Drafter:
    """A drafter shaped for the base; a base-tied head starts as the base's own projection."""
    vocab, hidden = embedding.shape
    tied = cfg.exit_dim is None
    config = DrafterConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        exit_dim=hidden if tied else cfg.exit_dim,
        num_draft_layers=cfg.layers,
        rnn=True,
        lm_head_from_base=tied,
    )
    drafter = Drafter(config)
    if tied:
        head = drafter.lm_head[-1]
        head.weight.data.copy_(embedding)
        head.weight.requires_grad_(False)
        proj = drafter.input_proj
        if proj is not None:  # start by passing the base's hidden state through
            proj.weight.data.zero_()
            proj.weight.data[:, :hidden] = torch.eye(hidden)
            proj.bias.data.zero_()
    return drafter.to(embedding.device)


def step_logits(drafter: Drafter, emb: Tensor, batch: Positions, head: Tensor) -> list[Tensor]:
    """Logits [N, V'] of every draft step for a batch of positions (teacher-forced)."""
    state = torch.zeros_like(batch.hidden)
    out = []
    for i in range(batch.inputs.shape[1]):
        state = drafter.step_state(state, emb[batch.inputs[:, i]])
        out.append(drafter.features(batch.hidden, state) @ head.T)
    return out


@torch.no_grad()
def evaluate(
    drafter: Drafter, emb: Tensor, data: Positions, top_k: int, chunk: int = 4096
) -> dict[str, float]:
    """Held-out top-1 / top-k per draft step over the full vocabulary, and the expected
    acceptance length of a greedy chain (1 + sum over steps of P(all steps so far right))."""
    head = drafter.head_weight()
    k = data.inputs.shape[1]
    hit1, hitk, count = torch.zeros(k), torch.zeros(k), torch.zeros(k)
    chain, full = 0.0, 0
    for s in range(0, data.size, chunk):
        batch = data.slice(s, s + chunk)
        ok = batch.labels >= 0  # [N, K]
        top1 = torch.zeros_like(ok)
        for i, logits in enumerate(step_logits(drafter, emb, batch, head)):
            top = drafter.to_tokens(logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices)
            lab = batch.labels[:, i]
            top1[:, i] = top[:, 0] == lab
            hit1[i] += (top1[:, i] & ok[:, i]).sum().item()
            hitk[i] += ((top == lab[:, None]).any(-1) & ok[:, i]).sum().item()
            count[i] += ok[:, i].sum().item()
        whole = ok.all(-1)  # positions with every step labelled
        chain += top1[whole].long().cumprod(-1).sum().item()
        full += int(whole.sum())
    out = {}
    for i in range(k):
        if count[i]:
            out[f"redrafter{i}_top1"] = round(float(hit1[i] / count[i]), 4)
            out[f"redrafter{i}_top{top_k}"] = round(float(hitk[i] / count[i]), 4)
    if full:
        out["chain_acceptance_length"] = round(1 + chain / full, 4)
    return out


def frequent_tokens(labels: Tensor, size: int) -> Tensor:
    """The ``size`` most frequent token ids among ``labels`` (negative = no label)."""
    ids = labels[labels >= 0].flatten().cpu()
    counts = torch.bincount(ids)
    return counts.argsort(descending=True)[: min(size, int((counts > 0).sum()))]


def train(
    base_fn: BaseFn,
    embedding: Tensor,
    examples: list[Example],
    cfg: TrainConfig,
    out: Path,
    compact: bool = False,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
    teacher_head: Tensor | None = None,
) -> dict[str, float]:
    """Train, evaluate on held-out examples, save the checkpoint; return the final metrics.

    ``teacher_head`` is the base's output projection [V, H] (default: ``embedding``, a tied
    head); it is read only with ``cfg.kd_weight > 0``.
    """
    train_ex, eval_ex = _split(examples, cfg)
    emb = embedding.detach().float()
    t0 = time.perf_counter()
    soft = cfg.kd_weight > 0
    train_pos = build_positions(base_fn, train_ex, cfg.draft_len, cfg.base_batch, teacher=soft)
    eval_pos = build_positions(base_fn, eval_ex, cfg.draft_len, cfg.base_batch)
    secs = round(time.perf_counter() - t0, 1)
    report({"event": "features", "train_sequences": len(train_ex), "eval_sequences": len(eval_ex),
            "train_positions": train_pos.size, "eval_positions": eval_pos.size, "seconds": secs})  # fmt: skip
    head = emb if teacher_head is None else teacher_head.detach().float()
    drafter, steps = fit(emb, train_pos, eval_pos, cfg, report, head)
    if cfg.draft_vocab:
        drafter.set_draft_vocab(frequent_tokens(train_pos.labels, cfg.draft_vocab))
    metrics = evaluate(drafter, emb, eval_pos, cfg.top_k)
    drafter.cpu().save_pretrained(out, compact=compact)
    info = {"train_sequences": len(train_ex), "eval_sequences": len(eval_ex),
            "train_positions": train_pos.size, "eval_positions": eval_pos.size, "steps": steps,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    (out / "train_metrics.json").write_text(json.dumps({**metrics, **info}, indent=2) + "\n")
    return metrics


def _split(examples: list[Example], cfg: TrainConfig) -> tuple[list[Example], list[Example]]:
    """Examples marked held out form the evaluation set; otherwise a random ``holdout`` share."""
    marked = [e for e in examples if e.heldout]
    if marked:
        return [e for e in examples if not e.heldout], marked
    shuffled = list(examples)
    random.Random(cfg.seed).shuffle(shuffled)
    n_eval = max(1, math.ceil(cfg.holdout * len(shuffled))) if len(shuffled) > 1 else 0
    return shuffled[n_eval:], shuffled[:n_eval] or shuffled


def fit(
    emb: Tensor,
    data: Positions,
    eval_data: Positions,
    cfg: TrainConfig,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
    teacher_head: Tensor | None = None,
) -> tuple[Drafter, int]:
    """A new drafter trained on ``data``; returns it and the number of optimiser steps.

    AdamW over random minibatches; warm-up then cosine decay over steps or the time budget.
    The drafter is evaluated after every epoch and ends with the weights of its best epoch
    (held-out ``chain_acceptance_length``): small self-distilled sets overfit late in training.
    """
    torch.manual_seed(cfg.seed)
    drafter = new_drafter(emb, cfg)
    head = drafter.lm_head[-1].weight  # the full softmax: every token competes, as in drafting
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    per_epoch = max(1, math.ceil(data.size / cfg.batch_positions))
    total = cfg.epochs * per_epoch
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    t0, step = time.perf_counter(), 0
    best: tuple[float, dict[str, Tensor]] | None = None
    while step < total:
        order = torch.randperm(data.size, generator=gen).to(data.hidden.device)
        for s in range(0, data.size, cfg.batch_positions):
            spent = time.perf_counter() - t0
            progress = max(step / total, spent / cfg.time_budget_s if cfg.time_budget_s else 0.0)
            if progress >= 1.0:
                break
            for group in opt.param_groups:
                group["lr"] = cfg.lr * _schedule(progress)
            batch = data.take(order[s : s + cfg.batch_positions])
            # bf16 matmuls on CUDA (the vocabulary projection dominates); the loss stays fp32
            with torch.autocast("cuda", torch.bfloat16, enabled=emb.device.type == "cuda"):
                logits = step_logits(drafter, emb, batch, head)
                loss = draft_loss(logits, batch, teacher_head, cfg.kd_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        else:
            metrics = evaluate(drafter, emb, eval_data, cfg.top_k)
            report({"event": "eval", "epoch": math.ceil(step / per_epoch), "step": step,
                    "seconds": round(time.perf_counter() - t0, 1), **metrics})  # fmt: skip
            best = _keep_best(best, drafter, metrics)
            continue
        break
    # a run stopped by the time budget ends mid-epoch: its last weights are a candidate too
    best = _keep_best(best, drafter, evaluate(drafter, emb, eval_data, cfg.top_k))
    drafter.load_state_dict(best[1])
    return drafter, step


def _keep_best(
    best: tuple[float, dict[str, Tensor]] | None, drafter: Drafter, metrics: dict[str, float]
) -> tuple[float, dict[str, Tensor]]:
    """The better of ``best`` and the drafter's current weights, by held-out chain length."""
    score = metrics.get("chain_acceptance_length", 0.0)
    if best is not None and best[0] >= score:
        return best
    return score, {k: v.detach().clone() for k, v in drafter.state_dict().items()}


def _schedule(progress: float) -> float:
    """Learning-rate factor: linear warm-up over the first 5%, then cosine to zero."""
    if progress < 0.05:
        return progress / 0.05
    return 0.5 * (1 + math.cos(math.pi * (progress - 0.05) / 0.95))
