"""The compiled block call of wide CUDA steps (a prefill), run here on the CPU: the real
compiler (dynamo + Inductor) on a real model, against the eager blocks.

What it must hold: the same logits as eager blocks, for a prefill from position 0 (causal,
no mask tensor) and a continuation over cached positions (a mask tensor); and a fixed number
of compiled graphs for every layer and every length, not one per layer (past dynamo's
recompile limit on a 30-layer model, the rest would run eagerly); and K/V written into the
cache in place (an in-place write into a view of it, functionalised, clones the whole layer).
"""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from mathagent.config import EngineSettings
from mathagent.serving.engine import fp8_format
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.model import ModelArgs, Transformer, call_layer
from mathagent.serving.engine.model_runner import ModelRunner, compiled_layer_call
from mathagent.serving.engine.random_model import RANDOM_SHAPES, fill_random

LAYERS = 5


def _runner() -> ModelRunner:
    args = ModelArgs.from_hf_config({**RANDOM_SHAPES["tiny"], "num_hidden_layers": LAYERS})
    model = fill_random(Transformer(args).float(), seed=3).eval()
    settings = EngineSettings(
        device="cpu", dtype="float32", max_batch_size=2, max_seq_len=256, pack_weights=False
    )  # packed CPU weights are an eager-only layout
    return ModelRunner(model, EngineConfig.from_settings(settings, "random:tiny"))


def _score(runner: ModelRunner, tokens: list[int], start: int) -> torch.Tensor:
    ids = torch.tensor([tokens])
    positions = torch.arange(start, start + len(tokens))[None]
    return runner.forward(ids, positions, [0])[0]


def test_compiled_blocks_equal_eager_blocks_and_compile_once_for_all_layers_and_lengths():
    runner = _runner()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1024, (n,), generator=gen).tolist() for n in (23, 40, 71)]
    eager = []
    for p in prompts:  # a prefill from 0, then 9 tokens more over the cached ones
        eager += [_score(runner, p, 0), _score(runner, p[:9], len(p))]
    assert runner.model.layer_call is call_layer

    runner.cache.k.zero_(), runner.cache.v.zero_()  # the continuations read compiled writes
    runner.model.layer_call = compiled_layer_call()
    before = counters["stats"]["unique_graphs"]
    compiled, code = run_and_get_code(
        lambda: [s for p in prompts for s in (_score(runner, p, 0), _score(runner, p[:9], len(p)))]
    )
    graphs = counters["stats"]["unique_graphs"] - before
    # K/V written in place by the op that declares it, never through a clone of the cache
    assert code and all("kv_write_rows" in c and "clone" not in c for c in code)

    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, atol=2e-4, rtol=1e-4)
    # the causal prefill and the masked continuation, each for layer 0 (dynamo specialises an
    # int argument of 0) and for the rest: 4 graphs for 5 layers x 3 lengths, as for 30 layers
    assert graphs <= 4, f"{graphs} graphs compiled: specialised on the layer or the length"


def test_fp8_products_of_compiled_blocks_quantise_in_torch_ops_as_the_reference():
    """Compiled blocks on CUDA send FP8 products of more than 16 rows through
    ``fp8_format.scaled_linear`` (torch ops Inductor can fuse, then ``torch._scaled_mm``): the
    same product as the reference to bf16's rounding, eagerly and compiled."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(96, 64, generator=gen)
    codes, scale = fp8_format.quantize_rows(w)
    scale = scale.squeeze(-1)
    x = torch.randn(1, 40, 64, generator=gen).bfloat16()
    ref = fp8_format.reference_linear(x, codes, scale)
    # the same codes and scales; the product rounds once into bf16 (at most one ulp apart)
    torch.testing.assert_close(fp8_format.scaled_linear(x, codes, scale), ref, atol=0, rtol=2**-7)
    compiled = torch.compile(fp8_format.scaled_linear, dynamic=True)
    for rows in (40, 23):
        torch.testing.assert_close(
            compiled(x[:, :rows], codes, scale), ref[:, :rows], atol=0.05, rtol=1e-2
        )
