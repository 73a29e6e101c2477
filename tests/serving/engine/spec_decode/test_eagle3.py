"""EAGLE-3: the published checkpoint layout, its refusals, training = inference, and the engine
(greedy token-identical to plain on the real default model in float32; sampling exact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mathagent.config import EngineSettings
from mathagent.drafter.eagle3_data import Batch
from mathagent.drafter.eagle3_train import ttt_logits
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model
from mathagent.serving.engine.model import ModelArgs, rope_table
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod, embedded_method
from mathagent.serving.engine.spec_decode.eagle3_head import (
    Eagle3CheckpointError,
    Eagle3Config,
    Eagle3Head,
    attend,
)
from mathagent.serving.engine.spec_decode.eagle3_loader import load_head
from mathagent.serving.engine.spec_decode.ngram import NgramProposer
from mathagent.serving.engine.spec_decode.registry import load_eagle3
from tests.conftest import PROMPTS
from tests.serving.engine.spec_decode.eagle3_fixture import (
    reference_tensors,
    smollm_head_config,
    write_reference_head,
)
from tests.serving.engine.spec_decode.pattern_policy import after_plain_against_every_step
from tests.serving.engine.spec_decode.stats import chi_square_p
from tests.serving.engine.spec_decode.test_spec_sampling import PARAMS, PROMPT, SAMPLES
from tests.serving.engine.spec_decode.test_spec_sampling import _exact_marginals as exact_marginals

SMOLLM = ModelArgs("LlamaForCausalLM", 49152, 576, 1536, 30, 9, 3, 64, tie_word_embeddings=True)


def test_a_reference_layout_head_loads_and_saves_the_same_keys(tmp_path: Path) -> None:
    cfg = smollm_head_config()
    tensors = reference_tensors(cfg)
    head = load_head(write_reference_head(tmp_path / "ref", cfg, tensors), SMOLLM)
    for key, value in tensors.items():
        torch.testing.assert_close(head.state_dict()[key], value.to(head.state_dict()[key].dtype))
    assert head.config.draft_vocab_size == 2048 and head.config.aux_layer_ids is None
    ids = head.target_ids()
    assert bool(tensors["t2d"][ids].all()) and ids.unique().numel() == 2048
    head.save_pretrained(tmp_path / "again")
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(tensors)
    raw = json.loads((tmp_path / "again" / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["draft_vocab_size"] == 2048
    assert raw["max_position_embeddings"] == 2048  # keys the project does not read are kept


@pytest.mark.parametrize(
    ("change", "drop", "message"),
    [
        ({"hidden_size": 512, "num_attention_heads": 8}, (), "target hidden states of size 512"),
        ({"target_hidden_size": 1024}, (), "hidden states of size 1024"),
        ({"vocab_size": 32000}, (), "vocabulary of 32000"),
        ({}, ("d2t",), "lacks d2t"),
        ({}, ("t2d",), "lacks t2d"),
        ({}, ("midlayer.mlp.up_proj.weight",), "missing tensors .*up_proj"),
        ({"num_hidden_layers": 2}, (), "one decoder layer"),
        ({"eagle_aux_hidden_state_layer_ids": [2, 15, 40]}, (), "must name 3 distinct layers"),
    ],
)
def test_a_mismatched_head_is_refused_clearly(tmp_path: Path, change, drop, message) -> None:
    cfg = smollm_head_config()
    tensors = reference_tensors(cfg)
    cfg.update(change)
    for key in drop:
        del tensors[key]
    with pytest.raises(Eagle3CheckpointError, match=message):
        load_head(write_reference_head(tmp_path, cfg, tensors), SMOLLM)


def test_wrong_shapes_and_bad_maps_are_refused(tmp_path: Path) -> None:
    cfg = smollm_head_config()
    bad = reference_tensors(cfg)
    bad["fc.weight"] = bad["fc.weight"][:, :1000]
    with pytest.raises(Eagle3CheckpointError, match=r"fc.weight is \(576, 1000\)"):
        load_head(write_reference_head(tmp_path / "a", cfg, bad), SMOLLM)
    dup = reference_tensors(cfg)
    dup["d2t"][1] = dup["d2t"][0] - 1  # draft ids 0 and 1 onto one target id
    with pytest.raises(Eagle3CheckpointError, match="onto one id twice"):
        load_head(write_reference_head(tmp_path / "b", cfg, dup), SMOLLM)


def _small_head(seed: int = 0) -> Eagle3Head:
    cfg = Eagle3Config(32, 48, 4, 2, 100, 60)
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    head.set_draft_vocab(torch.randperm(100)[:60])
    return head


def test_fused_projections_compute_what_the_separate_modules_do() -> None:
    """Serving's q/k/v and gate/up products, each one product over copied rows, give the
    layer's outputs of the separate modules training keeps."""
    head = _small_head()
    mid = head.midlayer
    emb, hidden = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    cos, sin = rope_table(head.config.layer_args(), 16)
    pos = torch.arange(3, 8)
    trig = (cos[pos][None, :, None], sin[pos][None, :, None])
    with torch.no_grad():
        separate = mid.project(emb, hidden, *trig)
        out = mid.finish(separate[0], attend(*separate[1:], None))
        mid.fuse_projections()
        fused = mid.project(emb, hidden, *trig)
        for a, b in zip(separate, fused, strict=True):
            torch.testing.assert_close(b, a)
        torch.testing.assert_close(mid.finish(fused[0], attend(*fused[1:], None)), out)
    assert mid.qkv is not None and mid.mlp.gate_up is not None


