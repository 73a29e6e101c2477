"""EAGLE-3 on the CUDA graphs: the graphs keep the target's low/middle/high streams, so an
EAGLE-3 engine replays graphs (it ran eagerly before: 28 tok/s on the H200, GPU_NOTES run 18)
and its features, drafts and output equal the eager engine's.

Runs only where CUDA and Triton exist; skips on CPU. A float32 model with sharp random weights.
The kernels alone (attention, the head's fused layer, the step's glue) are checked against
their PyTorch forms in ``tests/serving/engine/test_triton_kernels.py``, on CPU hosts too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mathagent.serving.engine.cuda import kernels as cuda_kernels

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_kernels.available(), reason="needs a CUDA device and Triton"),
]

SHAPE = dict(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
             num_attention_heads=8, num_key_value_heads=4, architectures=["LlamaForCausalLM"])  # fmt: skip
METHOD = "eagle3:/random-head"


def _engine(model, eager: bool, lookup_len: int = 0):
    """An engine over ``model`` with a random EAGLE-3 head scoring with the target's rows
    (``lookup_len``: the engine's; 4, the chain's, even branches; 0, auto on CUDA, 11 beside the
    chains of 4, filling a one-row verify to 16 tokens, a ragged tree)."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel
    from mathagent.serving.engine.spec_config import SpecMethod
    from mathagent.serving.engine.spec_decode.eagle3 import Eagle3Proposer
    from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Config, Eagle3Head

    config = EngineConfig(model=None, device=torch.device("cuda"), dtype=torch.float32,
                          max_batch_size=4, max_seq_len=256, speculative="none", draft_len=4,
                          draft_beams=1, threads=None, eager=eager, adaptive_draft=False,
                          lookup_len=lookup_len)  # fmt: skip
    engine = LLMEngine(config, Path("/nonexistent"), LoadedModel(model, None, "random", None, ()))
    args = model.args
    cfg = Eagle3Config(args.hidden_size, 256, args.num_heads, args.num_kv_heads, args.vocab_size,
                       args.vocab_size, head_dim=args.head_dim, aux_layer_ids=(0, 1, args.num_layers))  # fmt: skip
    torch.manual_seed(3)
    head = Eagle3Head(cfg)
    head.set_draft_vocab(torch.arange(args.vocab_size))
    with torch.no_grad():  # drafts that are sometimes right: the target's own output rows
        head.lm_head.weight.copy_(model.output.weight)
    proposer = Eagle3Proposer(head, engine.runner, 1)
    engine.speculator.proposers.register(SpecMethod("eagle3", "/random-head"), proposer)
    return engine, proposer


def same_drafting(a: dict, b: dict, k: int = 4) -> bool:
    """Two runs' speculative metrics drafted and accepted alike: the same forwards, tokens and
    acceptance at every position, and the same drafts at the chain's ``k`` positions. Past
    them only the lookup branch drafts (ragged at batch 1 on CUDA), which the graphs verify
    every step, padded where nothing was found, and the host path only where it found some."""
    keys = ("accepted_at", "target_forwards", "tokens")
    return all(a[x] == b[x] for x in keys) and a["drafted_at"][:k] == b["drafted_at"][:k]


@pytest.fixture(scope="module")
def model():
    from mathagent.serving.engine.model import ModelArgs, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf_config(SHAPE)).to("cuda").eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.08)
    return model


@pytest.mark.parametrize("lookup_len", [4, 0])
def test_eagle3_on_graphs_equals_eager_and_plain(model, lookup_len) -> None:
    """On CUDA graphs a greedy chain step is one graph (draft, verify, fusion, acceptance);
    with the lookup branch as long as the chain, or longer (a ragged tree of 16 nodes)."""
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod

    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 2048, (9,), generator=gen).tolist()
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative=METHOD)
    runs = {}
    for eager in (True, False):
        engine, proposer = _engine(model, eager, lookup_len)
        assert proposer.lookup_depth(4) == (lookup_len or 11)  # auto: 1 + 4 + 11 = 16 rows
        reference = engine.generate([prompt], plain)[0].token_ids
        out = engine.generate([prompt], spec)[0]
        runs[eager] = (reference, out, proposer.feats[0, : len(prompt) + 23].clone(), engine)
        model.capture = ()  # the next engine's proposer sets it again
    eager_ref, eager_out, eager_feats, _ = runs[True]
    graph_ref, graph_out, graph_feats, graph_engine = runs[False]
    assert graph_ref == eager_ref
    assert eager_out.token_ids == eager_ref and graph_out.token_ids == graph_ref
    assert graph_out.metrics.speculative["drafted_tokens"] > 0
    assert same_drafting(graph_out.metrics.speculative, eager_out.metrics.speculative), (
        "the graphs' features drafted differently from eager ones"
    )
    steps = graph_engine.speculator.proposer(SpecMethod("eagle3", "/random-head")).steps
    assert steps.captured(), "no step ran as one graph"
    rel = (graph_feats - eager_feats).norm() / eager_feats.norm()
    assert rel < 1e-4, f"features from the graphs differ from eager: {rel:.2e}"


