"""The Triton skinny product (2..16 rows) against cuBLAS, and the CUDA path that uses it.

Runs only where CUDA and Triton exist; skips on CPU. Shapes are the default model's
(SmolLM2-135M, from ``loader.RANDOM_SHAPES``) and one of Llama-3-8B's (w2, 4096 x 14336).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import kernels as cuda_kernels
from mathagent.serving.engine.random_model import RANDOM_SHAPES

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_kernels.available(), reason="needs a CUDA device and Triton"),
]

ROWS = (2, 3, 6, 12, 16)


def product_shapes(name: str) -> list[tuple[int, int]]:
    """(N, K) of a model's qkv, wo, w13, w2 and head weights."""
    c = RANDOM_SHAPES[name]
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]  # fmt: skip
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd
    return [(qkv, h), (h, h), (2 * inter, h), (h, inter), (c["vocab_size"], h)]


SHAPES = [*product_shapes("smollm2-135m"), (4096, 14336)]


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_skinny_matches_linear(shape, dtype):
    from mathagent.serving.engine.cuda import skinny as sk

    torch.manual_seed(0)
    n, k = shape
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    for rows in ROWS:
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        ref = F.linear(x.double(), w.double())
        y = sk.skinny(x, w)
        if dtype == torch.float32:  # IEEE float32: as close to float64 as cuBLAS is
            assert max_rel(y, ref) < 2e-6
            assert max_rel(y, F.linear(x, w)) < 2e-6
        else:  # one bfloat16 rounding of the output
            assert max_rel(y, ref) < 8e-3