def test_the_training_time_test_is_what_a_drafted_chain_computes() -> None:
    """Step s at t of the unrolled training forward equals drafting s tokens after position t
    with the layer's KV cache over 0..t and the chain's own keys (as the proposer drafts)."""
    head, emb = _small_head(), torch.randn(100, 32)
    t_len, steps = 7, 3
    tokens = torch.randint(0, 100, (1, t_len))
    batch = Batch(torch.randn(1, t_len, 96), tokens, tokens, torch.tensor([t_len]), torch.zeros(1))
    cos, sin = rope_table(head.config.layer_args(), 16)
    with torch.no_grad():
        trained = ttt_logits(head, emb, batch, steps, (cos, sin))
        mid, g = head.midlayer, head.fc(batch.aux)
        t = 3
        keys, values, hidden = [], [], None
        for s in range(steps):  # position t's chain: context 0..t from step 0, then its own keys
            inp = g[:, : t + 1] if s == 0 else hidden
            pos = torch.arange(t + 1) if s == 0 else torch.tensor([t + s])
            tok = tokens[:, 1 + s : t + 2 + s] if s == 0 else tokens[:, t + 1 + s : t + 2 + s]
            res, q, k, v = mid.project(
                emb[tok], inp, cos[pos][None, :, None], sin[pos][None, :, None]
            )
            keys.append(k)
            values.append(v)
            mask = None
            if s == 0:
                mask = (torch.arange(t + 1)[None] <= torch.arange(t + 1)[:, None])[None, None]
            out = mid.finish(res, attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask))
            hidden = out[:, -1:]
            torch.testing.assert_close(head.logits(hidden)[0, 0], trained[s][0, t])