def test_plain_steps_of_an_eagle3_engine_launch_ahead_and_feed_the_head(model) -> None:
    """Plain decode in an EAGLE-3 engine keeps a step in flight (greedy and sampled), and each
    launched step's streams still reach the head's features, as the eager engine's do."""
    from mathagent.serving.engine.sampling_params import SamplingParams

    prompt = torch.randint(0, 2048, (9,), generator=torch.Generator().manual_seed(8)).tolist()
    for warp in (dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=3)):
        params = SamplingParams(max_tokens=24, ignore_eos=True, **warp)
        runs = {}
        for eager in (True, False):
            engine, proposer = _engine(model, eager)
            claimed = 0 if eager else engine.runner.lookahead.claimed
            out = engine.generate([prompt], params)[0].token_ids
            if not eager:
                assert engine.runner.lookahead.claimed - claimed >= 20, "no step launched ahead"
            runs[eager] = (out, proposer.feats[0, : len(prompt) + 23].clone())
            model.capture = ()
        assert runs[False][0] == runs[True][0], warp
        rel = (runs[False][1] - runs[True][1]).norm() / runs[True][1].norm()
        assert rel < 1e-4, f"features of launched-ahead steps differ from eager: {rel:.2e}"


def test_batched_chain_graphs_draft_as_eager_for_padded_batches(model) -> None:
    """Three rows in the batch-4 bucket (one padded row on the scratch slot): the captured
    step drafts and accepts what the eager engine does (the chain's positions; past them the
    graphs verify the lookup branch padded, run 112), and output stays plain greedy."""
    from mathagent.serving.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (7, 12, 9)]
    plain = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, speculative=METHOD)
    runs = {}
    for eager in (True, False):
        engine, proposer = _engine(model, eager)
        runs[eager] = ([r.token_ids for r in engine.generate(prompts, plain)],
                       engine.generate(prompts, spec), proposer)  # fmt: skip
        model.capture = ()
    (ref, eager_out, _), (graph_ref, graph_out, graph_proposer) = runs[True], runs[False]
    assert graph_ref == ref and [r.token_ids for r in graph_out] == ref
    assert [r.token_ids for r in eager_out] == ref
    assert any(b > 1 for b, _ in graph_proposer.steps.captured()), "no batch graph"
    for g, e in zip(graph_out, eager_out, strict=True):  # past the chain: the lookup's padding
        assert same_drafting(g.metrics.speculative, e.metrics.speculative)


@pytest.mark.parametrize("lookup_len", [4, 0])
def test_a_step_after_plain_ones_drafts_as_drafting_every_step_does(model, lookup_len) -> None:
    """On the graphs (plain steps launched ahead, fused chain steps) a speculative step right
    after plain ones lands what drafting every step lands at the same committed length: the
    head caught up on the plain steps' positions (run 113, T 0.7: the policy's 22 steps landed
    0.27 first drafts against 0.58 drafting every step; the CPU host path is exact,
    ``test_eagle3.py``)."""
    from mathagent.serving.engine.sampling_params import SamplingParams
    from tests.serving.engine.spec_decode.pattern_policy import after_plain_against_every_step

    gen = torch.Generator().manual_seed(31)
    motif = torch.randint(0, 2048, (5,), generator=gen).tolist()
    prompts = [motif * 3 + torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (4, 9)]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True, speculative=METHOD)
    engine, _ = _engine(model, eager=False, lookup_len=lookup_len)
    matched = after_plain_against_every_step(engine, prompts, params, 4)
    model.capture = ()
    assert sum(1 for index, _, _ in matched if index == 0) >= 2
    assert sum(every for _, _, every in matched) > 0, "nothing landed: the test cannot tell"
    assert [m[1] for m in matched] == [m[2] for m in matched]