@pytest.mark.parametrize("dot", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_kernel_forms_and_layouts(dot, dtype):
    """FMA and tl.dot forms, unrolled and looped K, [B, T, K] input with a row stride."""
    from mathagent.serving.engine.cuda import skinny as sk

    torch.manual_seed(1)
    for k, block_k in ((576, 128), (4096, 128)):  # 576: a partial last tile; 4096: a loop
        w = torch.randn(1000, k, device="cuda", dtype=dtype)
        cfg = sk.SkinnyConfig(16 if dot else 4, block_k, 4, dot, pdl=cuda_kernels.pdl_supported())
        for rows in ROWS:
            wide = torch.randn(rows, 2 * k, device="cuda", dtype=dtype)
            x = wide[:, :k]  # row stride 2K
            y = torch.empty(rows, 1000, device="cuda", dtype=dtype)
            sk.launch(x, w, y, cfg)
            tol = 4e-6 if dtype == torch.float32 else 8e-3  # float32 over 4096 terms: ~2e-6
            assert max_rel(y, F.linear(x.double(), w.double())) < tol
    x3 = torch.randn(2, 3, k, device="cuda", dtype=dtype)
    assert sk.skinny(x3, w).shape == (2, 3, 1000)
    assert max_rel(sk.skinny(x3, w), F.linear(x3.double(), w.double())) < tol


def test_skinny_replays_in_a_cuda_graph():
    from mathagent.serving.engine.cuda import skinny as sk

    w = torch.randn(960, 576, device="cuda")
    x = torch.randn(6, 576, device="cuda")
    sk.skinny(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sk.skinny(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert max_rel(y, F.linear(x.double(), w.double())) < 2e-6


def _two_layer_runners(**shape_fields):
    """Eager and CUDA-path runners over a 2-layer float32 model of the default model's widths;
    ``shape_fields`` replace the CUDA forward's ``LayerShape`` fields before any capture."""
    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.model import ModelArgs, Transformer
    from mathagent.serving.engine.model_runner import ModelRunner

    torch.manual_seed(0)
    shape = dict(RANDOM_SHAPES["smollm2-135m"], vocab_size=4096, num_hidden_layers=2)
    model = Transformer(ModelArgs.from_hf_config(shape)).to("cuda").eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.08)
    common = dict(model=None, device=torch.device("cuda"), dtype=torch.float32, max_batch_size=4,
                  max_seq_len=256, speculative="none", draft_len=4, draft_beams=1, threads=None)  # fmt: skip
    eager = ModelRunner(model, EngineConfig(eager=True, **common))
    fast = ModelRunner(model, EngineConfig(eager=False, **common))
    forward = fast.graphs.forward
    forward.shape = dataclasses.replace(forward.shape, **shape_fields)
    return eager, fast


@pytest.fixture(scope="module")
def runners():
    """Eager and CUDA-path runners, the CUDA one with every 2..16-row product on the skinny
    kernel."""
    weights = [*product_shapes("smollm2-135m")[:4], (4096, 576)]  # the head at vocab 4096
    return _two_layer_runners(
        skinny=frozenset((n, k, b) for n, k in weights for b in (2, 4, 8, 16))
    )


def test_speculative_verify_on_skinny_equals_plain_greedy(runners):
    """Verify steps of 4 tokens (rows 4) on the skinny kernel accept exactly plain greedy."""
    eager, fast = runners
    dev = fast.device
    prompt = torch.randint(0, 4096, (16,), generator=torch.Generator().manual_seed(4)).tolist()

    def forward(runner, tokens, start):
        pos = (start + torch.arange(len(tokens), device=dev))[None]
        return runner.forward(torch.tensor([tokens], device=dev), pos, [1])[0][0]

    plain = [int(forward(fast, prompt, 0)[-1].argmax())]
    for i in range(29):
        plain.append(int(forward(fast, [plain[-1]], len(prompt) + i)[-1].argmax()))
    ref = [int(forward(eager, prompt, 0)[-1].argmax())]
    for i in range(29):
        ref.append(int(forward(eager, [ref[-1]], len(prompt) + i)[-1].argmax()))
    assert plain == ref
    out = [plain[0]]
    while len(out) < len(plain):
        i = len(out) - 1
        draft = [*plain[i + 1 : i + 4], 0, 0, 0][:3]
        draft[len(out) % 3] = (draft[len(out) % 3] + 1) % 4096
        logits = forward(fast, [out[-1], *draft], len(prompt) + i)
        target = logits.argmax(-1).tolist()
        taken = 0
        while taken < 3 and draft[taken] == target[taken]:
            taken += 1
        out += target[: taken + 1]
    assert out[: len(plain)] == plain


def _fused_reference(x, w, kw):
    """The eager model's rounding order: f(x) in the model dtype, the product, the residual."""
    from mathagent.serving.engine.cuda.forward import rms_norm

    if "norm" in kw:
        x = rms_norm(x, kw["norm"], kw["eps"])
    if kw.get("silu_mul"):
        x = F.silu(x[..., : w.shape[1]]) * x[..., w.shape[1] :]
    y = F.linear(x, w)
    if kw.get("glu"):
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y + kw["residual"] if "residual" in kw else y


@pytest.mark.parametrize("dot", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_form_computes_the_layer_ops(dot, dtype):
    """Norm / SiLU prologue, residual epilogue and silu(gate) * up epilogue (glu) at 1..16
    rows, each launch form, equal the eager ops within float32 summation order (float32) or
    one rounding (bf16)."""
    from mathagent.serving.engine.cuda import skinny as sk

    torch.manual_seed(2)
    qkv, wo, w13, w2 = product_shapes("smollm2-135m")[:4]
    cases = {"norm": qkv, "resid": wo, "norm13": w13, "silu": w2, "glu": w13, "plain2": w2}
    for mode, (n, k) in cases.items():
        w = torch.randn(n, k, device="cuda", dtype=dtype) * k**-0.5
        for rows in (1, 2, 5, 13, 16):
            width = 2 * k if mode == "silu" else k
            x = torch.randn(2, rows, width, device="cuda", dtype=dtype)[1]  # an offset view
            kw: dict = {}
            if mode.startswith("norm") or mode == "glu":
                kw = dict(norm=(torch.rand(k, device="cuda") + 0.5).to(dtype), eps=1e-5)
            out = n // 2 if mode == "glu" else n  # glu: silu(gate) * up, half the rows out
            if mode == "glu":
                kw["glu"] = True
            if mode in ("resid", "silu", "plain2"):
                kw["residual"] = torch.randn(rows, out, device="cuda", dtype=dtype)
            if mode == "silu":
                kw["silu_mul"] = True
            ref = _fused_reference(x, w, kw)
            tol = 2e-5 if dtype == torch.float32 else 2e-2
            for split in (1, 3):  # K = 576 / 1536 in 3 slices of whole tiles
                block_k = 64 if dot or split > 1 else 128  # 128: a partial last tile at 576
                cfg = sk.SkinnyConfig(16 if dot else 4, block_k, 4, dot, split=split,
                                      pdl=cuda_kernels.pdl_supported())  # fmt: skip
                y = torch.empty(rows, out, device="cuda", dtype=dtype)
                sk.launch(x, w, y, cfg, kw.get("norm"), kw.get("residual"), kw.get("eps", 1e-6),
                          kw.get("silu_mul", False), kw.get("glu", False))  # fmt: skip
                assert max_rel(y, ref) < tol, (mode, rows, split)
            if rows > 1 or kw:  # the public op, its own launch shape
                assert max_rel(sk.skinny(x, w, **kw), ref) < tol, (mode, rows)


def test_split_launches_are_deterministic_and_replay_in_a_graph():
    """A product in K slices (the last slice of a column block reduces them in order) gives the
    same bits on every launch and graph replay, and leaves its counters at zero."""
    from mathagent.serving.engine.cuda import skinny as sk

    torch.manual_seed(3)
    w = torch.randn(576, 1536, device="cuda", dtype=torch.bfloat16) * 1536**-0.5
    x = torch.randn(13, 1536, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(13, 576, device="cuda", dtype=torch.bfloat16)
    cfg = sk.SkinnyConfig(32, 64, 4, True, split=8, pdl=cuda_kernels.pdl_supported())
    y = torch.empty(13, 576, device="cuda", dtype=torch.bfloat16)
    sk.launch(x, w, y, cfg, residual=r)
    first = y.clone()
    for _ in range(20):
        sk.launch(x, w, y, cfg, residual=r)
        assert torch.equal(y, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sk.launch(x, w, y, cfg, residual=r)
    for _ in range(5):
        y.zero_()
        graph.replay()
        assert torch.equal(y, first)
    torch.cuda.synchronize()
    assert int(cuda_kernels.arrival_counters("skinny", 1, y.device).abs().sum()) == 0
    assert max_rel(first, _fused_reference(x, w, {"residual": r})) < 2e-2
    with pytest.raises(ValueError, match="slices"):
        sk.launch(x, w, y, sk.SkinnyConfig(32, 128, 4, True, split=5))


@pytest.fixture(scope="module")
def fused_runner():
    """Eager and CUDA-path runners, the CUDA one with every layer at 1..16 rows in the fused
    skinny form (as if the table ``FUSED_CONFIGS`` listed every bucket); at 8 rows every
    product runs in K slices (split launches), elsewhere at the table's launch shapes."""
    from mathagent.serving.engine.cuda import skinny as sk

    shapes = product_shapes("smollm2-135m")[:4]
    saved = dict(sk.FUSED_CONFIGS)
    for n, k in shapes:
        sk.FUSED_CONFIGS[n, k, 4, 8] = sk.SkinnyConfig(32, 64, 4, True, split=3,
                                                       glu=(n, k) == shapes[2])  # fmt: skip
    yield _two_layer_runners(fused_rows=frozenset((n, k, b) for n, k in shapes
                                                  for b in (1, 2, 4, 8, 16)))  # fmt: skip
    sk.FUSED_CONFIGS.clear()
    sk.FUSED_CONFIGS.update(saved)


def test_fused_layers_decode_and_verify_as_the_eager_model(fused_runner):
    """Float32: one-row steps through the fused form decode the eager model's greedy tokens,
    and verify steps of 4, 7 (split launches) and 13 tokens through it accept exactly that
    output."""
    eager, fast = fused_runner
    dev = fast.device
    prompt = torch.randint(0, 4096, (16,), generator=torch.Generator().manual_seed(5)).tolist()

    def forward(runner, tokens, start):
        pos = (start + torch.arange(len(tokens), device=dev))[None]
        return runner.forward(torch.tensor([tokens], device=dev), pos, [1])[0][0]

    def greedy(runner):
        out = [int(forward(runner, prompt, 0)[-1].argmax())]
        for i in range(29):
            out.append(int(forward(runner, [out[-1]], len(prompt) + i)[-1].argmax()))
        return out

    plain = greedy(fast)
    assert plain == greedy(eager)
    for width in (3, 6, 12):  # drafts per verify step: 4, 7 and 13 rows
        out = [plain[0]]
        while len(out) < len(plain):
            i = len(out) - 1
            draft = (plain[i + 1 : i + 1 + width] + [0] * width)[:width]
            draft[len(out) % width] = (draft[len(out) % width] + 1) % 4096
            target = forward(fast, [out[-1], *draft], len(prompt) + i).argmax(-1).tolist()
            taken = 0
            while taken < width and draft[taken] == target[taken]:
                taken += 1
            out += target[: taken + 1]
        assert out[: len(plain)] == plain, width