@pytest.fixture(scope="module")
def heads(engine, tmp_path_factory):
    """A random head in the reference layout, as the engine's tree and as a chain."""
    path = tmp_path_factory.mktemp("eagle3")
    cfg = smollm_head_config()
    tensors = reference_tensors(cfg)
    # drafts that are sometimes right: the head scores with the target's own rows
    tensors["lm_head.weight"] = engine.runner.model.output.weight.detach()[
        torch.arange(2048) + tensors["d2t"]
    ].half()
    write_reference_head(path, cfg, tensors)
    chain = SpecMethod("eagle3", f"{path}#chain")
    engine.speculator.proposers.register(chain, load_eagle3(path, engine.runner, 1))
    shipped = Path(__file__).resolve().parents[4] / "mathagent/serving/drafters"
    shipped = shipped / "SmolLM2-135M-Instruct-eagle3"
    shipped_chain = SpecMethod("eagle3", f"{shipped}#chain")  # the shipped head, one beam
    engine.speculator.proposers.register(shipped_chain, load_eagle3(shipped, engine.runner, 1))
    yield [f"eagle3:{path}", str(chain), f"eagle3:{shipped}", str(shipped_chain)]
    engine.runner.feature_sinks.clear()
    engine.runner.model.capture = ()


def test_greedy_eagle3_is_token_identical_to_plain(engine, heads) -> None:
    plain = engine.generate(PROMPTS[:6], SamplingParams(max_tokens=16, temperature=0.0))
    for method in heads:
        params = SamplingParams(max_tokens=16, temperature=0.0, speculative=method)
        batched = engine.generate(PROMPTS[:6], params)
        one = engine.generate(PROMPTS[:1], params)
        assert [r.token_ids for r in batched] == [r.token_ids for r in plain], method
        assert one[0].token_ids == plain[0].token_ids
        spec = batched[0].metrics.speculative
        assert spec["drafted_tokens"] > 0 and len(spec["per_position_acceptance"]) > 0


