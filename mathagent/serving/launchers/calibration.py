"""The FP8 calibration set step of the ReDrafter build, as the NeMo-Skills recipe makes it.

The recipe formats 4096 OpenMathReasoning ``tir`` rows (``problem``, ``generated_solution``)
with the ``generic/math`` prompt and the model's chat template, the solution as the assistant
turn, and saves them as ``calibration_dataset/data.parquet`` with one ``text`` column; the
quantizer reads that folder. Here the rows come from a local JSONL of the user's choice, and
the step runs inside the TensorRT-LLM environment (which has ``datasets`` and
``transformers``), so the script below imports nothing of mathagent.
"""

from __future__ import annotations

from pathlib import Path

from mathagent.serving.launchers.plan import Step

SCRIPT_NAME = "make_calibration_set.py"
DATASET_DIR = "calibration_dataset"  # the recipe's folder name

# The generic/math user prompt (mathagent.agent.prompts "math"), kept here so the script is
# self-contained where it runs.
SCRIPT = '''\
"""Build the FP8 calibration set from a local JSONL (written by mathagent serve)."""
import argparse
import itertools
import json
import os

from datasets import Dataset
from transformers import AutoTokenizer

USER = ("Solve the following math problem. Make sure to put the answer (and only answer) "
        "inside \\\\boxed{{}}.\\n\\n{problem}")

parser = argparse.ArgumentParser()
parser.add_argument("--jsonl", required=True)
parser.add_argument("--tokenizer", required=True)
parser.add_argument("--size", type=int, default=4096)
parser.add_argument("--out", required=True)
args = parser.parse_args()
tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
with open(args.jsonl) as rows:
    samples = [json.loads(line) for line in itertools.islice(rows, args.size)]
texts = [
    tokenizer.apply_chat_template(
        [{"role": "user", "content": USER.format(problem=s["problem"])},
         {"role": "assistant", "content": s["generated_solution"]}],
        tokenize=False,
    )
    for s in samples
]
os.makedirs(args.out, exist_ok=True)
Dataset.from_dict({"text": texts}).to_parquet(os.path.join(args.out, "data.parquet"))
print(f"calibration set: {len(texts)} samples in {args.out}/data.parquet")
'''


def is_jsonl(path: str) -> bool:
    """True when the calibration source is rows to format rather than a ready dataset."""
    return path.endswith((".jsonl", ".jsonl.gz"))


def step(jsonl: str, tokenizer_dir: str, size: int, out: Path) -> tuple[Step, Path, Path]:
    """The step that builds ``out/calibration_dataset`` from ``jsonl``; also the script path
    (a file of the plan) and the dataset folder the quantizer reads."""
    script, dataset = out / SCRIPT_NAME, out / DATASET_DIR
    argv = ["python3", str(script), "--jsonl", jsonl, "--tokenizer", tokenizer_dir]
    argv += ["--size", str(size), "--out", str(dataset)]
    made = Step(
        f"build the calibration set ({size} rows of {jsonl})",
        argv,
        skip_if_exists=str(dataset / "data.parquet"),
    )
    return made, script, dataset
