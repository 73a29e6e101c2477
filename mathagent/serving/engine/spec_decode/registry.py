"""The proposer factory: the proposer a ``--speculative`` method names, built on first use.

Loading is where a method meets the target: a ReDrafter checkpoint must be shaped for its
vocabulary and hidden size (and drafts through the target's own head when tied to it), a draft
model must share its vocabulary. Whatever cannot load is a :class:`SpecMethodError`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from mathagent.serving.engine.loader import ModelLoadError, load_model
from mathagent.serving.engine.quant import Fp8Linear, Int8Linear
from mathagent.serving.engine.spec_config import SpecMethod, SpecMethodError
from mathagent.serving.engine.spec_decode import draft_model_device, redrafter_device
from mathagent.serving.engine.spec_decode.draft_model import DraftModelProposer, draft_runner
from mathagent.serving.engine.spec_decode.draft_model_device import FusedDraftModel
from mathagent.serving.engine.spec_decode.eagle3 import Eagle3Proposer
from mathagent.serving.engine.spec_decode.eagle3_loader import aux_layers, load_head
from mathagent.serving.engine.spec_decode.ngram import NgramDrafts, NgramProposer
from mathagent.serving.engine.spec_decode.ngram_device import FusedNgram
from mathagent.serving.engine.spec_decode.proposal import Proposer
from mathagent.serving.engine.spec_decode.redrafter import Drafter, ReDrafterProposer
from mathagent.serving.engine.spec_decode.redrafter_device import FusedReDrafter

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner


class Proposers:
    """The target's proposer for each method, each loaded (weights and all) once."""

    def __init__(self, target: ModelRunner, beams: int, model_dir: Path) -> None:
        self.target = target
        self.beams = beams
        self.model_dir = model_dir  # where a draft model's GGUF is converted
        self._built: dict[SpecMethod, Proposer] = {}

    def get(self, method: SpecMethod) -> Proposer | None:
        """The proposer for ``method``, loaded on first use; None for ``none``."""
        if method.kind == "none":
            return None
        if method not in self._built:
            self._built[method] = load_proposer(method, self.target, self.beams, self.model_dir)
        return self._built[method]

    def copied_prefix(self, src: int, dst: int, length: int) -> None:
        """A prompt's prefix was copied from slot ``src`` into ``dst``: drafters that keep
        something per cached position (EAGLE-3's features and layer K/V) copy theirs too, or
        the new row would draft from another request's stale state."""
        for proposer in self._built.values():
            copy = getattr(proposer, "copy_prefix", None)
            if copy is not None:
                copy(src, dst, length)

    def register(self, method: SpecMethod, proposer: Proposer) -> None:
        """Use ``proposer`` for ``method`` (already-built drafters, e.g. in tests)."""
        self._built[method] = proposer


def head_rows(head: nn.Module, rows: Tensor | None) -> Callable[[Tensor], Tensor]:
    """The target's vocabulary head restricted to ``rows`` (a draft vocabulary), same numerics."""
    if rows is None:
        return head
    if isinstance(head, Int8Linear):
        return head.rows(rows)
    if isinstance(head, Fp8Linear):  # a drafter's rows in bf16: its drafts are verified anyway
        return HeadRows(head.dequantized()[rows.to(head.weight.device)])
    return HeadRows(head.weight.detach()[rows.to(head.weight.device)])


class HeadRows:
    """Rows of a float vocabulary head, callable as the head is; ``rows_weight`` [V', H] lets a
    drafter multiply them inside its own fused kernels."""

    def __init__(self, weight: Tensor) -> None:
        self.rows_weight = weight

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x.to(self.rows_weight.dtype), self.rows_weight)


def load_proposer(method: SpecMethod, target: ModelRunner, beams: int, model_dir: Path) -> Proposer:
    """Build the proposer a method names (loading its weights)."""
    if method.kind == "ngram":
        lookup = NgramProposer()
        fused = FusedNgram(lookup, target) if target.graphs is not None else None
        return NgramDrafts(lookup, fused)
    assert method.path is not None
    if method.kind == "eagle3":
        return load_eagle3(Path(method.path), target, beams)
    if method.kind == "redrafter":
        emb = target.model.tok_embeddings.weight
        try:
            drafter = Drafter.from_pretrained(
                Path(method.path).expanduser(), emb.detach().float().cpu()
            )
        except (OSError, ValueError) as exc:
            raise SpecMethodError(f"cannot load ReDrafter {method.path!r}: {exc}") from exc
        if drafter.config.vocab_size != emb.shape[0] or drafter.config.hidden_size != emb.shape[1]:
            raise SpecMethodError(
                f"ReDrafter {method.path!r} is shaped for vocab {drafter.config.vocab_size} x "
                f"hidden {drafter.config.hidden_size}, the target is {emb.shape[0]} x {emb.shape[1]}"
            )
        proposer = ReDrafterProposer(drafter, emb.detach(), beams)
        if drafter.config.lm_head_from_base and target.model.args.tie_word_embeddings:
            # the drafter's head is the target's own: share its (possibly quantized) projection
            drafter.use_head(head_rows(target.model.output, drafter.draft_vocab))
        if redrafter_device.ENABLED and target.graphs is not None:
            proposer.fused = FusedReDrafter(proposer, target)
        return proposer
    try:
        loaded = load_model(method.path, model_dir, target.device, target.config.dtype)
        proposer = DraftModelProposer(draft_runner(loaded.model, target))
    except (ModelLoadError, ValueError, OSError) as exc:
        raise SpecMethodError(f"cannot load draft model {method.path!r}: {exc}") from exc
    if draft_model_device.ENABLED and target.graphs is not None:
        proposer.fused = FusedDraftModel(proposer, target)
    return proposer


def load_eagle3(path: Path, target: ModelRunner, beams: int) -> Eagle3Proposer:
    """An EAGLE-3 head checked against the target; one tied to the target's LM head drafts
    through that head's (possibly quantized) rows."""
    output = target.model.output
    if isinstance(output, Int8Linear):
        weight = _dequantized(output)
    else:
        weight = output.dequantized() if isinstance(output, Fp8Linear) else output.weight
    try:
        head = load_head(path, target.model.args, weight)
    except (OSError, ValueError) as exc:
        raise SpecMethodError(f"cannot load EAGLE-3 head {str(path)!r}: {exc}") from exc
    capture = target.model.capture
    if capture and capture != aux_layers(head.config, target.model.args):
        raise SpecMethodError(f"another EAGLE-3 head already reads layers {capture}")
    proposer = Eagle3Proposer(head, target, beams)
    if head.config.lm_head_from_target:
        proposer.use_head(head_rows(output, proposer.ids))
    return proposer


def _dequantized(head: Int8Linear) -> Tensor:
    """The float weight [V, H] of an int8 head (codes times per-row scales)."""
    return head.codes.float() * head.scales.float()[:, None]
