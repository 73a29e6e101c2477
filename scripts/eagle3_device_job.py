"""The shipped EAGLE-3 head's job, in one device call: self-distil, train, measure.

Runs what ``mathagent train-drafter --method eagle3 --self-distill`` runs (the pipeline's
pieces, with the engine settings read from the environment through ``Settings()``), then
measures the head on its held-out transcripts (all of them, and the subset of GSM8K test
problems 20-51 the first head's card quoted) and times it through ``LLMEngine`` against plain
decoding and ReDrafter (``benchmarks/gpu_default_model.py``). Prompts come rendered
(``scripts/drafter_prompts.py OUT``; the device has no agent dependencies). Writes under
``--out``: ``head/`` (the checkpoint and its ``train_metrics.json``), ``transcripts.jsonl.gz``
(the distilled text, held-out records marked), ``job.json`` (every figure, rewritten after each
stage, so a cut-off job still returns what it finished) and ``job.log``.

    MATHAGENT_MODEL=MODEL.gguf MATHAGENT_ENGINE__DEVICE=cuda MATHAGENT_ENGINE__DTYPE=float32 \\
    MATHAGENT_ENGINE__MAX_BATCH_SIZE=512 MATHAGENT_ENGINE__MAX_SEQ_LEN=1664 \\
    python scripts/eagle3_device_job.py --prompts prompts_on.jsonl --bench-prompts bench.jsonl \\
        --drafter REDRAFTER_DIR --out OUT [--distill-budget-s 140] [--train-budget-s 200]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_default_model

from mathagent.config import Settings
from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import load_examples, open_text
from mathagent.drafter.eagle3_data import sequence_features
from mathagent.drafter.eagle3_train import Eagle3TrainConfig, evaluate, train_eagle3
from mathagent.drafter.pipeline import DistillConfig, DistillOptions, read_prompts, self_distill
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.model import rope_table
from mathagent.serving.engine.spec_decode.eagle3_loader import aux_layers, load_head

SUBSET = range(20, 52)  # GSM8K test problems of the first head's held-out figures


class Job:
    """Figures so far (``job.json``) and a log line per event (``job.log`` and stdout)."""

    def __init__(self, out: Path) -> None:
        self.out, self.t0, self.figures = out, time.perf_counter(), {}
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, event: dict) -> None:
        line = json.dumps({"t": round(self.elapsed(), 1), **event})
        print(line, flush=True)
        with (self.out / "job.log").open("a") as f:
            f.write(line + "\n")

    def keep(self, key: str, value: object) -> None:
        self.figures[key] = value
        (self.out / "job.json").write_text(json.dumps(self.figures, indent=1) + "\n")


def train(args: argparse.Namespace, job: Job) -> Path:
    """Distil, train and evaluate; returns the head's folder."""
    settings = Settings()
    # what runtime.engine_config does, without the agent client's imports (none on the device)
    config = EngineConfig.from_settings(
        settings.engine, resolve_model(settings.model, settings.model_dir)
    )
    job.keep("engine", {"device": str(config.device), "dtype": str(config.dtype),
                        "slots": settings.engine.max_batch_size,
                        "max_seq_len": settings.engine.max_seq_len})  # fmt: skip
    base = FrozenBase.load(config, settings.model_dir)
    plan = DistillConfig(args.distill_tokens, args.distill_samples, 0.7, 0,
                         time_budget_s=args.distill_budget_s)  # fmt: skip
    opts = DistillOptions(args.prompts, limit=args.prompt_limit, config=plan)
    prompts = read_prompts(opts, base.loaded, None)
    data = job.out / "transcripts.jsonl.gz"
    written = self_distill(base, prompts, data, plan, job.log)
    job.keep(
        "distill", {"prompts": len(prompts), "records": written, "seconds": round(job.elapsed(), 1)}
    )
    examples = load_examples(data, base.encode, base.max_seq_len)
    ecfg = Eagle3TrainConfig(steps=args.ttt_steps, eval_len=5, draft_vocab=args.draft_vocab,
                             lr=args.lr, epochs=args.epochs, batch_tokens=args.batch_tokens,
                             time_budget_s=args.train_budget_s, max_seq_len=base.max_seq_len,
                             base_batch=base.slots)  # fmt: skip
    head_dir = job.out / "head"
    job.keep("train_config", {k: v for k, v in vars(ecfg).items()})
    job.keep("heldout", train_eagle3(base, examples, ecfg, head_dir, job.log))
    job.keep("heldout_more", heldout_figures(base, data, head_dir, ecfg))
    if args.compare:  # another head on the same held-out transcripts
        job.keep("heldout_compare", heldout_figures(base, data, args.compare, ecfg))
    return head_dir


