"""The small float32 target the one-graph proposers' CUDA tests share, and its engines."""

from __future__ import annotations

from pathlib import Path

import torch

SHAPE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"])  # fmt: skip


def sharp_model() -> torch.nn.Module:
    """The SHAPE target on CUDA with sharp random weights (seed 0): greedy has clear winners."""
    from mathagent.serving.engine.model import ModelArgs, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf_config(SHAPE)).to("cuda").eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.1)
    return model


def engine(model, eager: bool, speculative: str = "none", draft_len: int = 3, beams: int = 1):
    """An LLMEngine over ``model`` (float32, 4 rows, fixed draft length)."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel

    config = EngineConfig(model=None, device=torch.device("cuda"), dtype=torch.float32,
                          max_batch_size=4, max_seq_len=256, speculative=speculative,
                          draft_len=draft_len, draft_beams=beams, threads=None, eager=eager,
                          adaptive_draft=False)  # fmt: skip
    return LLMEngine(config, Path("/nonexistent"), LoadedModel(model, None, "random", None, ()))
