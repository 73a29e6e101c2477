"""``mathagent train-drafter``: train a ReDrafter or EAGLE-3 head on a frozen base model."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from mathagent.cli.common import fail, print_json, settings_of
from mathagent.config import Settings

HELP = "Train a ReDrafter or EAGLE-3 head on a frozen base model."


def train_drafter(
    ctx: typer.Context,
    base: Annotated[str, typer.Option(help="Base model path.")],
    data: Annotated[Path, typer.Option(help="Training text (JSONL, .jsonl.gz or text).")],
    out: Annotated[Path, typer.Option(help="Output folder for the drafter.")],
    method: Annotated[
        str, typer.Option(help="redrafter | eagle3 (EAGLE-3 with the training-time test).")
    ] = "redrafter",
    draft_len: Annotated[int, typer.Option(min=1, help="Draft tokens per beam.")] = 3,
    ttt_steps: Annotated[
        int, typer.Option(min=1, help="eagle3: draft steps the training-time test unrolls.")
    ] = 6,
    intermediate_size: Annotated[
        int, typer.Option(min=1, help="eagle3: MLP width of the head's decoder layer.")
    ] = 1024,
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
        int, typer.Option(min=1, help="Text positions (eagle3: padded tokens) per step.")
    ] = 4096,
    train_budget_s: Annotated[
        float | None, typer.Option(min=1.0, help="Stop training after this many seconds.")
    ] = None,
    exit_dim: Annotated[
        int | None, typer.Option(min=1, help="Own vocab head of this width (default: tied).")
    ] = None,
    draft_vocab: Annotated[
        int,
        typer.Option(
            min=0,
            help="Draft from the N most frequent tokens (0: all; eagle3: 4096, N >= vocab: all).",
        ),
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
    """Train a ReDrafter or EAGLE-3 head on a frozen base model.

    Long because Typer reads the command's 28 options from this signature; the work itself is
    :func:`mathagent.drafter.pipeline.train_drafter`.
    """
    import logging

    from mathagent.drafter.eagle3_train import Eagle3TrainConfig
    from mathagent.drafter.pipeline import DistillConfig, DistillOptions, TrainDrafterOptions
    from mathagent.drafter.pipeline import train_drafter as run_pipeline
    from mathagent.drafter.train import TrainConfig
    from mathagent.model_store import ModelFetchError
    from mathagent.runtime import engine_config

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = settings_of(ctx)
    engine_settings = settings.engine
    if device is not None:
        engine_settings = engine_settings.model_copy(update={"device": device})
    distill = None
    if self_distill is not None:
        plan = DistillConfig(distill_tokens, distill_samples, distill_temperature, distill_seed,
                             distill_greedy, time_budget_s=distill_budget_s)  # fmt: skip
        distill = DistillOptions(self_distill, distill_skip, distill_limit, plan)
    train = TrainConfig(
        draft_len=draft_len, layers=layers, exit_dim=exit_dim, epochs=epochs, lr=lr,
        batch_positions=batch_positions, time_budget_s=train_budget_s, draft_vocab=draft_vocab,
        kd_weight=kd_weight,
    )  # fmt: skip
    if method not in ("redrafter", "eagle3"):
        raise fail(f"unknown --method {method!r}; use redrafter | eagle3")
    eagle3 = Eagle3TrainConfig(
        steps=ttt_steps, eval_len=max(draft_len, 1), intermediate_size=intermediate_size,
        draft_vocab=draft_vocab or 4096, lr=lr, epochs=epochs, batch_tokens=batch_positions,
        time_budget_s=train_budget_s,
    )  # fmt: skip
    options = TrainDrafterOptions(data, out, train, distill, tuple(extra_data or ()), compact,
                                  method, eagle3)  # fmt: skip
    render = partial(_drafter_prompt, settings=settings)
    try:
        model = None if base == "default" else base
        config = engine_config(settings.model_copy(update={"model": None}), model, engine_settings)
        metrics = run_pipeline(options, config, settings.model_dir, render=render)
    except (ModelFetchError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json(metrics)
    else:
        for key, value in metrics.items():
            typer.echo(f"{key}: {value}")


def _drafter_prompt(problem: str, loaded: Any, settings: Settings) -> str:
    """A problem rendered as the agent would ask it (its family's template, tools on)."""
    from mathagent.agent.plan import agent_prompt
    from mathagent.agent.prompts import ChatTemplate

    return agent_prompt(
        settings.agent, loaded.name, problem, chat_template=ChatTemplate(loaded.tokenizer)
    )
