"""Train an EAGLE-3 head on a frozen base with the training-time test (SafeAILab/EAGLE).

The training-time test unrolls ``steps`` draft steps over whole sequences: step 0 reads the
base's fused hidden states at every position and attends causally over step 0's keys; step
``s`` reads the head's own output of step ``s - 1`` at the same position (the token input
moves on by one) and attends to step 0's keys up to its position plus the keys steps ``1..s``
wrote there, which is exactly what a drafted chain sees at inference. Step ``s`` at ``t`` is
scored on the base's greedy token ``t + 2 + s`` with weight ``0.8 ** s`` (cross-entropy over the
draft vocabulary; labels outside it are skipped). The draft vocabulary is the ``draft_vocab``
most frequent labels (``0`` or at least the base's vocabulary: all of it; 4096 cannot name 7% of
the default model's agent tokens, rare words it copies from the problem, yet with the whole
vocabulary the same 270 s on the H200 trained a worse head, benchmarks/GPU_NOTES.md run 47); the
vocabulary head is the target's own rows (tied, frozen, left out of
the checkpoint), and the final norm starts from the target's. Held-out metrics: per-step top-1
(teacher-forced tokens, own hidden states) and the expected acceptance length of a greedy chain
of ``eval_len`` tokens (1 + the sum over steps of P(every step so far right)) averaged over
positions, and the engine's own figure: the tokens per step of the greedy walk the engine takes
through a greedy transcript (draft at the root, keep the right prefix plus the target's token,
draft again after it). The position average overstates the walk: the walk spends its steps where
drafts fail and skips through runs where they land (shipped head: 3.08 against 2.51 on GSM8K test
0-19, the walk equal to the engine's live 2.52).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import IGNORE, Example
from mathagent.drafter.eagle3_data import Batch, SeqFeatures, batches, collate, sequence_features
from mathagent.drafter.train import _schedule, _split, frequent_tokens
from mathagent.serving.engine.model import rope_table
from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Config, Eagle3Head
from mathagent.serving.engine.spec_decode.eagle3_loader import default_layers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Eagle3TrainConfig:
    """Head shape and optimisation knobs."""

    steps: int = 6  # draft steps unrolled by the training-time test
    eval_len: int = 5  # chain length of the held-out acceptance figure
    intermediate_size: int = 1024
    draft_vocab: int = 4096  # 0 (or >= the base's vocabulary): all of it
    lr: float = 2e-3
    epochs: int = 4
    batch_tokens: int = 8192
    time_budget_s: float | None = None
    holdout: float = 0.1  # only when no example is marked held out
    seed: int = 0
    max_seq_len: int = 1024  # passed on by the pipeline (the base's context)
    base_batch: int = 1


def new_head(
    base: FrozenBase, cfg: Eagle3TrainConfig, draft_ids: Tensor, layers: tuple[int, ...]
) -> Eagle3Head:
    """A head shaped for the base: fc passing the high layer through, the base's final norm,
    the base's head rows (frozen) over ``draft_ids``."""
    args, model = base.model.args, base.model
    conf = Eagle3Config(
        hidden_size=args.hidden_size, intermediate_size=cfg.intermediate_size,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        vocab_size=args.vocab_size, draft_vocab_size=int(draft_ids.numel()),
        rms_norm_eps=args.rms_norm_eps, rope_theta=args.rope_theta,
        rope_scaling=args.rope_scaling, head_dim=args.head_dim, aux_layer_ids=layers,
        lm_head_from_target=True,
    )  # fmt: skip
    torch.manual_seed(cfg.seed)
    head = Eagle3Head(conf).to(base.runner.device)
    head.set_draft_vocab(draft_ids)
    h = args.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * h :] = torch.eye(h, device=head.fc.weight.device)
        head.norm.weight.copy_(model.norm.weight.float())
        head.lm_head.weight.copy_(model.output.weight.detach().float()[head.target_ids()])
        for lin in (head.midlayer.self_attn.o_proj, head.midlayer.mlp.down_proj):
            lin.weight.mul_(0.1)  # start near the identity on the fused features
    head.lm_head.weight.requires_grad_(False)
    return head


