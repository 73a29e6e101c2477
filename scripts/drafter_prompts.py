"""Write the prompts the shipped ReDrafter is self-distilled on (JSONL for `train-drafter`).

Problems are rendered with the agent's prompt for the default model (its template, tools on),
as `benchmarks/spec_bench.py` renders them. GSM8K test problems 0-19 are the benchmark's and
are left out; problems 20-99 are held out (``heldout: true``: greedy transcripts that only
measure the drafter); the rest of GSM8K test, MATH-500, AMC 2023, AIME 2024/2025 and the AIMO
reference sets are training prompts. ``--no-tools`` renders the training problems with the
agent's tools-off prompt instead (more of the base's own text; no held-out prompts).

    python scripts/drafter_prompts.py OUT.jsonl [--no-tools]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mathagent.agent.plan import agent_prompt
from mathagent.agent.prompts import ChatTemplate
from mathagent.config import DEFAULT_MODEL_NAME, Settings
from mathagent.model_store import default_gguf_path

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO.parent / "shared" / "datasets"
TRAIN_SETS = ("math500", "amc23", "aime24", "aime25", "aimo1_train", "aimo2_reference",
              "aimo3_reference")  # fmt: skip
BENCH, HELDOUT = 20, 100  # GSM8K test: [0, 20) benchmark, [20, 100) held out


def rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATASETS / f"{name}.jsonl").read_text().splitlines() if x]


def main(out: Path, tools: bool) -> None:
    settings = Settings()
    chat = ChatTemplate.load(default_gguf_path(settings.model_dir))
    gsm = rows("gsm8k_test")
    # the held-out set is measured in the agent's tool-use prompt only
    items = [(f"gsm8k/{i}", r, True) for i, r in enumerate(gsm) if BENCH <= i < HELDOUT and tools]
    items += [(f"gsm8k/{i}", r, False) for i, r in enumerate(gsm) if i >= HELDOUT]
    items += [(f"{n}/{r['id']}", r, False) for n in TRAIN_SETS for r in rows(n)]
    with out.open("w") as f:
        for ident, r, heldout in items:
            prompt = agent_prompt(
                settings.agent, DEFAULT_MODEL_NAME, r["problem"], tools=tools, chat_template=chat
            )
            rec = {"id": ident, "prompt": prompt, "heldout": heldout}
            f.write(json.dumps(rec) + "\n")
    print(f"{len(items)} prompts ({sum(h for *_, h in items)} held out) -> {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-tools", action="store_true", help="the tools-off prompt")
    args = parser.parse_args()
    main(args.out, tools=not args.no_tools)
