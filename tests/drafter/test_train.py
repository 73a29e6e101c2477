"""`mathagent train-drafter` on tiny data: metrics logged, a loadable TensorRT-LLM-format folder;
the training table against the drafter's own teacher forcing; self-distillation end to end."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mathagent.drafter.data import example_rows
from mathagent.drafter.pipeline import DistillOptions, TrainDrafterError, read_prompts
from mathagent.drafter.train import step_logits
from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig
from tests.serving.engine.spec_decode.test_redrafter import assert_trtllm_checkpoint

ENV = {
    **os.environ,
    "MATHAGENT_ENGINE__DEVICE": "cpu",
    "MATHAGENT_ENGINE__DTYPE": "float32",
    "MATHAGENT_ENGINE__MAX_BATCH_SIZE": "2",
    "MATHAGENT_ENGINE__MAX_SEQ_LEN": "512",
    "MATHAGENT_ENGINE__THREADS": "2",
}

TEXTS = [
    "<tool_call>print(3 * 12 - 5)</tool_call>\n```output\n31\n```\nThe final answer is \\boxed{31}.",
    "<tool_call>print(45 + 38 * 2)</tool_call>\n```output\n121\n```\nThe final answer is \\boxed{121}.",
    "<tool_call>print(12 * 9 - 4)</tool_call>\n```output\n104\n```\nThe final answer is \\boxed{104}.",
    "<tool_call>print(7 * 8 + 1)</tool_call>\n```output\n57\n```\nThe final answer is \\boxed{57}.",
    "<tool_call>print(100 - 36)</tool_call>\n```output\n64\n```\nThe final answer is \\boxed{64}.",
]


def test_train_drafter_writes_a_trtllm_checkpoint(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": "Q:", "completion": t}) + "\n" for t in TEXTS))
    out = tmp_path / "drafter"
    env = {**ENV, "MATHAGENT_ENGINE__MAX_BATCH_SIZE": "1", "MATHAGENT_ENGINE__MAX_SEQ_LEN": "256"}
    cmd = [sys.executable, "-m", "mathagent", "train-drafter", "--base", "default"]
    cmd += ["--data", str(data), "--out", str(out), "--epochs", "2", "--layers", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads(done.stdout)
    for i in range(3):
        assert 0.0 <= metrics[f"redrafter{i}_top1"] <= metrics[f"redrafter{i}_top5"] <= 1.0
    assert "redrafter0_top1" in done.stderr  # per-epoch evaluation is logged
    assert_trtllm_checkpoint(out)
    config = json.loads((out / "config.json").read_text())
    assert config["num_draft_layers"] == 1 and config["rnn"] is True
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152
    drafter = Drafter.from_pretrained(out)
    assert drafter.lm_head[-1].weight.shape == (49152, 576)


def test_training_rows_match_teacher_forcing() -> None:
    """Row t, step i: input token t + 1 + i, label preds[t + 1 + i], logits as teacher forcing."""
    torch.manual_seed(0)
    d = Drafter(DrafterConfig(vocab_size=50, hidden_size=16, exit_dim=24, num_draft_layers=2))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    emb, hidden = torch.randn(50, 16), torch.randn(9, 16)
    tokens, preds = torch.randint(0, 50, (9,)), torch.randint(0, 50, (9,))
    start, k = 5, 3
    rows = example_rows(hidden, preds, tokens, start, k)
    assert rows is not None
    lo = start - 1 - k  # the first row whose last step names a completion token
    assert rows.size == 9 - 1 - lo
    logits = step_logits(d, emb, rows, d.lm_head[-1].weight)
    forced = d.teacher_forced_features(hidden[None], emb[tokens][None], k)
    for i in range(k):
        for r in range(rows.size):
            t = lo + r
            label = rows.labels[r, i].item()
            if t + 1 + i > 8 or t + 2 + i < start:
                assert label == -100
                continue
            assert label == preds[t + 1 + i] and rows.inputs[r, i] == tokens[t + 1 + i]
            want = d.lm_head[-1](forced[i][0, t])
            torch.testing.assert_close(logits[i][r], want, rtol=1e-4, atol=1e-4)


def test_self_distill_then_train_a_compact_drafter(tmp_path: Path) -> None:
    """The GPU job's flow at toy scale: batched self-distillation, held-out set, gzip, compact."""
    prompts = tmp_path / "prompts.jsonl"
    problems = [("a", "What is 3 * 12 - 5?", True), ("b", "What is 7 * 8 + 1?", False),
                ("c", "What is 100 - 36?", False)]  # fmt: skip
    prompts.write_text(
        "".join(json.dumps({"id": i, "problem": p, "heldout": h}) + "\n" for i, p, h in problems)
    )
    data, out = tmp_path / "t.jsonl.gz", tmp_path / "drafter"
    cmd = [sys.executable, "-m", "mathagent", "train-drafter", "--base", "default", "--device",
           "cpu", "--self-distill", str(prompts), "--data", str(data), "--out", str(out),
           "--distill-tokens", "12", "--distill-samples", "1", "--epochs", "2",
           "--batch-positions", "16", "--compact", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with gzip.open(data, "rt") as f:
        records = [json.loads(line) for line in f]
    # held-out first and greedy only; each training prompt greedy then sampled once
    assert [(r["id"], r["heldout"], r["temperature"]) for r in records] == [
        ("a", True, 0.0), ("b", False, 0.0), ("c", False, 0.0), ("b", False, 0.7),
        ("c", False, 0.7)]  # fmt: skip
    assert all(1 <= len(r["completion_ids"]) <= 12 for r in records)
    assert "<|im_start|>assistant" in records[0]["prompt"]  # the agent's chat prompt
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["eval_sequences"] == 1 and metrics["train_sequences"] == 4
    assert 1.0 <= metrics["chain_acceptance_length"] <= 4.0
    assert "lm_head.2.weight" not in load_file(str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text())["lm_head_from_base"] is True


def test_problem_records_need_a_renderer(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "x", "prompt": "Q: 1 + 1 ="}\n{"id": "y", "problem": "2 + 2?"}\n')
    got = read_prompts(DistillOptions(prompts, limit=1), None, None)  # type: ignore[arg-type]
    assert [(p.id, p.prompt, p.heldout) for p in got] == [("x", "Q: 1 + 1 =", False)]
    rendered = read_prompts(DistillOptions(prompts, skip=1), None, lambda q, _: f"<{q}>")  # type: ignore[arg-type]
    assert [p.prompt for p in rendered] == ["<2 + 2?>"]
    with pytest.raises(TrainDrafterError, match="renderer"):
        read_prompts(DistillOptions(prompts), None, None)  # type: ignore[arg-type]