def test_eagle3_with_skinny_products_equals_plain(model) -> None:
    """Every 2..16-row product of the graphs on the Triton skinny kernel (whatever its measured
    table holds): the engine's speculative greedy output stays plain greedy."""
    import dataclasses

    from mathagent.serving.engine.sampling_params import SamplingParams

    engine, _ = _engine(model, eager=False)
    forward = engine.runner.graphs.forward
    shapes = {tuple(w.shape) for w in forward._product_weights()}
    every = frozenset((n, k, b) for n, k in shapes for b in (2, 4, 8, 16))
    forward.shape = dataclasses.replace(forward.shape, skinny=every)  # graphs capture lazily
    prompt = torch.randint(0, 2048, (9,), generator=torch.Generator().manual_seed(13)).tolist()
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative=METHOD)
    reference = engine.generate([prompt], plain)[0].token_ids
    out = engine.generate([prompt], spec)[0]
    model.capture = ()
    assert out.token_ids == reference
    assert out.metrics.speculative["drafted_tokens"] > 0
    assert any(width > 1 for _, width in engine.runner.graphs.graphs), "no verify graph"


def test_steps_launched_ahead_are_claimed_and_dropped_without_changing_output(model) -> None:
    """Fused steps launch their successor before the host reads them; rows that leave at
    different lengths change the batch, so some launched steps are thrown away. Output stays
    plain greedy, and most steps were ones launched ahead."""
    from mathagent.serving.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(17)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (8, 11, 6)]
    lengths = (40, 26, 33)
    plain = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    spec = [p.model_copy(update={"speculative": METHOD}) for p in plain]
    engine, proposer = _engine(model, eager=False)
    reference = [r.token_ids for r in engine.generate(prompts, plain)]
    single = engine.generate([prompts[0]], spec[0])[0]
    claimed_single = proposer.steps.claimed
    out = engine.generate(prompts, spec)
    model.capture = ()
    assert single.token_ids == reference[0]
    assert [r.token_ids for r in out] == reference
    steps = single.metrics.speculative["target_forwards"]
    assert claimed_single >= steps // 2, f"{claimed_single} of {steps} steps were launched ahead"
    assert proposer.steps.claimed > claimed_single


@pytest.mark.parametrize("lookup_len", [4, 0])
def test_the_lookup_branch_on_graphs_is_one_tree_step_and_equals_eager(model, lookup_len) -> None:
    """With the prompt-lookup branch (the default) a greedy step verifies a two-beam tree in
    one graph; a head that never drafts right (all its rows zero: column 0 every time) leaves
    every accepted draft to the lookup. Output stays plain greedy, and the graphs accept what
    the eager engine (host lookup, tree verify, features moved along the path) accepts."""
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod

    gen = torch.Generator().manual_seed(23)
    motif = torch.randint(0, 2048, (6,), generator=gen).tolist()
    prompt = motif * 4  # repeats: the random model tends to continue the cycle
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative=METHOD)
    runs = {}
    for eager in (True, False):
        engine, proposer = _engine(model, eager, lookup_len)
        with torch.no_grad():
            proposer.head.lm_head.weight.zero_()
        reference = engine.generate([prompt], plain)[0].token_ids
        runs[eager] = (reference, engine.generate([prompt], spec)[0], proposer, engine)
        model.capture = ()
    (ref, eager_out, _, _), (graph_ref, graph_out, graph_proposer, graph_engine) = (
        runs[True], runs[False],
    )  # fmt: skip
    assert graph_ref == ref and eager_out.token_ids == ref and graph_out.token_ids == ref
    assert graph_proposer.steps.width == 2 and graph_proposer.steps.captured()
    assert same_drafting(graph_out.metrics.speculative, eager_out.metrics.speculative)
    repeats = any(ref[i : i + 2] == ref[j : j + 2] for i in range(len(ref)) for j in range(i))
    if repeats:  # the random model cycled: the lookup must have landed something
        assert graph_out.metrics.speculative["accepted_tokens"] > 0
    assert graph_engine.speculator.proposer(SpecMethod("eagle3", "/random-head")) is graph_proposer


