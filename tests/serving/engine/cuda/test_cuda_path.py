"""The CUDA path (Triton kernels, compiled layers, CUDA graphs) against the eager reference.

Runs only where CUDA and Triton exist (benchmarks/GPU_NOTES.md says how it was run on an H200);
skips on CPU. Float32 models with sharp random weights, so greedy choices are well separated.
The kernels alone (attention, the head's fused layer, the step's glue) are checked against
their PyTorch forms in ``tests/serving/engine/test_triton_kernels.py``, on CPU hosts too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import kernels as cuda_kernels

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_kernels.available(), reason="needs a CUDA device and Triton"),
]

SHAPE = dict(vocab_size=2048, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
             num_attention_heads=16, num_key_value_heads=4, architectures=["LlamaForCausalLM"])  # fmt: skip


@pytest.fixture(scope="module")
def runners():
    """An eager and a CUDA-path runner over one float32 model with sharp random weights."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.model import ModelArgs, Transformer
    from mathagent.serving.engine.model_runner import ModelRunner

    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf_config(SHAPE)).to("cuda").eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.08)
    common = dict(model=None, device=torch.device("cuda"), dtype=torch.float32, max_batch_size=4,
                  max_seq_len=256, speculative="none", draft_len=4, draft_beams=1, threads=None)  # fmt: skip
    eager = ModelRunner(model, EngineConfig(eager=True, **common))
    fast = ModelRunner(model, EngineConfig(eager=False, **common))
    assert fast.graphs is not None and eager.graphs is None
    return eager, fast


def greedy(runner, prompt: list[int], steps: int, slot: int) -> list[int]:
    dev = runner.device
    pos = torch.arange(len(prompt), device=dev)[None]
    logits, _ = runner.forward(torch.tensor([prompt], device=dev), pos, [slot])
    out = [int(logits[0, -1].argmax())]
    for i in range(steps - 1):
        p = torch.tensor([[len(prompt) + i]], device=dev)
        logits, _ = runner.forward(torch.tensor([[out[-1]]], device=dev), p, [slot])
        out.append(int(logits[0, -1].argmax()))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_gemv_matches_linear():
    for n, k in ((3000, 1024), (128256 // 8, 2048)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        assert rel(cuda_kernels.gemv(x, w), F.linear(x, w)) < 1e-2


def test_greedy_equals_eager(runners):
    eager, fast = runners
    prompt = torch.randint(0, 2048, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    assert greedy(fast, prompt, 40, slot=1) == greedy(eager, prompt, 40, slot=1)


def test_engine_generate_equals_eager(runners):
    """Whole engine, continuous batching of three requests that finish at different steps
    (three rows padded to four, then two, then one): the steps launched ahead, each a replay
    of a graph that advanced its own inputs, give the eager engine's tokens."""
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel
    from mathagent.serving.engine.sampling_params import SamplingParams

    eager, fast = runners
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (5, 19, 11)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 30, 21)]
    outputs, claimed = [], 0
    for runner in (eager, fast):
        loaded = LoadedModel(runner.model, None, "random", None, ())
        engine = LLMEngine(runner.config, model_dir=None, loaded=loaded)
        lookahead = engine.runner.lookahead
        outputs.append([r.token_ids for r in engine.generate(prompts, params)])
        claimed = lookahead.claimed if lookahead is not None else 0
    assert outputs[1] == outputs[0]
    assert claimed >= 20, "greedy steps were not launched ahead"


def test_sampled_decode_launches_ahead_and_equals_eager(runners):
    """Seeded sampled requests (temperature, top-p, top-k) decode with a step in flight, each
    step sampled on the device at a uniform its generator drew at launch: the same tokens as
    the eager engine, which samples on the host, alone and in one continuous batch."""
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel
    from mathagent.serving.engine.sampling_params import SamplingParams

    eager, fast = runners
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (5, 19, 11)]
    warps = [
        dict(temperature=0.9),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.7, top_k=20),
    ]
    params = [SamplingParams(max_tokens=24, seed=10 + i, ignore_eos=True, **w)
              for i, w in enumerate(warps)]  # fmt: skip
    engines = []
    for runner in (eager, fast):
        loaded = LoadedModel(runner.model, None, "random", None, ())
        engines.append(LLMEngine(runner.config, model_dir=None, loaded=loaded))
    lookahead = engines[1].runner.lookahead
    before = lookahead.claimed
    alone = [[e.generate([p], [q])[0].token_ids for p, q in zip(prompts, params, strict=True)]
             for e in engines]  # fmt: skip
    assert alone[1] == alone[0]
    assert lookahead.claimed - before >= 3 * 20, "sampled steps were not launched ahead"
    batch = [[r.token_ids for r in e.generate(prompts, params)] for e in engines]
    assert batch[1] == batch[0]
    assert len({tuple(t) for t in alone[0]}) == 3


def test_batched_rows_equal_eager(runners):
    """Three rows (padded to a bucket of 4) at different lengths, slots out of order."""
    eager, fast = runners
    gen = torch.Generator().manual_seed(2)
    lens, slots = [7, 12, 3], [2, 0, 3]
    outs = {}
    for name, runner in (("eager", eager), ("fast", fast)):
        tok = []
        for n, s in zip(lens, slots, strict=True):
            p = torch.randint(0, 2048, (n,), generator=gen).tolist()
            pos = torch.arange(n, device="cuda")[None]
            logits, _ = runner.forward(torch.tensor([p], device="cuda"), pos, [s])
            tok.append(int(logits[0, -1].argmax()))
        gen.manual_seed(2)
        rows = []
        for _ in range(10):
            tokens = torch.tensor(tok, device="cuda")[:, None]
            pos = torch.tensor(lens, device="cuda")[:, None]
            logits, _ = runner.forward(tokens, pos, slots)
            tok = logits[:, -1].argmax(-1).tolist()
            lens = [n + 1 for n in lens]
            rows.append(tok)
        lens = [7, 12, 3]
        outs[name] = rows
    assert outs["fast"] == outs["eager"]