def ttt_logits(
    head: Eagle3Head, emb: Tensor, batch: Batch, steps: int, rope: tuple
) -> list[Tensor]:
    """Draft-vocabulary logits [B, T, V'] of every unrolled step (the training-time test)."""
    cos, sin = rope
    t = batch.tokens.shape[1]
    pos = torch.arange(t, device=batch.tokens.device)
    causal = pos[None, :] <= pos[:, None]  # [T, T]
    mid = head.midlayer
    hidden = head.fc(batch.aux.to(head.fc.weight.dtype))  # [B, T, H]
    keys: list[tuple[Tensor, Tensor]] = []
    out = []
    for s in range(steps):
        c, sn = cos[pos + s][None, :, None], sin[pos + s][None, :, None]
        residual, q, k, v = mid.project(emb[batch.inputs(s)], hidden, c, sn)
        keys.append((k, v))
        hidden = mid.finish(residual, _ttt_attend(q, keys, causal))
        out.append(head.logits(hidden))
    return out


def _ttt_attend(q: Tensor, keys: list[tuple[Tensor, Tensor]], causal: Tensor) -> Tensor:
    """q [B, Hq, T, D] over step 0's keys (causal) and steps 1..s's keys at the same position."""
    rep = q.shape[1] // keys[0][0].shape[1]
    scale = q.shape[-1] ** -0.5
    k0, v0 = (x.repeat_interleave(rep, 1) for x in keys[0])
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    for k, _ in keys[1:]:
        scores.append((q * k.repeat_interleave(rep, 1)).sum(-1, keepdim=True) * scale)
    w = torch.cat(scores, -1).float().softmax(-1).to(q.dtype)  # [B, Hq, T, T + s]
    t = q.shape[2]
    out = w[..., :t] @ v0
    for j, (_, v) in enumerate(keys[1:]):
        out = out + w[..., t + j : t + j + 1] * v.repeat_interleave(rep, 1)
    return out


def draft_labels(head: Eagle3Head, labels: Tensor) -> Tensor:
    """Target-id labels mapped to draft columns; IGNORE outside the draft vocabulary."""
    index = torch.full((head.t2d.numel(),), IGNORE, dtype=torch.long, device=labels.device)
    index[head.target_ids()] = torch.arange(head.d2t.numel(), device=labels.device)
    return torch.where(labels >= 0, index[labels.clamp(min=0)], labels)


def ttt_loss(head: Eagle3Head, logits: list[Tensor], batch: Batch) -> Tensor:
    """Sum over steps of ``0.8 ** s`` times the mean cross-entropy of step ``s``."""
    total = logits[0].new_zeros(())
    for s, lg in enumerate(logits):
        lab = draft_labels(head, batch.labels(s))
        if (lab >= 0).any():
            total = total + 0.8**s * F.cross_entropy(
                lg.flatten(0, 1), lab.flatten(), ignore_index=IGNORE
            )
    return total


@torch.no_grad()
def evaluate(head: Eagle3Head, emb: Tensor, feats: Sequence[SeqFeatures], cfg: Eagle3TrainConfig,
             rope: tuple) -> dict[str, float]:  # fmt: skip
    """Held-out per-step top-1 (of labelled positions) and the greedy chain's expected
    acceptance length at ``cfg.eval_len`` tokens (positions with every step labelled)."""
    k = cfg.eval_len
    hits, counts, chain, whole = torch.zeros(k), torch.zeros(k), 0.0, 0
    walk_tokens = walk_steps = 0
    for idx in batches(feats, cfg.batch_tokens):
        batch = collate(feats, idx, feats[0].aux.dtype)
        logits = ttt_logits(head, emb, batch, k, rope)
        labels = torch.stack([batch.labels(s) for s in range(k)], -1)  # [B, T, K] target ids
        guess = torch.stack([head.target_ids()[lg.argmax(-1)] for lg in logits], -1)
        ok, right = labels >= 0, guess == labels
        hits += (right & ok).sum((0, 1)).cpu().float()
        counts += ok.sum((0, 1)).cpu().float()
        full = ok.all(-1)
        chain += float(right[full].long().cumprod(-1).sum())
        whole += int(full.sum())
        for b, i in enumerate(idx):
            tokens, steps = greedy_walk(right[b], full[b], feats[i].start)
            walk_tokens, walk_steps = walk_tokens + tokens, walk_steps + steps
    out = {
        f"eagle3_step{s}_top1": round(float(hits[s] / counts[s]), 4) for s in range(k) if counts[s]
    }
    if whole:
        out[f"chain_acceptance_length_at_{k}"] = round(1 + chain / whole, 4)
    if walk_steps:
        out[f"walk_acceptance_length_at_{k}"] = round(walk_tokens / walk_steps, 4)
    return out


