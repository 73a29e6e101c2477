"""The embedded server with acceptance-controlled drafts: the 8B rows of ``bench_table.py``.

The project's own server and engine (``serving.embedded.serve``: the same app, engine thread and
HTTP as ``mathagent serve --engine embedded``, configured from ``MATHAGENT_*`` as it is), whose
default speculative method is the replay proposer of ``gpu_spec.py``: it drafts the target's own
greedy continuation of each prompt with draft position ``--accept - 1`` made wrong, so every
step accepts ``--accept - 1`` drafts (acceptance length ``--accept``) on a random-weight model
that no real drafter could draft for. Drafting runs on the device inside the one-graph step on
CUDA graphs (``DeviceReplay``), else on the host.

Before serving, in the engine's thread, it renders every problem of ``--prompts FILE:BATCH``
as ``mathagent bench`` sends it (the chat template of the model's tokenizer, e.g. a stand-in:
``MATHAGENT_ENGINE__TOKENIZER``), and records each one's continuation with every step
verify-wide and no draft accepted, ``BATCH`` prompts at a time: the rounding the served steps
will see (in bf16 a one-row decode step rounds differently from a verify row; run 28). Prompts
it was not told about get drafts that are never accepted.

    MATHAGENT_MODEL=random:llama-3-8b MATHAGENT_ENGINE__TOKENIZER=SmolLM2.gguf \\
        python benchmarks/replay_server.py --accept 3 --prompts c1.jsonl:1 --prompts c16.jsonl:16 \\
        --max-tokens 256 --port 8103
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from gpu_spec import REPLAY, ReplayProposer, replay_proposer

from mathagent.config import Settings
from mathagent.evals.bench import PROMPT_SUFFIX
from mathagent.evals.datasets import load_dataset
from mathagent.runtime import engine_builder
from mathagent.serving.embedded import serve
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_decode.policy import DraftPolicy


class References(dict):
    """Prompt ids -> continuation; an unknown prompt has none (its drafts never land)."""

    def __missing__(self, key: tuple) -> list[int]:
        return []


def bench_prompt_ids(engine: LLMEngine, problem: str) -> list[int]:
    """The ids the server computes for ``mathagent bench``'s chat request of ``problem``."""
    messages = [{"role": "user", "content": problem + PROMPT_SUFFIX}]
    text = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return engine.encode(text)


def record(engine: LLMEngine, groups: list[tuple[list[list[int]], int]], tokens: int) -> References:
    """Each prompt's continuation with every step ``draft_len + 1`` wide and nothing accepted."""
    refs, vocab = References(), engine.loaded.model.args.vocab_size
    engine.speculator.proposers.register(REPLAY, ReplayProposer(References(), 1, vocab))
    engine.speculator.policy = DraftPolicy(engine.config.draft_len, adaptive=False)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True,
                            speculative=str(REPLAY))  # fmt: skip
    for prompts, batch in groups:
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            for p, out in zip(chunk, engine.generate(chunk, params), strict=True):
                refs[tuple(p)] = list(out.token_ids)
    return refs


def builder(settings: Settings, args: argparse.Namespace):
    """Build the engine, record the references, make the replay its default method."""
    build = engine_builder(settings)

    def build_replay() -> LLMEngine:
        engine = build()
        groups = []
        for spec in args.prompts:
            path, _, batch = spec.rpartition(":")
            problems = load_dataset(path, data_dir=settings.data_dir, limit=args.limit)
            groups.append(([bench_prompt_ids(engine, p.problem) for p in problems], int(batch)))
        refs = record(engine, groups, args.max_tokens + engine.config.draft_len + 1)
        vocab = engine.loaded.model.args.vocab_size
        engine.speculator.proposers.register(
            REPLAY, replay_proposer(engine, refs, args.accept, vocab)
        )
        engine.speculator.default = REPLAY
        engine.speculator.policy = DraftPolicy(
            engine.config.draft_len, engine.config.adaptive_draft
        )
        print(f"replay: {len(refs)} references, acceptance {args.accept}", flush=True)
        return engine

    return build_replay


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accept", type=int, required=True, help="acceptance length per step (>= 1)")
    p.add_argument("--prompts", action="append", required=True,
                   help="DATASET:BATCH, repeatable: problems served, recorded BATCH at a time")  # fmt: skip
    p.add_argument("--limit", type=int, help="first N problems of each dataset")
    p.add_argument("--max-tokens", type=int, default=256, help="the bench's tokens per request")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    if args.accept < 1 or any(not s.rpartition(":")[2].isdigit() for s in args.prompts):
        p.error("--accept must be >= 1 and each --prompts DATASET:BATCH")
    return args


def main() -> None:
    args = parse_args()
    settings = Settings()
    serve(builder(settings, args), settings.host, args.port)


if __name__ == "__main__":
    main()