@pytest.fixture(scope="module")
def tiny_engine() -> LLMEngine:
    """The sampling test's tiny random target with a random EAGLE-3 head of half its vocab."""
    # Every step verifies drafts (no plain fallback), so the test sees the lossless rule at work.
    settings = EngineSettings(
        device="cpu", dtype="float32", max_batch_size=48, max_seq_len=64, adaptive_draft=False
    )
    config = EngineConfig.from_settings(settings, "random:tiny")
    loaded = load_model("random:tiny", Path("/nonexistent"), config.device, config.dtype)
    with torch.no_grad():
        loaded.model.output.weight.mul_(12.0)
    engine = LLMEngine(config, Path("/nonexistent"), loaded)
    args = loaded.model.args
    cfg = Eagle3Config(args.hidden_size, 96, args.num_heads, args.num_kv_heads, args.vocab_size,
                       args.vocab_size // 2, head_dim=args.head_dim, aux_layer_ids=(0, 1, args.num_layers))  # fmt: skip
    torch.manual_seed(1)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        head.lm_head.weight.mul_(8.0)
    head.set_draft_vocab(torch.randperm(args.vocab_size)[: args.vocab_size // 2])
    path = Path(__file__).parent  # only the method's name; the head is registered built
    from mathagent.serving.engine.spec_decode.eagle3 import Eagle3Proposer

    engine.speculator.proposers.register(
        SpecMethod("eagle3", str(path)), Eagle3Proposer(head, engine.runner, 2)
    )
    return engine


def test_eagle3_sampling_matches_the_target_distribution(tiny_engine) -> None:
    exact = exact_marginals(tiny_engine, 3)
    method = f"eagle3:{Path(__file__).parent}"
    params = [
        SamplingParams(max_tokens=3, seed=i, speculative=method, **PARAMS) for i in range(SAMPLES)
    ]
    results = tiny_engine.generate([PROMPT] * SAMPLES, params)
    for pos in range(3):
        counts = torch.bincount(torch.tensor([r.token_ids[pos] for r in results]), minlength=1024)
        assert chi_square_p(counts, exact[pos]) > 0.01, pos
    drafted = sum(r.metrics.speculative["drafted_tokens"] for r in results)
    accepted = sum(r.metrics.speculative["accepted_tokens"] for r in results)
    # Every sample drafted. How many drafts a random head lands on a random target's top-4 is
    # luck of the two initialisations (0 of 7200 since the merged speculator and loader), so the
    # claim here is the lossless rule above, with drafting really in the loop.
    assert drafted >= SAMPLES and 0 <= accepted < drafted


def test_generate_cli_runs_eagle3_and_refuses_a_bad_head(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    cfg = smollm_head_config()
    head = write_reference_head(tmp_path / "head", cfg, reference_tensors(cfg))
    env = {**os.environ, "MATHAGENT_ENGINE__DEVICE": "cpu", "MATHAGENT_ENGINE__MAX_SEQ_LEN": "256"}
    cmd = [sys.executable, "-m", "mathagent", "generate", "1, 2, 3, 1, 2, 3, 1, 2, 3, 1,"]
    done = subprocess.run(
        [*cmd, "--max-tokens", "8", "--speculative", f"eagle3:{head}", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["drafted_tokens"] > 0 and "per_position_acceptance" in out
    assert out["draft_ms_per_step"] > 0 and out["verify_ms_per_step"] > 0
    (head / "config.json").write_text(json.dumps({**cfg, "hidden_size": 1024}))
    bad = subprocess.run(
        [*cmd, "--speculative", f"eagle3:{head}"], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "cannot load EAGLE-3 head" in bad.stderr and "Traceback" not in bad.stderr


def test_batched_chains_draft_what_row_by_row_drafting_does(engine, heads) -> None:
    """The batched chain drafter (one CUDA graph on a GPU) re-settles a window per row; its
    drafts, and so the acceptance at every position, equal drafting row by row."""
    proposer = engine.speculator.proposer(embedded_method(heads[3]))  # the shipped head's chain
    params = SamplingParams(max_tokens=24, temperature=0.0, speculative=heads[3])
    batched = engine.generate(PROMPTS[:3], params)
    chains, proposer.chains = proposer.chains, None
    try:
        rowwise = engine.generate(PROMPTS[:3], params)
    finally:
        proposer.chains = chains
    same = ("drafted_at", "accepted_at", "target_forwards")
    for a, b in zip(batched, rowwise, strict=True):
        assert a.token_ids == b.token_ids
        assert {k: a.metrics.speculative[k] for k in same} == {
            k: b.metrics.speculative[k] for k in same
        }
    assert sum(r.metrics.speculative["accepted_tokens"] for r in batched) > 10


@pytest.mark.parametrize("beams", [1, 4])  # the shipped head's chain and its tree
def test_a_step_after_plain_ones_drafts_as_drafting_every_step_does(engine, heads, beams) -> None:
    """The head catches up on positions decoded plainly: a speculative step right after plain
    ones lands what drafting every step lands at the same committed length (the policy's
    probes judge speculation on such steps; run 113, H200, T 0.7: 0.27 of first drafts landed
    in the policy's 22 steps against 0.58 drafting every step)."""
    method = heads[3] if beams == 1 else heads[2]
    params = SamplingParams(max_tokens=32, temperature=0.0, speculative=method)
    policy = engine.speculator.policy
    try:
        matched = after_plain_against_every_step(engine, PROMPTS[:3], params, 3)
    finally:
        engine.speculator.policy = policy
    first = [(here, every) for index, here, every in matched if index == 0]
    assert len(first) >= 3 and sum(every for _, _, every in matched) > 0
    assert [m[1] for m in matched] == [m[2] for m in matched]


REPEATING = (
    "<|im_start|>user\nCopy this line five times: The robe takes 8 bolts of blue fiber and "
    "half that much white fiber.<|im_end|>\n<|im_start|>assistant\n"
)


def test_the_lookup_branch_keeps_plain_greedy_and_lands_what_the_head_cannot(engine, heads) -> None:
    """A greedy chain verifies the prompt-lookup draft beside it (a two-beam tree): the output
    stays plain greedy, and on text that repeats the problem's rare words (outside the head's
    draft vocabulary) each target forward keeps more tokens than with the head's chain alone;
    a lookup longer than the chain (``lookup_len``) keeps more again."""
    shipped = Path(heads[2].split(":", 1)[1])
    runs = {}
    for lookup, length in ((True, 0), (True, 10), (False, 0)):
        method = SpecMethod("eagle3", f"{shipped}#lookup-{lookup}-{length}")
        proposer = load_eagle3(shipped, engine.runner, 1)
        assert proposer.lookup is None  # 'auto' is off on a CPU
        assert proposer.lookup_depth(3) == 3  # and 'auto' does not lengthen it there
        proposer.lookup = NgramProposer() if lookup else None
        proposer._lookup_len = length
        engine.speculator.proposers.register(method, proposer)
        params = SamplingParams(max_tokens=48, temperature=0.0, speculative=str(method))
        runs[lookup, length] = engine.generate([REPEATING], params)[0]
        engine.runner.feature_sinks.remove(proposer.fuse)
    plain = engine.generate([REPEATING], SamplingParams(max_tokens=48, temperature=0.0))[0]
    assert all(r.token_ids == plain.token_ids for r in runs.values())
    per_forward = {k: r.metrics.speculative["acceptance_length"] for k, r in runs.items()}
    assert per_forward[True, 0] > per_forward[False, 0] + 0.5, per_forward
    assert per_forward[True, 10] > per_forward[True, 0], per_forward
    assert len(runs[True, 10].metrics.speculative["drafted_at"]) == 10


def test_a_trees_accepted_features_follow_its_kv(engine, heads) -> None:
    """After a tree verify the speculator moves the accepted path's K/V to consecutive
    positions; the head's features, written by the sink at the same node positions, move too."""
    proposer = engine.speculator.proposer(SpecMethod("eagle3", heads[1].split(":", 1)[1]))
    assert proposer is not None
    feats = proposer.feats
    feats[1, 20:31] = torch.arange(11, dtype=feats.dtype)[:, None]
    # root at 20, beam 1's first two drafts (nodes 6, 7 of a 2 x 5 tree) accepted
    proposer.moved(torch.tensor([1]), torch.tensor([20]), torch.tensor([[0, 6, 7, 7, 7, 7]]))
    assert feats[1, 20:24, 0].tolist() == [0.0, 6.0, 7.0, 7.0]


def test_copies_of_a_cached_prompt_join_decode_and_draft_from_the_same_features(
    engine, heads
) -> None:
    """A prompt cached in a freed slot: speculative copies of it join the decode batch at once
    (no prefill step each), and the copies whose prefix is copied from a running slot get its
    features too, so all draft alike (with other slots' features overwritten by noise, a copy
    drafting from its own slot's stale features would accept differently)."""
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    params = SamplingParams(max_tokens=24, temperature=0.0, speculative=heads[2])  # trained
    plain = engine.generate([PROMPTS[2]], greedy)[0].token_ids
    engine.generate([PROMPTS[2]], params)  # its slot, now free, holds the prompt
    ids = engine.encode(PROMPTS[2])
    donor = next(s for s, held in engine.scheduler.free.items() if held[: len(ids)] == ids)
    proposer = engine.speculator.proposer(SpecMethod("eagle3", heads[2].split(":", 1)[1]))
    assert proposer is not None
    others = [s for s in range(proposer.feats.shape[0]) if s != donor]
    proposer.feats[others] = torch.randn_like(proposer.feats[others])
    rids = [engine.add_request(PROMPTS[2], params) for _ in range(3)]
    first = engine.step()  # one decode step feeds all three their last prompt token
    assert sorted(o.request_id for o in first) == sorted(rids)
    outs = {o.request_id: o for o in first}
    tokens = {r: list(outs[r].delta_token_ids) for r in rids}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.request_id] += o.delta_token_ids
            outs[o.request_id] = o
    assert all(tokens[r] == plain for r in rids)
    accepted = [outs[r].metrics.speculative["per_position_acceptance"] for r in rids]
    assert accepted[0] == accepted[1] == accepted[2] and accepted[0][0] > 0, accepted


def test_a_new_turn_settles_only_what_is_new(engine, heads) -> None:
    """A request that resends a finished one's conversation and adds to it (an agent's next
    turn) takes that slot; the head's layer K/V there already hold the shared positions, so its
    first settle starts near the new tokens, and it drafts exactly what a full settle does."""
    params = SamplingParams(max_tokens=16, temperature=0.0, speculative=heads[2])
    proposer = engine.speculator.proposer(SpecMethod("eagle3", heads[2].split(":", 1)[1]))
    assert proposer is not None
    first = engine.generate([PROMPTS[3]], params)[0]
    turn = engine.encode(PROMPTS[3]) + first.token_ids + engine.encode("\nAnd double it?")
    settles: list[tuple[int, int]] = []
    layer = proposer._layer

    def spy(slot, emb, hidden, start, end):
        settles.append((start, end))
        return layer(slot, emb, hidden, start, end)

    proposer._layer = spy
    try:
        reused = engine.generate([turn], params)[0]
        assert settles and settles[0][0] >= len(turn) - 20, settles[0]  # only the new part
        engine.generate([PROMPTS[3]], params)  # the slot now holds other tokens past the prompt
        proposer._slot_layer.clear()  # forget it: the same turn settled from position 0
        settles.clear()
        fresh = engine.generate([turn], params)[0]
        assert settles[0][0] == 0
    finally:
        proposer._layer = layer
    plain = engine.generate([turn], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert reused.token_ids == fresh.token_ids == plain.token_ids
    spec = (reused.metrics.speculative, fresh.metrics.speculative)
    assert spec[0]["per_position_acceptance"] == spec[1]["per_position_acceptance"], spec


@pytest.mark.parametrize("cut", [True, False])
def test_sampled_drafts_follow_the_heads_warped_law(engine, heads, cut) -> None:
    """A sampled row's draft (the one-graph step's ``run_sampled``) is drawn from the head's
    distribution warped as the row asks (``cut`` False: at its temperature without the top-p
    cut, ``eagle3_chain.DRAFT_TOP_P`` off), and ``q`` is that law over the target's
    vocabulary; a greedy row in the same batch drafts the argmax."""
    chains = engine.speculator.proposer(SpecMethod("eagle3", heads[1].split(":", 1)[1])).chains
    n = 4000
    last = torch.randn(1, 576, generator=torch.Generator().manual_seed(0)).expand(n, -1)
    temperature = torch.full((n,), 0.8)
    temperature[0] = 0.0
    top_p, top_k = torch.full((n,), 0.9), torch.zeros(n, dtype=torch.long)
    u = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.inference_mode():  # as the engine drafts
        tokens, q = chains._sampled_token(last, temperature, top_p, top_k, u, 0, cut)
        head_logits = chains.p.logits(last[:1]).float()
    assert tokens[0] == chains.p.ids[head_logits.argmax(-1)][0]  # the greedy row
    law = q[1]
    assert torch.allclose(q[1:], law.expand(n - 1, -1)) and abs(float(law.sum()) - 1) < 1e-5
    outside = torch.ones(law.numel(), dtype=torch.bool)
    outside[chains.p.ids] = False
    assert float(law[outside].sum()) == 0.0
    warped = (head_logits[0] / 0.8).softmax(-1)
    kept = warped.sort(descending=True).values.cumsum(0) - warped.sort(descending=True).values < 0.9
    if cut:  # the top-p cut on the head's own law
        assert int((law > 0).sum()) == int(kept.sum())
    else:  # the head's law at the row's temperature, every draft column
        assert torch.allclose(law[chains.p.ids], warped, atol=1e-6)
    counts = torch.bincount(tokens[1:], minlength=law.numel()).double()
    assert chi_square_p(counts, law.double()) > 0.01
