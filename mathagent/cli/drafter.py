"""``mathagent train-drafter``: train a ReDrafter head on a frozen base model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mathagent.cli.common import fail, print_json, settings_of
from mathagent.config import Settings


def train_drafter(
    ctx: typer.Context,
    base: Annotated[str, typer.Option(help="Base model path.")],
    data: Annotated[Path, typer.Option(help="Training text (JSONL, .jsonl.gz or text).")],
    out: Annotated[Path, typer.Option(help="Output folder for the drafter.")],
    draft_len: Annotated[int, typer.Option(min=1, help="Draft tokens per beam.")] = 3,
    layers: Annotated[int, typer.Option(min=1, help="Residual layers in the drafter.")] = 2,
    self_distill: Annotated[
        Path | None,
        typer.Option(help="JSONL of prompts/problems: first write --data from the base itself."),
    ] = None,
    distill_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens per self-distilled text.")
    ] = 256,
    distill_skip: Annotated[int, typer.Option(min=0, help="Skip the first K records.")] = 0,
    distill_limit: Annotated[int | None, typer.Option(min=1, help="Use at most K records.")] = None,
    distill_budget_s: Annotated[
        float | None, typer.Option(min=1.0, help="Stop generating after this many seconds.")
    ] = None,
    distill_samples: Annotated[
        int, typer.Option(min=0, help="Sampled texts per prompt besides the greedy one.")
    ] = 0,
    distill_temperature: Annotated[
        float, typer.Option(min=0.0, help="Temperature of the sampled texts.")
    ] = 0.7,
    distill_seed: Annotated[int, typer.Option(help="Seed of the sampled texts.")] = 0,
    distill_greedy: Annotated[
        bool, typer.Option(help="Also write each prompt's greedy text (off: samples only).")
    ] = True,
    extra_data: Annotated[
        list[Path] | None, typer.Option(help="More training text (repeatable), as --data.")
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training text.")] = 3,
    lr: Annotated[float, typer.Option(min=0.0, help="Peak learning rate.")] = 3e-3,
    batch_positions: Annotated[
        int, typer.Option(min=1, help="Text positions per training step.")
    ] = 4096,
    train_budget_s: Annotated[
        float | None, typer.Option(min=1.0, help="Stop training after this many seconds.")
    ] = None,
    exit_dim: Annotated[
        int | None, typer.Option(min=1, help="Own vocab head of this width (default: tied).")
    ] = None,
    draft_vocab: Annotated[
        int, typer.Option(min=0, help="Draft only from the N most frequent tokens (0: all).")
    ] = 0,
    kd_weight: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Share of the loss that is KL to the base's softmax."),
    ] = 0.0,
    device: Annotated[
        str | None, typer.Option(help="Engine device for the base (default: the settings').")
    ] = None,
    compact: Annotated[
        bool, typer.Option("--compact", help="Leave a base-tied vocab head out of the checkpoint.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the final metrics as JSON.")
    ] = False,
) -> None:
    """Train a ReDrafter head on a frozen base model."""
    import logging

    from mathagent.serving.engine import train_drafter as td
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.distill import DistillConfig
    from mathagent.serving.engine.distill import self_distill as self_distill_run
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import ModelLoadError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = settings_of(ctx)
    engine_settings = settings.engine
    if device is not None:
        engine_settings = engine_settings.model_copy(update={"device": device})
    model = None if base == "default" else base
    try:
        engine = LLMEngine(EngineConfig.from_settings(engine_settings, model), settings.model_dir)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if engine.tokenizer is None:
        raise fail(f"{base} has no tokenizer; train-drafter reads text")
    if self_distill is not None:
        records = [json.loads(x) for x in self_distill.read_text().splitlines() if x.strip()]
        prompts = [
            _drafter_prompt(r, engine, settings) for r in records[distill_skip:][:distill_limit]
        ]
        plan = DistillConfig(distill_tokens, distill_samples, distill_temperature, distill_seed,
                             distill_greedy, time_budget_s=distill_budget_s)  # fmt: skip
        self_distill_run(engine, prompts, data, plan)
    for path in [data, *(extra_data or [])]:
        if not path.is_file():
            raise fail(f"no training data at {path}")
    cfg = td.TrainConfig(
        draft_len=draft_len, layers=layers, exit_dim=exit_dim, epochs=epochs, lr=lr,
        batch_positions=batch_positions, max_seq_len=engine.max_seq_len,
        time_budget_s=train_budget_s, base_batch=engine.config.max_batch_size,
        draft_vocab=draft_vocab, kd_weight=kd_weight,
    )  # fmt: skip
    encode = lambda text: engine.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    examples = [
        ex for path in [data, *(extra_data or [])]
        for ex in td.load_examples(path, encode, cfg.max_seq_len)
    ]  # fmt: skip
    base_fn = td.engine_base_fn(engine.runner)
    emb = engine.runner.model.tok_embeddings.weight.detach()
    head = engine.runner.model.output.weight.detach()
    metrics = td.train(base_fn, emb, examples, cfg, out, compact=compact, teacher_head=head)
    if as_json:
        print_json(metrics)
    else:
        for key, value in metrics.items():
            typer.echo(f"{key}: {value}")


def _drafter_prompt(record: dict, engine, settings: Settings):
    """A raw prompt, or a problem rendered as the agent would ask it (its template, tools on)."""
    from mathagent.serving.engine.distill import DistillPrompt

    ident, heldout = str(record.get("id", "")), bool(record.get("heldout", False))
    if "prompt" in record:
        return DistillPrompt(record["prompt"], ident, heldout)
    from mathagent.agent.plan import agent_prompt
    from mathagent.agent.prompts import ChatTemplate

    prompt = agent_prompt(
        settings.agent,
        engine.model_name,
        record["problem"],
        chat_template=ChatTemplate(engine.tokenizer),
    )
    return DistillPrompt(prompt, ident, heldout)
