"""Random shapes: the stable variant changes values only, and its greedy path survives the
rounding of multi-row products in bf16 (what acceptance-controlled speculation replays)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import LoadedModel, ModelLoadError, load_model
from mathagent.serving.engine.model import ModelArgs, Transformer
from mathagent.serving.engine.random_model import build, fill_random, stabilize_greedy
from mathagent.serving.engine.sampling_params import SamplingParams

CPU = torch.device("cpu")
# untied, wide enough for the Llama-3-8B margin argument to hold at small scale
SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, architectures=["LlamaForCausalLM"])  # fmt: skip


def test_stable_variant_keeps_shapes_and_block_weights() -> None:
    plain, stable = build("tiny", CPU, torch.float32), build("tiny:stable", CPU, torch.float32)
    a, b = dict(plain.named_parameters()), dict(stable.named_parameters())
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape and a[name].dtype == b[name].dtype
        changed = name in ("tok_embeddings.weight", "output.weight")
        assert changed != torch.equal(a[name], b[name]), name


def test_unknown_variant_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="tiny:wobbly"):
        load_model("random:tiny:wobbly", tmp_path, CPU, torch.float32)
    assert (
        load_model("random:tiny:stable", tmp_path, CPU, torch.float32).name == "random:tiny:stable"
    )


def engine_on(model: Transformer) -> LLMEngine:
    config = EngineConfig(model=None, device=CPU, dtype=torch.bfloat16, max_batch_size=2,
                          max_seq_len=128, speculative="none", draft_len=3, draft_beams=1,
                          eager=True, threads=None)  # fmt: skip
    return LLMEngine(config, None, LoadedModel(model, None, "random:test", None, ()))


@pytest.mark.parametrize("stable", [False, True])
def test_greedy_path_of_the_stable_variant_survives_wide_products(stable: bool) -> None:
    model = fill_random(Transformer(ModelArgs.from_hf_config(SHAPE)).eval())
    if stable:
        stabilize_greedy(model)
    engine = engine_on(model.to(torch.bfloat16))
    prompt = torch.randint(0, 4096, (6,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    (res,) = engine.generate([prompt], params)  # one-row decode steps
    seq = torch.tensor([prompt + res.token_ids])
    # the whole path scored again in one 54-row forward (other products, other rounding)
    logits, _ = engine.runner.forward(seq, torch.arange(seq.shape[1])[None], [1])
    top = logits[0, len(prompt) - 1 : -1].float().topk(2, dim=-1)
    margins = top.values[:, 0] - top.values[:, 1]
    if stable:
        assert top.indices[:, 0].tolist() == res.token_ids
        assert margins.min() > 1.0  # plain random weights: a fraction of that
    else:
        assert margins.median() < 1.0  # near-ties: rounding decides the path