@pytest.mark.parametrize("draft_top_p", [True, False])
def test_sampled_rows_take_the_one_graph_step_and_keep_the_target_law(
    model, monkeypatch, draft_top_p
) -> None:
    """Sampled requests run the one-graph step too (lossless speculative sampling of the head's
    chain at uniforms their own generators drew): the first three generated tokens follow the
    target's warped law (chi-square against the law enumerated over the top-k support), greedy
    rows sharing their batches stay plain greedy; with the head's chain drawn with the row's
    top-p cut or without it (``DRAFT_TOP_P``)."""
    from mathagent.serving.engine.sampler import Sampler, SamplingBatch
    from mathagent.serving.engine.spec_decode import eagle3_chain

    monkeypatch.setattr(eagle3_chain, "DRAFT_TOP_P", draft_top_p)
    from mathagent.serving.engine.sampling_params import SamplingParams
    from tests.serving.engine.spec_decode.stats import chi_square_p

    warp = dict(temperature=0.9, top_k=4, top_p=0.95)
    prompt = torch.randint(0, 2048, (10,), generator=torch.Generator().manual_seed(29)).tolist()
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel

    config = EngineConfig(model=None, device=torch.device("cuda"), dtype=torch.float32,
                          max_batch_size=1, max_seq_len=64, speculative="none", draft_len=4,
                          draft_beams=1, threads=None, eager=True)  # fmt: skip
    loaded = LoadedModel(model, None, "random", None, ())
    reference_engine = LLMEngine(config, Path("/nonexistent"), loaded)  # the law, on its slot 0
    law_of = SamplingBatch.build([SamplingParams(**warp)], [None], torch.device("cuda"))

    def law(prefix: list[int]) -> torch.Tensor:
        tokens = torch.tensor([prefix], device="cuda")
        positions = torch.arange(len(prefix), device="cuda")[None]
        logits, _ = reference_engine.runner.forward(tokens, positions, [0], logits_last_only=True)
        return Sampler.probs(logits[:, -1], law_of)[0].double().cpu()

    exact, frontier = [], [(1.0, [])]
    for _ in range(3):
        total, grown = torch.zeros(2048, dtype=torch.float64), []
        for weight, path in frontier:
            p = law(prompt + path)
            total += weight * p
            grown += [(weight * float(p[t]), [*path, t]) for t in p.nonzero().flatten().tolist()]
        exact.append(total)
        frontier = grown
    engine, proposer = _engine(model, eager=False)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    reference = engine.generate([prompt], greedy)[0].token_ids
    params = [
        greedy.model_copy(update={"speculative": METHOD}) if i % 4 == 3
        else SamplingParams(max_tokens=3, ignore_eos=True, seed=i, speculative=METHOD, **warp)
        for i in range(1000)
    ]  # fmt: skip
    out = engine.generate([prompt] * len(params), params)
    model.capture = ()
    assert all(r.token_ids == reference for r, p in zip(out, params, strict=True) if p.greedy)
    assert proposer.steps.sampled_launches > 0, "sampled rows did not take the one-graph step"
    sampled = [r for r, p in zip(out, params, strict=True) if not p.greedy]
    for pos in range(3):
        counts = torch.bincount(torch.tensor([r.token_ids[pos] for r in sampled]), minlength=2048)
        assert chi_square_p(counts, exact[pos]) > 0.01, pos
    # the random head's drafts mostly fall outside the target's top 4 (probability 0 there):
    # acceptance is the n-gram test's and the default model's (GPU_NOTES run 65) to show
    assert sum(r.metrics.speculative["drafted_tokens"] for r in sampled) > 0


def test_eagle3_with_the_step_glue_kernels_drafts_and_accepts_as_without(model, monkeypatch):
    """The whole greedy step with ``cuda.chain_glue`` on (one beam and the lookup branch's two,
    here a ragged tree: chains of 4 beside lookups of 11): output stays plain greedy and each
    request drafts and accepts exactly what it does with the PyTorch glue (run 78's compiled
    glue kept the output but lost acceptance)."""
    from mathagent.serving.engine.cuda import chain_glue
    from mathagent.serving.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(31)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (7, 12, 9)]
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, speculative=METHOD)
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(chain_glue, "ENABLED", on)
        engine, proposer = _engine(model, eager=False, lookup_len=11)
        ref = [r.token_ids for r in engine.generate(prompts, plain)]
        runs[on] = (ref, engine.generate(prompts, spec), engine.generate(prompts[:1], spec))
        assert (proposer.steps._glue is not None) == on
        model.capture = ()
    for on in (False, True):
        ref, batch, one = runs[on]
        assert [r.token_ids for r in batch] == ref and one[0].token_ids == ref[0]
    same = ("drafted_at", "accepted_at", "target_forwards")
    for a, b in zip(runs[False][1] + runs[False][2], runs[True][1] + runs[True][2], strict=True):
        assert {k: a.metrics.speculative[k] for k in same} == {
            k: b.metrics.speculative[k] for k in same
        }