def heldout_figures(base: FrozenBase, data: Path, head_dir: Path, ecfg: Eagle3TrainConfig) -> dict:
    """Chain acceptance at 5 on the first card's subset (problems 20-51) and on all, at 3 on all."""
    rows = [json.loads(x) for x in open_text(data, "r") if x.strip()]
    held = [r for r in rows if r.get("heldout")]
    subset = [r for r in held if int(r["id"].split("/")[1]) in SUBSET]
    head = load_head(head_dir, base.model.args, base.model.output.weight.detach().float())
    head = head.to(base.runner.device)
    emb = base.model.tok_embeddings.weight.detach().float()
    dev, layers = base.runner.device, aux_layers(head.config, base.model.args)
    rope = tuple(x.to(dev) for x in rope_table(head.config.layer_args(), base.max_seq_len + 8))
    store = torch.bfloat16 if dev.type == "cuda" else torch.float32  # as training stores them
    out = {}
    sets = (("gsm8k_20_51", subset, 5), ("all_heldout_at_5", held, 5), ("all_heldout", held, 3))
    for name, recs, k in sets:
        path = data.parent / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        examples = load_examples(path, base.encode, base.max_seq_len)
        feats = sequence_features(base, examples, layers, store)
        path.unlink()
        figures = evaluate(head, emb, feats, replace(ecfg, eval_len=k), rope)
        out[name] = {"sequences": len(feats), **figures}
    return out


def bench(args: argparse.Namespace, job: Job, head_dir: Path) -> None:
    """Plain (and once ReDrafter, with the first tree) and EAGLE-3 through ``LLMEngine``, each
    ``--bench`` configuration ``BEAMSxLEN:DTYPE`` in turn."""
    settings = Settings()
    baseline = True  # ReDrafter is timed once, with the first tree configuration
    for config in args.bench.split(","):
        shape, _, dtype = config.partition(":")
        beams, length = (int(x) for x in shape.split("x"))
        dtype = dtype or settings.engine.dtype
        methods = "redrafter" if beams > 1 and baseline else ""
        baseline = baseline and not methods
        if job.elapsed() > args.deadline_s - args.bench_reserve_s:
            job.log({"event": "bench_skipped", "config": config})
            continue
        ns = argparse.Namespace(
            default_model=settings.model, drafter=args.drafter, prompts=args.bench_prompts,
            default_limit=args.bench_limit, default_max_tokens=args.bench_tokens,
            default_draft_len=length, default_device=str(settings.engine.device),
            default_dtype=dtype, model_dir=settings.model_dir, default_policy=args.bench_policy,
            default_beams=beams, eagle3=head_dir, default_methods=methods,
        )  # fmt: skip
        try:
            figures = gpu_default_model.run(ns)
        except Exception as exc:  # keep the other configurations and the head
            figures = {"error": f"{type(exc).__name__}: {exc}"}
        job.keep(f"engine_beams{beams}_len{length}_{dtype}", figures)
        job.log({"event": "bench", "config": config})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--bench-prompts", type=Path, required=True)
    p.add_argument("--drafter", type=Path, required=True, help="ReDrafter folder (the baseline)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prompt-limit", type=int)
    p.add_argument("--distill-tokens", type=int, default=512)
    p.add_argument("--distill-samples", type=int, default=1)
    p.add_argument("--distill-budget-s", type=float, default=140)
    p.add_argument("--ttt-steps", type=int, default=6)
    p.add_argument("--draft-vocab", type=int, default=4096, help="0: the whole vocabulary")
    p.add_argument("--compare", type=Path, help="another head to measure on the held-out set")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--train-budget-s", type=float, default=200)
    p.add_argument("--bench-limit", type=int, default=20)
    p.add_argument("--bench-tokens", type=int, default=128)
    p.add_argument("--bench", default="4x3,1x5,4x5", help="BEAMSxLEN[:DTYPE],... to time")
    p.add_argument("--bench-policy", default="fixed", choices=["auto", "fixed", "both"])
    p.add_argument("--deadline-s", type=float, default=540)
    p.add_argument("--bench-reserve-s", type=float, default=45, help="time one bench config needs")
    args = p.parse_args()
    job = Job(args.out)
    head_dir = train(args, job)
    gc.collect()  # the frozen base's KV cache goes before the engines load
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    bench(args, job, head_dir)
    job.keep("seconds", round(job.elapsed(), 1))
    job.keep(
        "modules", sorted(m for m in ("openai", "typer", "httpx", "fastapi") if sys.modules.get(m))
    )


if __name__ == "__main__":
    main()