def test_tree_verify_equals_eager(runners):
    """A 4-token draft tree (two branches) scored in one step, as speculative verify does."""
    eager, fast = runners
    prompt = torch.randint(0, 2048, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    results = []
    for runner in (eager, fast):
        greedy(runner, prompt, 1, slot=0)  # prefill
        n = len(prompt)
        mask = torch.ones(1, 4, n + 4, dtype=torch.bool, device="cuda")
        mask[0, :, n:] = tree.cuda()
        depth = torch.tensor([[0, 1, 1, 2]], device="cuda") + n
        write = torch.arange(n, n + 4, device="cuda")[None]
        tokens = torch.tensor([[5, 6, 7, 8]], device="cuda")
        logits, hidden = runner.forward(tokens, depth, [0], attn_mask=mask, write_positions=write)
        results.append((logits.clone(), hidden.clone()))
    assert rel(results[1][0], results[0][0]) < 1e-4
    assert rel(results[1][1], results[0][1]) < 1e-4


def test_speculative_verify_equals_plain(runners):
    """Greedy speculation on the CUDA path (drafts = plain output, one corrupted per step)."""
    _, fast = runners
    prompt = torch.randint(0, 2048, (16,), generator=torch.Generator().manual_seed(4)).tolist()
    plain = greedy(fast, prompt, 30, slot=2)
    out = [plain[0]]
    while len(out) < len(plain):
        i = len(out) - 1
        draft = [*plain[i + 1 : i + 4], 0, 0, 0][:3]
        draft[len(out) % 3] = (draft[len(out) % 3] + 1) % 2048
        tokens = torch.tensor([[out[-1], *draft]], device="cuda")
        pos = (len(prompt) + i + torch.arange(4, device="cuda"))[None]
        target = fast.forward(tokens, pos, [2])[0][0].argmax(-1).tolist()
        taken = 0
        while taken < 3 and draft[taken] == target[taken]:
            taken += 1
        out += target[: taken + 1]
    assert out[: len(plain)] == plain


def test_unsupported_layouts_fall_back_to_eager(runners):
    """Masks that hide cached positions, or scattered writes, run eagerly and stay exact."""
    eager, fast = runners
    prompt = torch.randint(0, 2048, (24,), generator=torch.Generator().manual_seed(6)).tolist()
    n = len(prompt)
    mask = torch.ones(1, 2, n + 2, dtype=torch.bool, device="cuda")
    mask[0, :, 3] = False  # a cached position hidden from the new tokens
    mask[0, 0, n + 1] = False
    write = torch.tensor([[n, n + 1]], device="cuda")
    scattered = torch.tensor([[n, n + 2]], device="cuda")
    assert not fast.graphs.fits(write, write, mask)
    assert not fast.graphs.fits(scattered, scattered, None)
    results = []
    for runner in (eager, fast):
        greedy(runner, prompt, 1, slot=3)
        tokens = torch.tensor([[9, 10]], device="cuda")
        results.append(runner.forward(tokens, write, [3], attn_mask=mask, write_positions=write)[0])
    assert rel(results[1], results[0]) < 1e-5


def test_compiled_prefill_scores_as_eager_blocks():
    """MATHAGENT_ENGINE__COMPILED_PREFILL: what the graphs do not take (a prefill from position
    0, a window over cached positions wider than their widths, a hidden mask) runs through the
    compiled blocks and scores as the eager blocks do; decode steps still replay the graphs."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.model import ModelArgs, Transformer, call_layer
    from mathagent.serving.engine.model_runner import ModelRunner

    def runner(compiled: bool) -> ModelRunner:
        torch.manual_seed(0)  # one model per runner: the block call is the model's
        model = Transformer(ModelArgs.from_hf_config(SHAPE)).to("cuda").eval()
        for p in model.parameters():
            p.data.normal_(0.0, 0.08)
        return ModelRunner(model, EngineConfig(model=None, device=torch.device("cuda"),
                           dtype=torch.float32, max_batch_size=4, max_seq_len=256,
                           speculative="none", draft_len=4, draft_beams=1, threads=None,
                           eager=False, compiled_prefill=compiled))  # fmt: skip

    plain, compiled = runner(False), runner(True)
    assert plain.model.layer_call is call_layer and compiled.model.layer_call is not call_layer
    gen = torch.Generator().manual_seed(7)
    for n in (40, 77):
        prompt = torch.randint(0, 2048, (n,), generator=gen).tolist()
        window = torch.randint(0, 2048, (1, 24), generator=gen).cuda()
        pos = torch.arange(n, n + 24, device="cuda")[None]
        mask = torch.ones(1, 24, n + 24, dtype=torch.bool, device="cuda").tril(n)
        mask[0, :, 5] = False  # a hidden cached position: no graph takes it
        scores = []
        for r in (plain, compiled):
            first = greedy(r, prompt, 6, slot=2)  # prefill (compiled), then graph decode steps
            wide = r.forward(window, pos, [2])[0]  # 24 tokens over the cached 40 / 77
            hidden = r.forward(window, pos, [2], attn_mask=mask)[0]
            scores.append((first, wide, hidden))
        (first_e, wide_e, hidden_e), (first_c, wide_c, hidden_c) = scores
        assert first_c == first_e
        assert rel(wide_c, wide_e) < 1e-4 and rel(hidden_c, hidden_e) < 1e-4
