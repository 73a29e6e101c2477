"""Speculative decoding in the engine: greedy output identical to plain greedy, for every method.

Real default model (fp32, CPU), the conftest's 20 prompts, batched (8 slots) and one at a time.
Draft model: the default model's first 4 layers with its own final norm and embedding (a
layer-skip draft that shares the tokenizer). ReDrafter: the drafter shipped for the default model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mathagent.serving.engine.sampling_params import SamplingParams
from tests.conftest import PROMPTS

MAX_NEW = 16
SINGLE = (2, 3, 11, 18)  # also run alone: the shortest, the longest, a chat turn
SHIPPED_DRAFTER = (
    Path(__file__).resolve().parents[4] / "mathagent/serving/drafters/SmolLM2-135M-Instruct"
)


@pytest.fixture(scope="module")
def layer_skip_draft(engine, tmp_path_factory) -> Path:
    """An HF folder holding the default model's first 4 layers (shares its tokenizer)."""
    src = engine.loaded.path
    out = tmp_path_factory.mktemp("draft4")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (out / "config.json").write_text(json.dumps(cfg))
    state: dict[str, torch.Tensor] = {}
    for file in src.glob("*.safetensors"):
        state.update(load_file(str(file)))
    keep = {
        k: v
        for k, v in state.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < 4
    }
    save_file(keep, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="module")
def plain(engine) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    return [r.token_ids for r in engine.generate(PROMPTS, params)]


def _methods(draft: Path) -> list[str]:
    return ["ngram", f"draft:{draft}", f"redrafter:{SHIPPED_DRAFTER}"]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["ngram", "draft", "redrafter"])
def test_greedy_speculation_is_token_identical(engine, plain, layer_skip_draft, index) -> None:
    method = _methods(layer_skip_draft)[index]
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, speculative=method)
    batched = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in batched] == plain
    # one at a time: a few prompts of different lengths suffice (the batch above covers all 20)
    single = [engine.generate([PROMPTS[i]], params)[0] for i in SINGLE]
    assert [r.token_ids for r in single] == [plain[i] for i in SINGLE]
    stats = [r.metrics.speculative for r in batched + single]
    assert all(s is not None and s["acceptance_length"] >= 1.0 for s in stats)
    drafted = sum(s["drafted_tokens"] for s in stats)
    accepted = sum(s["accepted_tokens"] for s in stats)
    assert drafted > 0 and 0 < accepted <= drafted
    totals = [len(r.token_ids) for r in batched]
    forwards = [len(r.token_ids) / r.metrics.speculative["acceptance_length"] for r in batched]
    assert sum(forwards) < sum(totals)  # speculation saved target forwards


def test_redrafter_chain_through_the_target_head_is_token_identical(engine, plain) -> None:
    """One beam, an argmax chain (the CPU int4 default; elsewhere four beams, a prefix tree)."""
    from mathagent.serving.engine.spec_config import SpecMethod
    from mathagent.serving.engine.spec_decode.registry import load_proposer

    assert engine.config.draft_beams == 4  # the parametrized test above covers the tree
    method = SpecMethod("redrafter", f"{SHIPPED_DRAFTER}/")  # a key of its own: one beam
    proposer = load_proposer(method, engine.runner, 1, engine.speculator.proposers.model_dir)
    # it drafts through the target's own head, restricted to the drafter's draft vocabulary
    drafter, x = proposer.drafter, torch.randn(2, 576)
    assert drafter.draft_vocab is not None and drafter._head is not None
    full = engine.runner.model.logits(x)[:, drafter.draft_vocab]
    torch.testing.assert_close(drafter._head(x).float(), full, rtol=1e-4, atol=1e-4)
    engine.speculator.proposers.register(method, proposer)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, speculative=str(method))
    batched = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in batched] == plain
    stats = [r.metrics.speculative for r in batched]
    assert sum(s["accepted_tokens"] for s in stats) > 0
    assert all(s["draft_ms_per_step"] > 0 and s["verify_ms_per_step"] > 0 for s in stats)


def test_engine_counts_acceptance_overall(engine) -> None:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, speculative="ngram")
    engine.generate(["1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"], params)
    stats = engine.speculator.stats.as_dict()
    assert stats["drafted_tokens"] >= stats["accepted_tokens"] > 0
    assert len(stats["per_position_acceptance"]) >= 1


def test_unknown_method_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="none \\| ngram"):
        SamplingParams(speculative="medusa")


def test_generate_cli_reports_acceptance_and_bad_drafters() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "MATHAGENT_ENGINE__DEVICE": "cpu", "MATHAGENT_ENGINE__MAX_SEQ_LEN": "256"}
    cmd = [sys.executable, "-m", "mathagent", "generate", "1, 2, 3, 1, 2, 3, 1, 2, 3, 1,"]
    done = subprocess.run(
        [*cmd, "--max-tokens", "12", "--speculative", "ngram", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["acceptance_length"] > 1.0
    assert out["drafted_tokens"] >= out["accepted_tokens"] > 0
    assert out["per_position_acceptance"]
    bad = subprocess.run(
        [*cmd, "--speculative", "redrafter:/nonexistent/drafter"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "cannot load ReDrafter" in bad.stderr and "Traceback" not in bad.stderr


def test_a_one_token_prompt_speculates_from_its_second_step(engine, layer_skip_draft) -> None:
    """A one-token prompt has no prefill: its first step decodes the prompt's token itself,
    before any position holds the target's features. EAGLE-3 drafted there anyway and the step
    raised, failing every request in it (the soak's ``{"prompt": "x"}``: 500s, CI of 8c450f9).
    Alone, beside longer prompts, greedy and sampled: the same tokens as plain greedy."""
    from mathagent.runtime import SHIPPED_EAGLE3

    prompts: list[str | list[int]] = [[87], PROMPTS[0], [87, 88], [87]]
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    plain = [r.token_ids for r in engine.generate(prompts, greedy)]
    for method in [*_methods(layer_skip_draft), f"eagle3:{SHIPPED_EAGLE3}"]:
        params = SamplingParams(max_tokens=8, temperature=0.0, speculative=method)
        assert [r.token_ids for r in engine.generate(prompts, params)] == plain, method
        assert engine.generate([[87]], params)[0].token_ids == plain[0], method
        sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=1, speculative=method)
        assert all(r.finish_reason in {"length", "stop"} for r in engine.generate(prompts, sampled))
