"""Train a ReDrafter head on a frozen base model (teacher-forced hidden states).

The base runs once over every training sequence; its final hidden states are kept (bf16) and
the drafter trains on them for several epochs, so the base's cost is paid once. The loss at
position t sums cross-entropy over the next ``draft_len`` tokens (t + 2 ... t + 1 + draft_len),
as in apple/ml-recurrent-drafter, and held-out sequences give ``redrafter{i}_top1`` / ``_top5``
(step i predicts token t + 2 + i with teacher forcing).
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
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from mathagent.serving.engine.redrafter import Drafter, DrafterConfig

if TYPE_CHECKING:
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)

HiddenFn = Callable[[list[int]], Tensor]  # token ids -> final hidden states [T, H]


@dataclass(frozen=True)
class TrainConfig:
    """Drafter shape and optimisation knobs."""

    draft_len: int = 3
    layers: int = 2
    exit_dim: int | None = None  # None = the base's hidden size, head tied to the base embedding
    epochs: int = 3
    lr: float = 3e-3
    batch_tokens: int = 2048
    max_seq_len: int = 1024
    holdout: float = 0.1
    seed: int = 0
    top_k: int = 5


@dataclass
class Example:
    """One training sequence; ``start`` is the first position whose token is a label."""

    tokens: list[int]
    start: int = 0


def load_examples(path: Path, encode: Callable[[str], list[int]], max_len: int) -> list[Example]:
    """Read JSONL (``text``, or ``prompt`` + ``completion``) or plain text (blank-line blocks).

    With prompt + completion only completion tokens are labels: the drafter learns what the
    base generates, not what users type.
    """
    examples = []
    if path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if "completion" in rec:
                prompt = encode(rec.get("prompt", ""))
                toks = prompt + encode(rec["completion"])
                start = len(prompt)
            else:
                toks, start = encode(rec["text"]), 0
            examples.append(_clip(toks, start, max_len))
    else:
        blocks = [b for b in path.read_text().split("\n\n") if b.strip()]
        examples = [_clip(encode(b), 0, max_len) for b in blocks]
    examples = [e for e in examples if len(e.tokens) - max(e.start, 1) >= 2]
    if not examples:
        raise ValueError(f"{path} holds no usable training text")
    return examples


def _clip(tokens: list[int], start: int, max_len: int) -> Example:
    """Keep at most ``max_len`` tokens, dropping the front of a long prompt first."""
    if len(tokens) <= max_len:
        return Example(tokens, start)
    cut = len(tokens) - max_len
    return Example(tokens[cut:], max(0, start - cut))


@dataclass
class Features:
    """Teacher-forced base outputs for one sequence."""

    hidden: Tensor  # [T, H] bf16 final hidden states
    tokens: Tensor  # [T] int64 the text
    preds: Tensor  # [T] int64 the base's greedy next token at each position
    start: int  # first completion token (held-out metrics read only the completion)
    train_from: int  # first position worth training on (shared prompt prefixes count once)


def collect_features(
    hidden_fn: HiddenFn, embedding: Tensor, examples: list[Example]
) -> list[Features]:
    """Run the frozen base over every example once; keep hidden states and greedy predictions.

    The labels are the base's own predictions (equal to the text where the text is the base's
    greedy output), so prompt text teaches the drafter too: that is where the target stands
    when verification accepts. A prompt prefix shared with an earlier example trains once.
    """
    out: list[Features] = []
    prev: list[int] = []
    for ex in examples:
        with torch.inference_mode():
            h = hidden_fn(ex.tokens)
            preds = torch.cat([(c.float() @ embedding.T).argmax(-1) for c in h.split(256)])
        shared = _common_prefix(prev, ex.tokens)
        prev = ex.tokens
        train_from = min(shared, ex.start) if out else 0
        out.append(
            Features(h.to(torch.bfloat16), torch.tensor(ex.tokens), preds, ex.start, train_from)
        )
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def engine_hidden_fn(runner: ModelRunner, chunk: int = 256) -> HiddenFn:
    """Final hidden states of the engine's model over a token list (slot 0, chunked prefill).

    Consecutive calls that share a prefix reuse its K/V (still in slot 0) and its hidden states,
    so a few-shot prompt common to all examples is computed once.
    """
    last: dict[str, list] = {"tokens": [], "hidden": []}

    def hidden(tokens: list[int]) -> Tensor:
        if len(tokens) > runner.max_seq_len:
            raise ValueError(f"a training sequence of {len(tokens)} tokens exceeds the context")
        # keep at least one token to recompute, so the result is never empty
        reuse = min(_common_prefix(last["tokens"], tokens), len(tokens) - 1)
        parts = [t[:reuse] for t in last["hidden"][:1]] if reuse else []
        for start in range(reuse, len(tokens), chunk):
            piece = tokens[start : start + chunk]
            toks = torch.tensor([piece], device=runner.device)
            pos = torch.arange(start, start + len(piece), device=runner.device)[None]
            _, h = runner.forward(toks, pos, [0], hidden_only=True)
            parts.append(h[0].float().cpu())
        out = torch.cat(parts)
        last["tokens"], last["hidden"] = list(tokens), [out]
        return out

    return hidden


def self_distill(
    engine: LLMEngine,
    prompts: list[str],
    out: Path,
    max_tokens: int,
    time_budget_s: float | None = None,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> int:
    """Write the base model's own greedy continuations of ``prompts`` to ``out`` (JSONL).

    Records (``prompt``, ``completion``) are appended as requests finish, so a run stopped by
    ``time_budget_s`` keeps everything it finished. Returns the number of records written.
    """
    from mathagent.serving.engine.config import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    pending = {engine.add_request(p, params): p for p in prompts}
    texts = dict.fromkeys(pending, "")
    t0, written, tokens = time.perf_counter(), 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        while engine.has_unfinished():
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                # greedy prefixes are still the base's own text: keep the unfinished ones too
                for rid in list(pending):
                    engine.abort(rid)
                    if texts[rid]:
                        f.write(
                            json.dumps({"prompt": pending[rid], "completion": texts[rid]}) + "\n"
                        )
                        written += 1
                break
            for res in engine.step():
                texts[res.request_id] += res.delta_text
                if res.finished:
                    rec = {
                        "prompt": pending.pop(res.request_id),
                        "completion": texts[res.request_id],
                    }
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    written += 1
                    tokens += res.metrics.generated_tokens
                    if written % 32 == 0:
                        secs = time.perf_counter() - t0
                        report(
                            {
                                "event": "distill",
                                "records": written,
                                "tokens": tokens,
                                "seconds": round(secs, 1),
                            }
                        )
    return written


def drafter_loss(
    drafter: Drafter,
    embedding: Tensor,
    feats: Features,
    steps: int,
    top_k: int,
    vocab: Tensor | None = None,
    completion_only: bool = False,
) -> tuple[Tensor, dict[str, tuple[float, int]]]:
    """Loss summed over draft steps, and per-step (correct, count) for top-1 / top-k.

    Step i at position t reads the text up to t + 1 + i and must name the base's greedy token
    after it (``preds[t + 1 + i]``). ``vocab`` [S] (sorted ids) restricts the softmax to the
    tokens the labels use: the vocabulary projection dominates the cost, and tokens never
    used carry no signal. Evaluation passes None (the full vocabulary) and ``completion_only``.
    """
    first_label = feats.start if completion_only else feats.train_from
    # positions before first_label - 2 predict no kept label, and the drafter never looks back
    offset = max(first_label - 2, 0)
    hidden = feats.hidden[offset:].float()[None]
    toks, preds = feats.tokens[offset:], feats.preds[offset:]
    first_label -= offset
    xs = drafter.teacher_forced_features(hidden, embedding[toks][None], steps)
    head = drafter.lm_head[-1].weight
    w = head if vocab is None else head[vocab]
    loss = hidden.new_zeros(())
    stats: dict[str, tuple[float, int]] = {}
    for i, x in enumerate(xs):
        labels = preds[1 + i :]  # label of position t is the base's token at t + 2 + i
        lo = max(first_label - 2 - i, 0)
        x, labels = x[0, lo : labels.numel()], labels[lo:]
        if labels.numel() == 0:
            continue
        logits = x @ w.T
        target = labels if vocab is None else _remap(vocab, labels)
        loss = loss + F.cross_entropy(logits, target)
        top = logits.topk(top_k, dim=-1).indices
        hit1 = (top[:, 0] == target).sum().item()
        hitk = (top == target[:, None]).any(-1).sum().item()
        stats[f"redrafter{i}_top1"] = (hit1, labels.numel())
        stats[f"redrafter{i}_top{top_k}"] = (hitk, labels.numel())
    return loss, stats


def _remap(vocab: Tensor, labels: Tensor) -> Tensor:
    """Token ids -> positions in the sorted ``vocab`` (every label must be in it)."""
    return torch.searchsorted(vocab, labels)


def evaluate(
    drafter: Drafter, embedding: Tensor, feats: list[Features], cfg: TrainConfig
) -> dict[str, float]:
    """Held-out top-1 / top-k accuracy per draft step, over the full vocabulary."""
    totals: dict[str, list[float]] = {}
    with torch.no_grad():
        for f in feats:
            _, stats = drafter_loss(drafter, embedding, f, cfg.draft_len, cfg.top_k, None, True)
            for key, (hit, n) in stats.items():
                acc = totals.setdefault(key, [0.0, 0.0])
                acc[0] += hit
                acc[1] += n
    return {k: round(h / n, 4) for k, (h, n) in sorted(totals.items()) if n}


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
    return drafter


def train(
    hidden_fn: HiddenFn,
    embedding: Tensor,
    examples: list[Example],
    cfg: TrainConfig,
    out: Path,
    report: Callable[[dict], None] = lambda m: log.info("%s", m),
) -> dict[str, float]:
    """Train, evaluate on held-out examples, save the checkpoint; return the final metrics."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    examples = list(examples)
    rng.shuffle(examples)
    n_eval = max(1, math.ceil(cfg.holdout * len(examples))) if len(examples) > 1 else 0
    embedding = embedding.float()
    t0 = time.perf_counter()
    train_feats = collect_features(hidden_fn, embedding, examples[n_eval:])
    eval_feats = collect_features(hidden_fn, embedding, examples[:n_eval]) or train_feats
    report(
        {
            "event": "features",
            "sequences": len(examples),
            "seconds": round(time.perf_counter() - t0, 1),
        }
    )
    vocab = torch.cat([f.preds for f in train_feats]).unique()  # sorted
    drafter = new_drafter(embedding, cfg)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    batches = _batches(train_feats, cfg.batch_tokens)
    total = max(1, cfg.epochs * len(batches))
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=total, pct_start=0.1
    )
    step = 0
    for epoch in range(cfg.epochs):
        rng.shuffle(batches)
        for batch in batches:
            losses = [
                drafter_loss(drafter, embedding, f, cfg.draft_len, 1, vocab)[0] for f in batch
            ]
            loss = torch.stack(losses).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
        metrics = evaluate(drafter, embedding, eval_feats, cfg)
        report({"event": "eval", "epoch": epoch + 1, "step": step, **metrics})
    drafter.save_pretrained(out, compact=False)
    metrics = evaluate(drafter, embedding, eval_feats, cfg)
    (out / "train_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _batches(feats: list[Features], batch_tokens: int) -> list[list[Features]]:
    """Group sequences into batches of about ``batch_tokens`` tokens."""
    batches, cur, size = [], [], 0
    for f in feats:
        cur.append(f)
        size += f.tokens.numel()
        if size >= batch_tokens:
            batches.append(cur)
            cur, size = [], 0
    if cur:
        batches.append(cur)
    return batches
