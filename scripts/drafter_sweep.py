"""More self-distilled data, then several ReDrafter variants on it; keep the best (one GPU job).

    python scripts/drafter_sweep.py --prompts P.jsonl [--prompts-no-tools Q.jsonl] \
        --seed-data run1.jsonl.gz --out DIR [--gen-budget-s 150 --deadline-s 540]

1. ``BatchDistiller`` writes new transcripts of the training prompts (never the held-out ones)
   in rounds: sampled at T = 0.7 with the tool-use prompt, greedy with the tools-off prompt,
   sampled again ..., until the generation budget; their training rows come out of generation.
2. The seed data (an earlier run's transcripts, held-out set included) gets one base pass.
3. Each variant (layers, soft-label weight) trains on seed + new rows for an equal share of the
   remaining time and is measured on the held-out transcripts (``mathagent.drafter.train.evaluate``),
   with the full vocabulary and with a draft vocabulary of the ``--draft-vocab`` most frequent
   training-text tokens (as ``scripts/drafter_vocab.py``). The best by held-out step-2 top-1
   (ties: chain acceptance length) is saved compact to ``DIR/best``; every variant's metrics go
   to ``DIR/results.json`` and the new transcripts to ``DIR/transcripts2.jsonl.gz``.
   ``--reference DIR`` measures an existing drafter on the same held-out rows first.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mathagent.config import Settings
from mathagent.drafter import train as td
from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import build_positions, concat_positions, load_examples, open_text
from mathagent.drafter.distill import BatchDistiller, BatchJob, Transcript
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.spec_decode.redrafter import Drafter

VARIANTS = [  # name, residual layers, soft-label weight
    ("l2_ce", 2, 0.0),
    ("l2_kd05", 2, 0.5),
    ("l3_kd05", 3, 0.5),
    ("l4_kd05", 4, 0.5),
]
T0 = time.perf_counter()


def log(event: dict, sink: list[dict] | None = None) -> None:
    event = {"t": round(time.perf_counter() - T0, 1), **event}
    print(json.dumps(event), flush=True)
    if sink is not None:
        sink.append(event)


def load_prompts(path: Path | None, tag: str) -> list[tuple[str, str]]:
    if path is None:
        return []
    with open_text(path, "r") as f:
        recs = [json.loads(x) for x in f if x.strip()]
    return [(f"{tag}:{r['id']}", r["prompt"]) for r in recs if not r.get("heldout")]


def jobs_for(base: FrozenBase, on: list, off: list, rounds: int) -> list[BatchJob]:
    """Rounds: sampled tool-use, greedy tools-off, then sampled tool-use / tools-off in turn."""
    enc = {p: base.encode(p) for _, p in on + off}
    plan = [(on, 0.7), (off, 0.0)] + [(on if r % 2 == 0 else off, 0.7) for r in range(rounds)]
    return [BatchJob(enc[p], temp, ident) for group, temp in plan for ident, p in group]


def write_transcripts(base: FrozenBase, done: list[Transcript], path: Path, prompts: dict):
    with open_text(path, "w") as f:
        for t in done:
            rec = {"id": t.job.tag, "prompt": prompts[t.job.tag],
                   "completion": base.tokenizer.decode(t.completion_ids),
                   "completion_ids": t.completion_ids, "temperature": t.job.temperature,
                   "heldout": False}  # fmt: skip
            f.write(json.dumps(rec) + "\n")


def generate(base: FrozenBase, args: argparse.Namespace, k: int) -> list[Transcript]:
    """New transcripts (and their training rows) within the generation budget."""
    on, off = load_prompts(args.prompts, "on"), load_prompts(args.prompts_no_tools, "off")
    jobs = jobs_for(base, on, off, args.rounds)
    distiller = BatchDistiller(base, args.max_tokens, k, teacher=True, seed=1)
    done = distiller.run(jobs, args.gen_budget_s, report=log)
    write_transcripts(base, done, args.out / "transcripts2.jsonl.gz", dict(on + off))
    by_kind: dict[str, int] = {}
    for t in done:
        key = f"{t.job.tag.split(':')[0]}_T{t.job.temperature}"
        by_kind[key] = by_kind.get(key, 0) + len(t.completion_ids)
    log({"event": "transcripts", "records": len(done), "tokens_by_kind": by_kind})
    return done


def tables(base: FrozenBase, args: argparse.Namespace, done: list[Transcript], k: int):
    """Training rows (seed data + new), held-out rows, the draft vocabulary, and a summary."""
    seed = load_examples(args.seed_data, base.encode, base.max_seq_len)
    base_fn = base.features
    seed_train = [e for e in seed if not e.heldout]
    held = [e for e in seed if e.heldout]
    train_pos = concat_positions(
        [build_positions(base_fn, seed_train, k, 256, teacher=True)]
        + [t.rows for t in done if t.rows is not None]
    )
    eval_pos = build_positions(base_fn, held, k, 256)
    seen = [t for e in seed_train for t in e.tokens[e.start :]]
    seen += [t for tr in done for t in tr.completion_ids]
    vocab = td.frequent_tokens(torch.tensor(seen), args.draft_vocab)
    info = {"train_positions": train_pos.size, "eval_positions": eval_pos.size,
            "eval_sequences": len(held), "seed_train_sequences": len(seed_train),
            "new_sequences": len(done), "draft_vocab_size": int(vocab.numel())}  # fmt: skip
    log({"event": "features", **info})
    return train_pos, eval_pos, vocab, info


def sweep(base: FrozenBase, args: argparse.Namespace, train_pos, eval_pos, vocab, info) -> None:
    """Train every chosen variant for its share of the time left; save the best."""
    model = base.model
    emb, head = model.tok_embeddings.weight.detach().float(), model.output.weight.detach().float()
    chosen = [v for v in VARIANTS if v[0] in args.variants.split(",")]
    results: dict = {"info": info, "variants": {}}
    if args.reference is not None:
        ref = Drafter.from_pretrained(args.reference, emb).to(emb.device)
        own = td.evaluate(ref, emb, eval_pos, 5)
        ref.set_draft_vocab(None)
        results["reference"] = {"heldout_full_vocab": td.evaluate(ref, emb, eval_pos, 5),
                                "heldout_draft_vocab": own}  # fmt: skip
        log({"event": "reference", **results["reference"]})
    best: tuple[float, float] | None = None
    for n, (name, layers, kd) in enumerate(chosen):
        share = (args.deadline_s - (time.perf_counter() - T0) - 25) / (len(chosen) - n)
        cfg = td.TrainConfig(draft_len=3, layers=layers, epochs=args.epochs, lr=3e-3,
                             batch_positions=8192, time_budget_s=max(share, 5.0), kd_weight=kd)  # fmt: skip
        curve: list[dict] = []
        try:
            drafter, steps = td.fit(emb, train_pos, eval_pos, cfg, lambda m, c=curve: log(m, c),
                                    head)  # fmt: skip
        except RuntimeError as exc:  # e.g. out of memory: the other variants still run
            results["variants"][name] = {"error": str(exc)[:500]}
            log({"event": "variant_failed", "name": name, "error": str(exc)[:500]})
            continue
        full = td.evaluate(drafter, emb, eval_pos, 5)
        drafter.set_draft_vocab(vocab)
        restricted = td.evaluate(drafter, emb, eval_pos, 5)
        row = {"layers": layers, "kd_weight": kd, "steps": steps, "budget_s": round(share, 1),
               "heldout_full_vocab": full, "heldout_draft_vocab": restricted}  # fmt: skip
        log({"event": "variant", "name": name, **row})
        row["curve"] = [{key: e[key] for key in ("epoch", "redrafter2_top1",
                         "chain_acceptance_length") if key in e} for e in curve]  # fmt: skip
        results["variants"][name] = row
        score = (full["redrafter2_top1"], full["chain_acceptance_length"])
        if best is None or score > best:
            best, results["best"] = score, name
            out = args.out / "best"
            drafter.cpu().save_pretrained(out, compact=True)
            metrics = {**full, **info, "variant": name, "layers": layers, "kd_weight": kd,
                       "steps": steps, "draft_vocab": {"size": int(vocab.numel()),
                       "heldout_full_vocab": full, "heldout_draft_vocab": restricted}}  # fmt: skip
            (out / "train_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log({"event": "done", "best": results.get("best")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--prompts-no-tools", type=Path)
    ap.add_argument("--seed-data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gen-budget-s", type=float, default=150.0)
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=200, help="at most; the time share decides")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    ap.add_argument("--reference", type=Path, help="a drafter to measure on the same rows")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings()
    config = EngineConfig.from_settings(settings.engine, resolve_model(None, settings.model_dir))
    base = FrozenBase.load(config, settings.model_dir)
    log({"event": "loaded", "slots": base.slots})
    done = generate(base, args, 3)
    train_pos, eval_pos, vocab, info = tables(base, args, done, 3)
    del done  # the rows now live in train_pos
    sweep(base, args, train_pos, eval_pos, vocab, info)


if __name__ == "__main__":
    main()
