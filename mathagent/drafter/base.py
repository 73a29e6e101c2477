"""The frozen base model as drafter training sees it, on a runner and KV cache of its own.

Training and self-distillation run forwards on KV-cache slots they pick themselves. They do so
on a :class:`~mathagent.serving.engine.model_runner.ModelRunner` built here from the loaded
weights (shared, never copied) with its own cache, never on a serving engine's: a server's
scheduler owns its slots alone, so the prefixes its freed slots keep stay valid.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.loader import LoadedModel, load_model
from mathagent.serving.engine.model import Transformer
from mathagent.serving.engine.model_runner import ModelRunner


class FrozenBase:
    """A loaded base model, its tokenizer, and a runner whose KV cache nothing else uses."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.config = config
        self.runner = ModelRunner(loaded.model, config)  # allocates a KV cache of its own

    @classmethod
    def load(cls, config: EngineConfig, model_dir: Path) -> FrozenBase:
        """Load ``config.model`` (a resolved spec) as the engine would, then build the runner."""
        if config.model is None:
            raise ValueError("name the base model to train a drafter for")
        loaded = load_model(
            config.model, model_dir, config.device, config.dtype, config.quantization
        )
        return cls(loaded, config)

    @property
    def model(self) -> Transformer:
        """The base's weights (frozen)."""
        return self.loaded.model

    @property
    def tokenizer(self):
        """The base's tokenizer, or None for a model without one."""
        return self.loaded.tokenizer

    @property
    def slots(self) -> int:
        """KV-cache slots: the most sequences one forward may hold."""
        return self.config.max_batch_size

    @property
    def max_seq_len(self) -> int:
        """Context length per slot."""
        return self.config.max_seq_len

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the engine encodes prompts (no special tokens added)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def features(self, batch: list[list[int]]) -> list[tuple[Tensor, Tensor]]:
        """Per token list: the base's final hidden states ``[T, H]`` and greedy next tokens ``[T]``.

        Rows go to slots 0..B-1 from position 0 (padded to the longest; padding only writes its
        own slot's cache past the row's end); results stay on the runner's device.
        """
        runner = self.runner
        longest = max(len(t) for t in batch)
        if longest > runner.max_seq_len:
            raise ValueError(f"a training sequence of {longest} tokens exceeds the context")
        toks = torch.zeros(len(batch), longest, dtype=torch.long)
        for b, t in enumerate(batch):
            toks[b, : len(t)] = torch.tensor(t)
        pos = torch.arange(longest)[None].expand(len(batch), -1)
        slots = list(range(len(batch)))
        _, hidden = runner.forward(toks.to(runner.device), pos.to(runner.device), slots,
                                   hidden_only=True)  # fmt: skip
        out = []
        for b, t in enumerate(batch):
            h = hidden[b, : len(t)].float()
            preds = torch.cat([self.model.logits(c).argmax(-1) for c in h.split(1024)])
            out.append((h, preds))
        return out