def greedy_walk(right: Tensor, full: Tensor, start: int) -> tuple[int, int]:
    """Tokens and steps of the engine's greedy chain walk over one transcript: ``right [T, K]``
    says whether step ``s`` drafted at position ``t`` (root ``t + 1``) is the base's token,
    ``full [T]`` where every step is labelled; the first root is the first completion token."""
    hits = right.long().cumprod(-1).sum(-1).tolist()  # drafts a step at t would keep
    ok = full.tolist()
    t, tokens, steps = start - 1, 0, 0
    while 0 <= t < len(ok) and ok[t]:
        tokens, steps = tokens + hits[t] + 1, steps + 1
        t += hits[t] + 1
    return tokens, steps


def train_eagle3(
    base: FrozenBase, examples: list[Example], cfg: Eagle3TrainConfig, out: Path,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> dict[str, float]:  # fmt: skip
    """Features, training, held-out evaluation; saves the head to ``out``; returns metrics."""
    t0 = time.perf_counter()
    train_ex, eval_ex = _split(examples, cfg)  # type: ignore[arg-type]
    dev = base.runner.device
    store = torch.bfloat16 if dev.type == "cuda" else torch.float32
    layers = default_layers(base.model.args.num_layers)
    if not train_ex:
        raise ValueError("no training sequences: every example is held out")
    train_f = sequence_features(base, train_ex, layers, store)
    eval_f = sequence_features(base, eval_ex, layers, store)
    labels = torch.cat([f.preds[f.start :] for f in train_f])
    vocab = base.model.args.vocab_size
    reduced = cfg.draft_vocab in range(1, vocab)
    ids = frequent_tokens(labels, cfg.draft_vocab) if reduced else torch.arange(vocab)
    head = new_head(base, cfg, ids.to(dev), layers)
    emb = base.model.tok_embeddings.weight.detach().float()
    rope = tuple(
        x.to(dev) for x in rope_table(head.config.layer_args(), cfg.max_seq_len + cfg.steps)
    )
    report({"event": "features", "train_sequences": len(train_f), "eval_sequences": len(eval_f),
            "train_tokens": int(sum(f.tokens.numel() for f in train_f)),
            "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
    steps = fit(head, emb, train_f, eval_f, cfg, rope, report)
    metrics = evaluate(head, emb, eval_f, cfg, rope)
    head.cpu().save_pretrained(out)
    info = {"train_sequences": len(train_f), "eval_sequences": len(eval_f), "steps": steps,
            "train_tokens": int(sum(f.tokens.numel() for f in train_f)),
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    (out / "train_metrics.json").write_text(json.dumps({**metrics, **info}, indent=2) + "\n")
    return metrics


def fit(head: Eagle3Head, emb: Tensor, data: Sequence[SeqFeatures], eval_data: Sequence[SeqFeatures],
        cfg: Eagle3TrainConfig, rope: tuple, report: Callable[[dict], None]) -> int:  # fmt: skip
    """AdamW over length-grouped batches, warm-up then cosine over steps or the time budget."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    groups = batches(data, cfg.batch_tokens)
    total = cfg.epochs * len(groups)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0, step, dev = time.perf_counter(), 0, emb.device
    for epoch in range(cfg.epochs):
        for g in torch.randperm(len(groups), generator=gen).tolist():
            spent = time.perf_counter() - t0
            progress = max(step / total, spent / cfg.time_budget_s if cfg.time_budget_s else 0.0)
            if progress >= 1.0:
                return step
            for group in opt.param_groups:
                group["lr"] = cfg.lr * _schedule(progress)
            batch = collate(data, groups[g], data[0].aux.dtype)
            with torch.autocast("cuda", torch.bfloat16, enabled=dev.type == "cuda"):
                loss = ttt_loss(head, ttt_logits(head, emb, batch, cfg.steps, rope), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        if (epoch + 1) % max(1, cfg.epochs // 5):
            continue  # about five held-out evaluations in all
        report({"event": "eval", "epoch": epoch + 1, "step": step, "loss": round(loss.item(), 4),
                "seconds": round(time.perf_counter() - t0, 1),
                **evaluate(head, emb, eval_data, cfg, rope)})  # fmt: skip
    return step
