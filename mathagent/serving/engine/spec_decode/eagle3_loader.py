"""Load an EAGLE-3 head for a target model, refusing one that is not shaped for it.

Key names, shapes and the ``d2t`` offset convention are those of SafeAILab/EAGLE (the
reference) and vLLM's ``llama_eagle3.py`` loader (``midlayer.`` is vLLM's ``layers.0.``; ``t2d``
is skipped there, ``embed_tokens`` optional). Every mismatch is an :class:`Eagle3CheckpointError`
that names the tensor or key and both shapes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from mathagent.serving.engine.model import ModelArgs
from mathagent.serving.engine.spec_decode.eagle3_head import (
    Eagle3CheckpointError,
    Eagle3Config,
    Eagle3Head,
    read_checkpoint,
)

OPTIONAL = ("embed_tokens.weight",)


def default_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's and the reference's default fused layers: low, middle, high."""
    return (2, num_layers // 2, num_layers - 3)


def aux_layers(cfg: Eagle3Config, target: ModelArgs) -> tuple[int, ...]:
    """The target layers whose input hidden states are fused (vLLM's ids: ``j`` is the
    input of layer ``j``, ``L`` the last layer's output); default :func:`default_layers`."""
    n = target.num_layers
    ids = cfg.aux_layer_ids or default_layers(n)
    if len(set(ids)) != 3 or not all(0 <= i <= n for i in ids):
        raise Eagle3CheckpointError(
            f"eagle_aux_hidden_state_layer_ids {list(ids)} must name 3 distinct layers in 0..{n}"
        )
    return tuple(ids)


def check_target(cfg: Eagle3Config, target: ModelArgs, own_embedding: bool) -> None:
    """Refuse a head whose vocabulary or widths do not match the target's."""
    if cfg.vocab_size != target.vocab_size:
        raise Eagle3CheckpointError(
            f"the head is shaped for a vocabulary of {cfg.vocab_size}; "
            f"the target's is {target.vocab_size}"
        )
    width = cfg.target_hidden_size or cfg.hidden_size
    if width != target.hidden_size:
        raise Eagle3CheckpointError(
            f"the head fuses target hidden states of size {width} (hidden_size / "
            f"target_hidden_size); the target's hidden size is {target.hidden_size}"
        )
    if not own_embedding and cfg.hidden_size != target.hidden_size:
        raise Eagle3CheckpointError(
            f"the head has no embed_tokens.weight and hidden size {cfg.hidden_size}, so it "
            f"cannot use the target's embedding of width {target.hidden_size}"
        )
    if cfg.draft_vocab_size > cfg.vocab_size:
        raise Eagle3CheckpointError(
            f"draft_vocab_size {cfg.draft_vocab_size} exceeds vocab_size {cfg.vocab_size}"
        )


def check_maps(cfg: Eagle3Config, state: dict[str, Tensor]) -> None:
    """A reduced draft vocabulary needs both maps, and they must agree."""
    if cfg.draft_vocab_size == cfg.vocab_size:
        state.setdefault("d2t", torch.zeros(cfg.vocab_size, dtype=torch.long))
        state.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    missing = [k for k in ("d2t", "t2d") if k not in state]
    if missing:
        raise Eagle3CheckpointError(
            f"a draft vocabulary of {cfg.draft_vocab_size} < {cfg.vocab_size} needs the "
            f"draft-to-target / target-to-draft maps; the checkpoint lacks {', '.join(missing)}"
        )
    d2t, t2d = state["d2t"].to(torch.long), state["t2d"].to(torch.bool)
    if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
        raise Eagle3CheckpointError(
            f"d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} must be "
            f"({cfg.draft_vocab_size},) / ({cfg.vocab_size},)"
        )
    ids = torch.arange(d2t.numel()) + d2t  # draft id d is target id d + d2t[d]
    if (
        int(ids.min()) < 0
        or int(ids.max()) >= cfg.vocab_size
        or ids.unique().numel() != ids.numel()
    ):
        raise Eagle3CheckpointError(
            "d2t maps draft ids outside the vocabulary or onto one id twice"
        )
    if int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
        raise Eagle3CheckpointError("t2d does not mark exactly the target ids d2t maps onto")
    state["d2t"], state["t2d"] = d2t, t2d


def load_head(path: Path, target: ModelArgs, target_head: Tensor | None = None) -> Eagle3Head:
    """The head at ``path`` (float32, CPU) checked against the target's shape.

    ``target_head`` is the target's output projection ``[V, H]``: a head saved with
    ``lm_head_from_target`` takes its draft-vocabulary rows from it.
    """
    cfg, state = read_checkpoint(Path(path))
    state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    own_emb = "embed_tokens.weight" in state
    check_target(cfg, target, own_emb)
    aux_layers(cfg, target)
    check_maps(cfg, state)
    head = Eagle3Head(cfg, with_embedding=own_emb)
    if "lm_head.weight" not in state and cfg.lm_head_from_target:
        if target_head is None:
            raise Eagle3CheckpointError("the head uses the target's LM head; pass it")
        ids = torch.arange(cfg.draft_vocab_size) + state["d2t"]
        state["lm_head.weight"] = target_head.detach().float().cpu()[ids]
    want = head.state_dict()
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise Eagle3CheckpointError(
            f"{path}: missing tensors {missing or 'none'}; unexpected tensors {extra or 'none'}"
        )
    for key, ref in want.items():
        if state[key].shape != ref.shape:
            raise Eagle3CheckpointError(
                f"{path}: {key} is {tuple(state[key].shape)}, the config makes it {tuple(ref.shape)}"
            )
    head.load_state_dict({k: v if k in ("d2t", "t2d") else v.float() for k, v in state.items()})
    return head.eval()
