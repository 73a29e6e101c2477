"""Probe: does an EAGLE-3 head's own bf16 arithmetic cost it acceptance? (CPU, teacher-forced)

For the held-out records of a self-distilled transcript file (``scripts/eagle3_device_job.py``'s
``transcripts.jsonl.gz``), the base's features once (float32, the engine settings from the
environment), then each head's held-out figures (per-step top-1, chain and walk acceptance at
``--steps``) with the head, features, embedding and rotary tables in float32 and in bfloat16.
A probe, not the engine: the engine's figures come from ``eagle3_acceptance.py``. Prints JSON
lines.

    MATHAGENT_ENGINE__DEVICE=cpu MATHAGENT_ENGINE__MAX_SEQ_LEN=1664 \\
    python benchmarks/eagle3_dtype_probe.py TRANSCRIPTS --limit 40 HEAD_DIR [HEAD_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from mathagent.config import Settings
from mathagent.drafter.base import FrozenBase
from mathagent.drafter.data import load_examples, open_text
from mathagent.drafter.eagle3_data import SeqFeatures, sequence_features
from mathagent.drafter.eagle3_train import Eagle3TrainConfig, evaluate
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.model import rope_table
from mathagent.serving.engine.spec_decode.eagle3_loader import aux_layers, load_head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transcripts", type=Path)
    parser.add_argument("heads", type=Path, nargs="+")
    parser.add_argument("--limit", type=int, default=40, help="held-out records to use")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    settings = Settings()
    model = resolve_model(settings.model, settings.model_dir)
    base = FrozenBase.load(EngineConfig.from_settings(settings.engine, model), settings.model_dir)
    rows = [json.loads(x) for x in open_text(args.transcripts, "r") if x.strip()]
    held = [r for r in rows if r.get("heldout")][: args.limit]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "held.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in held))
        examples = load_examples(path, base.encode, base.max_seq_len)
    cfg = Eagle3TrainConfig(eval_len=args.steps, batch_tokens=8192)
    weight = base.model.output.weight.detach().float()
    feats: list[SeqFeatures] | None = None
    for head_dir in args.heads:
        head = load_head(head_dir, base.model.args, weight)
        if feats is None:  # every head of the default model reads the same layers
            layers = aux_layers(head.config, base.model.args)
            feats = sequence_features(base, examples, layers, torch.float32)
        for dtype in (torch.float32, torch.bfloat16):
            emb = base.model.tok_embeddings.weight.detach().to(dtype)
            table = rope_table(head.config.layer_args(), base.max_seq_len + 8)
            rope = tuple(x.to(dtype) for x in table)
            cast = [SeqFeatures(f.aux.to(dtype), f.tokens, f.preds, f.start) for f in feats]
            with torch.inference_mode():
                figures = evaluate(head.to(dtype), emb, cast, cfg, rope)
            line = {"head": str(head_dir), "dtype": str(dtype), "sequences": len(cast)}
            print(json.dumps(line | figures), flush=True)


if __name__ == "__main__":
    main()
