"""Give a trained ReDrafter a draft vocabulary and measure it on the held-out transcripts.

    python scripts/drafter_vocab.py DRAFTER_DIR TRANSCRIPTS.jsonl.gz [--size 4096]

The draft vocabulary is the ``--size`` most frequent tokens of the training transcripts
(records without ``heldout``), as ``train-drafter --draft-vocab`` picks it; the drafter's
weights are unchanged. Prints the held-out top-1/top-5 per draft step with the full and the
draft vocabulary (teacher-forced over the default model, CPU float32) and rewrites the
checkpoint (compact when its head is tied to the base).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mathagent.config import EngineSettings, Settings
from mathagent.drafter import train as td
from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import build_positions, load_examples
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.spec_decode.redrafter import Drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", type=Path)
    parser.add_argument("transcripts", type=Path)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--draft-len", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    settings = EngineSettings(device="cpu", dtype="float32", max_batch_size=8, max_seq_len=1024)
    model_dir = Settings().model_dir
    config = EngineConfig.from_settings(settings, resolve_model(None, model_dir))
    base = FrozenBase.load(config, model_dir)
    emb = base.model.tok_embeddings.weight.detach().float()
    drafter = Drafter.from_pretrained(args.drafter, emb).eval()
    drafter.set_draft_vocab(None)

    examples = load_examples(args.transcripts, base.encode, 1024)
    seen = [t for ex in examples if not ex.heldout for t in ex.tokens[ex.start :]]
    vocab = td.frequent_tokens(torch.tensor(seen), args.size)

    held = [ex for ex in examples if ex.heldout]
    positions = build_positions(base.features, held, args.draft_len, max_rows=8)
    full = td.evaluate(drafter, emb, positions, top_k=5)
    drafter.set_draft_vocab(vocab)
    restricted = td.evaluate(drafter, emb, positions, top_k=5)
    drafter.save_pretrained(args.drafter, compact=drafter.config.lm_head_from_base)
    metrics_path = args.drafter / "train_metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    metrics["draft_vocab"] = {"size": int(vocab.numel()), "heldout_full_vocab": full,
                              "heldout_draft_vocab": restricted}  # fmt: skip
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics["draft_vocab"], indent=2))


if __name__ == "__main__":
    main()
