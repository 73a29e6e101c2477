"""Random-weight models of real shapes, for tests and speed measurements (``random:<shape>``).

Speed at batch 1 depends on the bytes a step reads, not on the weights' values, so engine
speed is measured on random weights of real shapes (benchmarks/gpu_common.py builds transformers
twins of the same shapes). ``random:<shape>:stable`` changes values only, never shapes or
dtypes: each token's greedy successor then wins by a wide logit margin (see
:func:`stabilize_greedy`), so a one-row decode step, a batched step and a verify-wide step
decode the same tokens in bf16 and fp8 too. Plain random weights nearly tie their top logits
(median top-2 gap 0.13 on a 4-layer Llama-3-8B slice in bf16, CPU), so the rounding of a
5-row product already changes the greedy path within 10 tokens; acceptance-controlled
speculation (the replay proposer of benchmarks/gpu_spec.py and replay_server.py) replays a
recorded continuation and needs the stable variant wherever the policy mixes plain and verify
steps outside float32.
"""

from __future__ import annotations

from typing import Any

import torch

from mathagent.serving.engine.model import ModelArgs, Transformer

# Named shapes (Hugging Face config fields) for tests and benchmarks, the GPU ones included:
RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"]),
    "tiny-qwen2": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       architectures=["Qwen2ForCausalLM"]),
    "tiny-qwen3": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       architectures=["Qwen3ForCausalLM"]),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         rope_theta=100000.0, tie_word_embeddings=True,
                         architectures=["LlamaForCausalLM"]),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=8192),
                         max_position_embeddings=131072, architectures=["LlamaForCausalLM"]),
    "llama-3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                       architectures=["LlamaForCausalLM"]),
}  # fmt: skip

# Embedding scale of the stable variant: the token's own embedding outweighs what the blocks
# add to the residual stream (about 15:1 in norm on the 8B shape), so the final state points
# at the current token.
STABLE_EMBEDDING_SCALE = 1e4


class RandomShapeError(ValueError):
    """The random: spec names no known shape or variant."""


def build(spec: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Transformer:
    """The model of ``spec`` = ``<shape>`` or ``<shape>:stable``, N(0, 0.02) weights, norms 1."""
    shape, _, variant = spec.partition(":")
    if shape not in RANDOM_SHAPES or variant not in ("", "stable"):
        raise RandomShapeError(f"unknown random model {spec!r}")
    args = ModelArgs.from_hf_config(RANDOM_SHAPES[shape])
    with torch.device("meta"):
        model = Transformer(args)
    model = fill_random(model.to(dtype).to_empty(device=device), seed)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    if variant == "stable":
        stabilize_greedy(model, seed)
    return model.eval()


@torch.no_grad()
def fill_random(model: Transformer, seed: int = 0) -> Transformer:
    """Norm weights 1, every other parameter N(0, 0.02), in place."""
    gen = torch.Generator(device=model.norm.weight.device).manual_seed(seed)
    for pname, param in model.named_parameters():
        if pname.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
    return model


@torch.no_grad()
def stabilize_greedy(model: Transformer, seed: int = 0) -> Transformer:
    """Give ``model`` a greedy path that rounding cannot change, in place.

    The head's rows become the embeddings in a fixed random order (a tied head stays the
    embedding) and the embedding table is scaled by :data:`STABLE_EMBEDDING_SCALE`: the
    final state is then close to the current token's embedding, whose dot product with its own
    row (about d * 0.02**2 / rms) beats every other row's by ~75 logits on the 8B shape, so the
    successor of each token is fixed (a cycle through the vocabulary; the token itself when
    the head is tied). Every other weight keeps its random values.
    """
    emb, head = model.tok_embeddings.weight, model.output.weight
    if head is not emb:
        gen = torch.Generator().manual_seed(seed + 1)
        order = torch.randperm(emb.shape[0], generator=gen).to(emb.device)
        head.copy_(emb[order])
    emb.mul_(STABLE_EMBEDDING_SCALE)
    return model
