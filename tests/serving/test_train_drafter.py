"""`mathagent train-drafter` on tiny data: metrics logged, a loadable TensorRT-LLM-format folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mathagent.serving.engine.redrafter import Drafter
from tests.serving.test_redrafter import assert_trtllm_checkpoint

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
    env = {
        **os.environ,
        "MATHAGENT_ENGINE__DEVICE": "cpu",
        "MATHAGENT_ENGINE__DTYPE": "float32",
        "MATHAGENT_ENGINE__MAX_BATCH_SIZE": "1",
        "MATHAGENT_ENGINE__MAX_SEQ_LEN": "256",
        "MATHAGENT_ENGINE__THREADS": "2",
    }
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
