"""The CUDA path's Triton kernels against their PyTorch forms, on any host with Triton.

On a CUDA device they run as compiled; elsewhere Triton's interpreter runs them on CPU tensors
(``tests/triton_interpreter.py``), so every commit checks what the device machine, lent for a
few minutes a session, would otherwise be the first to run: the one-row and skinny products
with their fused norms, SiLU products and residuals, the split-KV attention with tree masks and
rotary inside, the EAGLE-3 head's fused layer, and the chain step's glue. Shapes are small
enough for the interpreter; the CUDA modules keep the large ones, graph replay and speed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import attention as cuda_attention
from mathagent.serving.engine.cuda import kernels as cuda_kernels
from mathagent.serving.engine.cuda import skinny as sk
from tests import triton_interpreter


@pytest.fixture(scope="module")
def dev() -> torch.device:
    if cuda_kernels.available():
        return torch.device("cuda")
    if triton_interpreter.interpreting():
        return torch.device("cpu")
    pytest.skip("needs Triton: on a CUDA device, or its interpreter on the CPU")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def fused_reference(x, w, kw):
    """The eager model's rounding order: f(x) in the model dtype, the product (summed in
    float32, rounded once, as cuBLAS and the kernels do), the residual."""
    from mathagent.serving.engine.cuda.forward import rms_norm

    if "norm" in kw:
        x = rms_norm(x, kw["norm"], kw["eps"])
    if kw.get("silu_mul"):
        x = F.silu(x[..., : w.shape[1]]) * x[..., w.shape[1] :]
    y = F.linear(x.float(), w.float()).to(x.dtype)
    if kw.get("glu"):
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y + kw["residual"] if "residual" in kw else y


@pytest.mark.parametrize("mode", ["plain", "norm", "silu", "resid"])
def test_gemv_computes_the_fused_one_row_product(dev, mode):
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        n, k = 600, 1024
        w = torch.randn(n, k, device=dev, dtype=dtype) * k**-0.5
        x = torch.randn(1, 2 * k if mode == "silu" else k, device=dev, dtype=dtype)
        kw: dict = {
            "norm": dict(norm=(torch.rand(k, device=dev) + 0.5).to(dtype), eps=1e-5),
            "silu": dict(silu_mul=True),
            "resid": dict(residual=torch.randn(1, n, device=dev, dtype=dtype)),
        }.get(mode, {})
        assert rel(cuda_kernels.gemv(x, w, **kw), fused_reference(x, w, kw)) < tol, dtype


@pytest.mark.parametrize("dot", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_computes_the_fused_layer_ops(dev, dot, dtype):
    """Norm / SiLU prologue, residual epilogue and silu(gate) * up epilogue (glu) at 1 and
    13 rows, both kernel forms, whole K and K in 3 slices, the default model's widths (fewer
    output rows), against the eager ops within float32 summation order or one bf16 rounding."""
    torch.manual_seed(2)
    cases = {"norm": (96, 576), "resid": (72, 576), "glu": (128, 576), "silu": (64, 1536),
             "plain": (80, 1536)}  # fmt: skip
    tol = 2e-5 if dtype == torch.float32 else 8e-3  # summation order; or one bf16 rounding
    for mode, (n, k) in cases.items():
        w = torch.randn(n, k, device=dev, dtype=dtype) * k**-0.5
        out = n // 2 if mode == "glu" else n
        for rows in (1, 13):  # 13: padded to 16
            x = torch.randn(2, rows, 2 * k if mode == "silu" else k, device=dev, dtype=dtype)[1]
            kw: dict = {}
            if mode in ("norm", "glu"):
                kw = dict(norm=(torch.rand(k, device=dev) + 0.5).to(dtype), eps=1e-5)
            kw.update({"glu": True} if mode == "glu" else {})
            if mode in ("resid", "silu", "plain"):
                kw["residual"] = torch.randn(rows, out, device=dev, dtype=dtype)
            kw.update({"silu_mul": True} if mode == "silu" else {})
            ref = fused_reference(x, w, kw)
            for split in (1, 3):  # K = 576 / 1536 in 3 slices of whole tiles
                block_k = 64 if dot or split > 1 else 128  # 128: a partial last tile at 576
                cfg = sk.SkinnyConfig(16 if dot else 4, block_k, 4, dot, split=split, pdl=False)
                y = torch.empty(rows, out, device=dev, dtype=dtype)
                sk.launch(x, w, y, cfg, kw.get("norm"), kw.get("residual"), kw.get("eps", 1e-6),
                          kw.get("silu_mul", False), kw.get("glu", False))  # fmt: skip
                assert max_rel(y, ref) < tol, (mode, rows, split)


def test_decode_attention_matches_sdpa_with_tree(dev):
    b, t, h, hkv, d, max_seq = 2, 3, 8, 2, 64, 300
    q = torch.randn(b, t, h, d, device=dev)
    k, v = (torch.randn(3, hkv, max_seq, d, device=dev) for _ in range(2))
    slots, start = torch.tensor([2, 0], device=dev), torch.tensor([200, 5], device=dev)
    tree = torch.tril(torch.ones(t, t, dtype=torch.int8, device=dev)).repeat(b, 1, 1)
    tree[0, 2, 1] = 0
    out = cuda_attention.decode_attention(q, k, v, slots, start, tree)
    for i in range(b):
        total = int(start[i]) + t
        keys = k[slots[i], :, :total].repeat_interleave(h // hkv, 0)
        vals = v[slots[i], :, :total].repeat_interleave(h // hkv, 0)
        mask = torch.ones(t, total, dtype=torch.bool, device=dev)
        mask[:, int(start[i]) :] = tree[i].bool()
        ref = F.scaled_dot_product_attention(q[i].transpose(0, 1), keys, vals, attn_mask=mask)
        assert rel(out[i], ref.transpose(0, 1)) < 1e-5


def _rope_attention_twice(dev, t, h, hkv, d, max_seq, starts, launches, branch=False):
    """The rotary attention of two rows (slots 2 and 0, new tokens from ``starts``) under two
    launch shapes, each on its own copy of one random cache: ``[(output, cache), ...]``.
    ``branch``: a second branch of tree nodes from the root (7 on), as the lookup branch's."""
    qkv = torch.randn(2, t, (h + 2 * hkv) * d, device=dev)
    caches = [torch.randn(3, hkv, max_seq, d, device=dev) for _ in range(2)]
    slots, start = torch.tensor([2, 0], device=dev), torch.tensor(starts, device=dev)
    positions = (start[:, None] + torch.arange(t, device=dev)).contiguous()
    freqs = torch.outer(torch.arange(256.0), 1e-4 ** (torch.arange(0, d, 2) / d)).to(dev)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    tree = torch.tril(torch.ones(t, t, dtype=torch.int8, device=dev)).repeat(2, 1, 1)
    if branch:
        tree[:, 7:, 1:7] = 0
    view = qkv.view(2, t, -1, d)
    runs = []
    for launch in launches:
        cache = [c.clone() for c in caches]
        out = cuda_attention._attention(view, *cache, slots, start, tree, h,
                                        (positions, cos, sin), launch)  # fmt: skip
        runs.append((out, cache))
    return runs


@pytest.mark.parametrize("gs", [1, 2, 4])
def test_attention_is_the_same_whatever_programs_share_a_kv_heads_queries(dev, gs):
    """A KV head's 4 query heads in 1, 2 or 4 programs (13 tree nodes a row: 52, 26 or 13
    rows a program), rotary and the K/V write inside: the same attention and cache."""
    (out, got), (want, ref) = _rope_attention_twice(
        dev, 13, 8, 2, 64, 160, [90, 17], [(32, 32, 4, gs), (32, 32, 4, 1)], branch=True
    )
    assert cuda_attention.head_groups(13, 4) == 4 and cuda_attention.head_groups(1, 3) == 1
    assert rel(got[0], ref[0]) < 1e-6 and rel(got[1], ref[1]) < 1e-6
    assert rel(out, want) < 1e-5


@pytest.mark.parametrize("most", [1, 2, 3])
def test_attention_with_fewer_splits_than_the_row_needs_takes_longer_stretches(dev, most):
    """At most 1, 2 or 3 stretches of at least 32 positions: rows of 150 and 40 positions take
    longer ones (rounded to the 16-position block; the new tokens written inside a stretch,
    not at its start), the same attention and cache as 32 positions a stretch."""
    (out, got), (want, ref) = _rope_attention_twice(
        dev, 3, 4, 2, 32, 192, [147, 37], [(32, 16, 4, 1, most), (32, 16, 4, 1, 8)]
    )
    assert rel(got[0], ref[0]) < 1e-6 and rel(got[1], ref[1]) < 1e-6
    assert rel(out, want) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_attention_takes_the_new_kv_from_registers_bit_for_bit(dev, dtype, monkeypatch):
    """A one-token step's first block takes the new k / v from registers (NEW_IN_REGISTERS) or
    reads back its own store: the same output and cache, bit for bit, with the new token at a
    stretch's start, inside one, and at the cache's first position."""
    d, h, hkv = 64, 4, 2
    qkv = torch.randn(3, 1, (h + 2 * hkv) * d, device=dev).to(dtype)
    cache = [torch.randn(3, hkv, 192, d, device=dev).to(dtype) for _ in range(2)]
    slots, start = torch.tensor([2, 0, 1], device=dev), torch.tensor([64, 37, 0], device=dev)
    positions = start[:, None].contiguous()
    freqs = torch.outer(torch.arange(256.0), 1e-4 ** (torch.arange(0, d, 2) / d)).to(dev)
    cos = torch.cat([freqs, freqs], -1).cos().to(dtype)
    sin = torch.cat([freqs, freqs], -1).sin().to(dtype)
    tree = torch.ones(3, 1, 1, dtype=torch.int8, device=dev)
    runs = []
    for in_regs in (True, False):
        monkeypatch.setattr(cuda_attention, "NEW_IN_REGISTERS", in_regs)
        copy = [c.clone() for c in cache]
        out = cuda_attention._attention(qkv.view(3, 1, -1, d), *copy, slots, start, tree, h,
                                        (positions, cos, sin), (32, 16, 4))  # fmt: skip
        runs.append((out, copy))
    (out, got), (want, ref) = runs
    assert torch.equal(out, want)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize("t", [1, 3])
def test_merging_stretches_parts_requested_together_is_bit_for_bit_the_loop(dev, t, monkeypatch):
    """The last stretch requests 4 (or 3) stretches' parts at once (MERGE_LOADS) or one at a
    time: the same output bit for bit, over 5 stretches (a partial last group) and over one."""
    runs = []
    for loads in (1, 4, 3):
        monkeypatch.setattr(cuda_attention, "MERGE_LOADS", loads)
        torch.manual_seed(0)
        runs.append(_rope_attention_twice(dev, t, 4, 2, 32, 192, [147, 9], [(32, 16, 4)])[0])
    (want, ref), *others = runs
    for out, got in others:
        assert torch.equal(out, want)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_attention_splits_are_one_wave_of_the_cards_sms():
    """flash-decoding's rule: no more stretches than one wave of SMs over the programs needs,
    never fewer than one, and no more than the cache's length needs."""
    cpu = torch.device("cpu")  # the interpreter counts an H100's 132 SMs
    assert cuda_attention.attention_splits(4096, 64, 8, cpu) == 16
    assert cuda_attention.attention_splits(512, 64, 8, cpu) == 8
    assert cuda_attention.attention_splits(4096, 256, 256, cpu) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_argmax_is_torch_argmax_ties_included(dev, dtype):
    """Rows of a vocabulary's width cut across programs: the same index as torch.argmax,
    ties to the first index (within a stretch, across stretches), a row of -inf to 0, and
    the counters left at zero for the next launch."""
    from mathagent.serving.engine.cuda import argmax as cuda_argmax

    x = torch.randn(5, 9000, device=dev).to(dtype)
    x[1, [100, 4000, 8999]] = 50.0  # the same maximum in three stretches: the first wins
    x[2, [2050, 2051]] = 60.0  # within one stretch, and in the same lane's next load
    x[2, 2050 + 1024] = 60.0
    x[3] = float("-inf")
    x[4, 8999] = 70.0  # the last position of a partial stretch
    for _ in range(2):  # the second launch finds its counters zeroed by the first
        got = cuda_argmax.argmax_rows(x)
        assert got.tolist() == x.argmax(-1).tolist()
    assert got[1] == 100 and got[2] == 2050 and got[3] == 0 and got[4] == 8999
    cube = x[:4].view(2, 2, 9000)  # leading dimensions are kept
    assert cuda_argmax.argmax_rows(cube).tolist() == cube.argmax(-1).tolist()


def test_rope_attention_equals_rotate_scatter_attend(dev):
    """Rotary + K/V write inside the kernel == rotate, write, then decode_attention."""
    from mathagent.serving.engine.cuda.forward import rotate

    b, t, h, hkv, d, max_seq = 2, 5, 8, 2, 64, 128
    qkv = torch.randn(b, t, (h + 2 * hkv) * d, device=dev)
    k_cache, v_cache = (torch.randn(3, hkv, max_seq, d, device=dev) for _ in range(2))
    slots, start = torch.tensor([2, 0], device=dev), torch.tensor([70, 125], device=dev)
    positions = (start[:, None] + torch.arange(t, device=dev) - 1).contiguous()
    freqs = torch.outer(torch.arange(256.0), 1e-4 ** (torch.arange(0, d, 2) / d)).to(dev)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    tree = torch.tril(torch.ones(t, t, dtype=torch.int8, device=dev)).repeat(b, 1, 1)
    tree[0, 3, 1] = 0
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], -1)
    c, s = cos[positions][:, :, None], sin[positions][:, :, None]
    q, k = rotate(q.view(b, t, h, d), c, s), rotate(k.view(b, t, hkv, d), c, s)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    for i in range(b):
        n = min(t, max_seq - int(start[i]))  # writes past the cache are dropped
        k_ref[slots[i], :, int(start[i]) : int(start[i]) + n] = k[i, :n].transpose(0, 1)
        v_ref[slots[i], :, int(start[i]) : int(start[i]) + n] = v.view(b, t, hkv, d)[
            i, :n
        ].transpose(0, 1)
    ref = cuda_attention.decode_attention(q.contiguous(), k_ref, v_ref, slots, start, tree)
    out = cuda_attention.rope_attention(
        qkv, k_cache, v_cache, slots, start, tree, positions, cos, sin, h
    )
    assert rel(k_cache, k_ref) < 1e-6 and rel(v_cache, v_ref) < 1e-6
    assert rel(out, ref) < 1e-5


def test_rope_attention_writes_the_output_projections_codes(dev):
    """ATTENTION_CODES: with the output projection's static FP8 scale the kernel stores the
    e4m3 codes of what it would store in bf16, bit for bit (split stretches merged or not)."""
    from mathagent.serving.engine import fp8_format

    torch.manual_seed(2)
    b, t, h, hkv, d, max_seq, bf16 = 1, 1, 8, 2, 64, 256, torch.bfloat16
    qkv = torch.randn(b, t, (h + 2 * hkv) * d, device=dev, dtype=bf16)
    freqs = torch.outer(torch.arange(256.0), 1e-4 ** (torch.arange(0, d, 2) / d)).to(dev)
    cos, sin = (f(torch.cat([freqs, freqs], -1)).to(bf16) for f in (torch.cos, torch.sin))
    tree = torch.ones(b, t, t, dtype=torch.int8, device=dev)
    for at in (10, 200):  # one stretch; several, merged by the last
        cache = torch.randn(2, 2, hkv, max_seq, d, device=dev, dtype=bf16)  # k, v; 2 slots
        start = torch.tensor([at], device=dev)
        pos, slots = start[:, None].contiguous(), torch.tensor([1], device=dev)
        args = (slots, start, tree, pos, cos, sin, h)
        plain = cuda_attention.rope_attention(qkv, *cache.clone(), *args)
        static = plain.float().abs().amax().reshape(1) / 448 * 0.7
        codes = cuda_attention.rope_attention(qkv, *cache.clone(), *args, out_scale=static)
        want, _ = fp8_format.quantize_rows(plain.reshape(1, -1), static)
        assert codes.dtype == torch.float8_e4m3fn
        assert torch.equal(codes.reshape(1, -1).view(torch.uint8), want.view(torch.uint8)), at


def _eagle3_proposer(dev: torch.device):
    """A random EAGLE-3 head (hidden 512, 8 heads, vocabulary 512) over a 2-layer random
    target on ``dev``."""
    from pathlib import Path

    from mathagent.serving.engine.config import EngineConfig
    from mathagent.serving.engine.llm_engine import LLMEngine
    from mathagent.serving.engine.loader import LoadedModel
    from mathagent.serving.engine.model import ModelArgs, Transformer
    from mathagent.serving.engine.spec_decode.eagle3 import Eagle3Proposer
    from mathagent.serving.engine.spec_decode.eagle3_head import Eagle3Config, Eagle3Head

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4, architectures=["LlamaForCausalLM"])  # fmt: skip
    model = Transformer(ModelArgs.from_hf_config(shape)).to(dev).eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.08)
    config = EngineConfig(model=None, device=dev, dtype=torch.float32, max_batch_size=4,
                          max_seq_len=128, speculative="none", draft_len=4, draft_beams=1,
                          threads=None, eager=True, adaptive_draft=False)  # fmt: skip
    engine = LLMEngine(config, Path("/nonexistent"), LoadedModel(model, None, "random", None, ()))
    a = model.args
    cfg = Eagle3Config(a.hidden_size, 256, a.num_heads, a.num_kv_heads, a.vocab_size,
                       a.vocab_size, head_dim=a.head_dim, aux_layer_ids=(0, 1, a.num_layers))  # fmt: skip
    head = Eagle3Head(cfg)
    head.set_draft_vocab(torch.arange(a.vocab_size))
    with torch.no_grad():
        head.lm_head.weight.copy_(model.output.weight)
    proposer = Eagle3Proposer(head, engine.runner, 1)
    model.capture = ()
    return proposer


def test_the_fused_head_layer_equals_the_eager_layer(dev) -> None:
    """The EAGLE-3 head's layer as the CUDA graphs run it (skinny products with the norms, SiLU
    product and residual adds inside, rotary and the K/V write inside the attention) against
    the layer written out in PyTorch, at a window of 5 rows and one drafted row; and its draft
    logits with the norm inside the product against the head's own."""
    from mathagent.serving.engine.spec_decode.eagle3_chain import _fused_layer
    from mathagent.serving.engine.spec_decode.eagle3_head import attend

    p = _eagle3_proposer(dev)
    mid = p.head.midlayer
    gen = torch.Generator().manual_seed(4)
    for rows, width in ((2, 5), (1, 1)):
        slots = torch.tensor([1, 3][:rows], device=dev)
        start = torch.tensor([10, 37][:rows], device=dev)
        pos = start[:, None] + torch.arange(width, device=dev)
        tokens = torch.randint(0, 512, (rows, width), generator=gen).to(dev)
        hidden = torch.randn(rows, width, 512, generator=gen).to(dev)
        tree = torch.tril(torch.ones(width, width, dtype=torch.int8, device=dev))
        tree = tree.expand(rows, width, width).contiguous()
        k, v = p.k.clone(), p.v.clone()
        out = _fused_layer(p, tokens, hidden, pos, slots, start, tree)
        cos, sin = p.cos[pos][:, :, None], p.sin[pos][:, :, None]
        residual, q, kk, vv = mid.project(p.embedding[tokens], hidden, cos, sin)
        k[slots[:, None], :, pos], v[slots[:, None], :, pos] = (
            kk.transpose(1, 2),
            vv.transpose(1, 2),
        )
        n = int(pos.max()) + 1
        seen = torch.arange(n, device=dev)[None, None, None] <= pos[:, None, :, None]
        ref = mid.finish(residual, attend(q, k[slots, :, :n], v[slots, :, :n], seen))
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4), (out - ref).abs().max()
        assert torch.allclose(p.k, k, atol=1e-5) and torch.allclose(p.v, v, atol=1e-5)
        last = ref[:, -1]
        rows_weight = p.head.lm_head.weight.to(p.dtype)
        norm = p.head.norm
        logits = sk.skinny(last, rows_weight, norm=norm.weight, eps=norm.eps).float()
        assert torch.allclose(logits, p.logits(last), rtol=1e-4, atol=1e-4)


def test_the_step_glue_kernels_equal_the_pytorch_glue(dev) -> None:
    """``cuda.chain_glue`` (one launch each for the verify inputs, the accepted path's K/V
    move, and the outcome with the next step's inputs) against the step's PyTorch forms, over
    random trees of one and two beams (ragged ones too: a chain beside a longer lookup),
    padded rows on the scratch slot included."""
    from mathagent.serving.engine.cuda import chain_glue
    from mathagent.serving.engine.cuda.forward import StepInputs
    from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, ChainStep
    from mathagent.serving.engine.spec_decode.tree_batch import (
        TreeBatch,
        accept_longest,
        move_path,
    )

    gen, scratch = torch.Generator().manual_seed(1), 9
    shapes = ((4, (3, 3)), (1, (6, 6)), (2, (4,)), (8, (6, 6)), (1, (6, 9)), (4, (3, 5)))
    for bucket, lengths in shapes:
        width, k = len(lengths), max(lengths)
        for _ in range(3):
            inp = ChainInputs.allocate(bucket, k + 1, dev)
            slots = torch.randperm(scratch, generator=gen)[:bucket]
            slots[-1] = scratch if bucket > 1 else slots[-1]
            starts = torch.randint(0, 30, (bucket,), generator=gen)
            windows = torch.randint(0, 100, (bucket, k + 1), generator=gen)
            inp.packed.copy_(torch.cat([slots, starts, windows.flatten()]))
            beams = torch.randint(-1, 50, (bucket, width, k + 1), generator=gen)
            for w, n in enumerate(lengths):
                beams[:, w, 1 + n :] = -1  # a shorter beam's padding
            tree = TreeBatch(beams.to(dev), [], lengths if len(set(lengths)) > 1 else None)
            want, got = (StepInputs.allocate(bucket, tree.nodes, dev) for _ in range(2))
            c = ChainStep.feed(tree, inp, want)
            c2 = chain_glue.feed(tree.beams, tree.node_depths(), tree.layout().gather,
                                 inp.slots, inp.start, got.packed)  # fmt: skip
            assert torch.equal(c, c2) and torch.equal(want.packed, got.packed)
            logits = torch.randn(bucket, tree.nodes, 50, generator=gen).to(dev)
            accepted, path, tokens = accept_longest(tree.beams, logits, tree.parents(),
                                                    tree.offsets())  # fmt: skip
            kv = [torch.randn(3, scratch + 1, 2, 64, 16, generator=gen).to(dev) for _ in range(2)]
            kv2 = [x.clone() for x in kv]
            move_path(kv, inp.slots, c, path)
            chain_glue.move_path(kv2, inp.slots, c, path)
            assert all(torch.equal(a, b) for a, b in zip(kv, kv2, strict=True))
            hidden = torch.randn(bucket, tree.nodes, 24, generator=gen).to(dev)
            twin = ChainInputs.allocate(bucket, k + 1, dev)
            twin.packed.copy_(inp.packed)
            node = path.gather(1, accepted[:, None])[..., None].expand(-1, 1, 24)
            outcome, last = torch.cat([accepted[:, None], tokens], 1), hidden.gather(1, node)[:, 0]
            ChainStep.advance(inp, accepted, tokens, scratch)
            got_outcome, got_last = chain_glue.advance(twin.slots, twin.start, twin.window,
                                                       accepted, tokens, path, hidden, scratch)  # fmt: skip
            assert torch.equal(outcome, got_outcome) and torch.equal(last, got_last)
            assert torch.equal(inp.packed, twin.packed)


def test_fp8_row_quantisation_is_the_reference_rule_bit_for_bit(dev):
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8 as cuda_fp8

    for m, k in ((5, 576), (1, 1536)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * torch.rand(m, 1, device=dev) * 9
        x[0, :7] = 0 if m > 1 else x[0, :7]
        q, s = cuda_fp8.quantize_rows(x)
        q_ref, s_ref = fp8_format.quantize_rows(x)
        assert torch.equal(s, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_fp8_static_input_scale_is_the_reference_rule_bit_for_bit(dev):
    """A checkpoint's static input scale: every row takes it (the rows kernel's and the one-row
    GEMV's row kernels), values past 448 scales clamp, as fp8_format.quantize_rows does."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8 as cuda_fp8
    from mathagent.serving.engine.cuda import fp8_gemv

    torch.manual_seed(3)
    for m, k in ((5, 576), (1, 1536)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * torch.rand(m, 1, device=dev) * 9
        static = x.float().abs().amax().reshape(1) / 448 / 3  # a third: the largest values clamp
        q_ref, s_ref = fp8_format.quantize_rows(x, static)
        assert (q_ref.float().abs() == 448).any() and torch.equal(s_ref, static.expand(m, 1))
        for q, s in (cuda_fp8.quantize_rows(x, static),
                     fp8_gemv.quantize_input_rows(x, k, None, 0.0, 0, False, static)):  # fmt: skip
            assert torch.equal(s.view(m, 1), s_ref)
            assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("mode", ["norm", "glu", "resid"])
def test_fp8_products_with_a_static_input_scale_compute_the_fp8_model(dev, mode, monkeypatch):
    """One row (GEMV; GLU form) and 5 rows (the rows kernel) with the product's static scale
    against the reference rule with it; not the per-row rule's result."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8 as cuda_fp8
    from mathagent.serving.engine.cuda import fp8_gemv
    from mathagent.serving.engine.cuda.forward import rms_norm

    torch.manual_seed(6)
    n, k, bf16 = 192, 1024, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    g = torch.randn(k, device=dev, dtype=bf16)
    monkeypatch.setitem(cuda_fp8.ROWS_CONFIGS, (n, k), cuda_fp8.RowsConfig(64, 128, 4, 3))
    for m in (1, 5):
        x = torch.randn(m, k, device=dev, dtype=bf16) * 3
        x[:, 0] *= 40  # one large value a row: a per-row scale would spend its range on it
        r = torch.randn(m, n // 2 if mode == "glu" else n, device=dev, dtype=bf16)
        fx = x if mode == "resid" else rms_norm(x, g, 1e-5)
        static = fx[:, 1:].float().abs().amax().reshape(1) / 448
        kw = {"resid": dict(residual=r)}.get(mode, dict(norm=g, eps=1e-5))
        ref = fp8_format.reference_linear(fx, codes, scale, static)
        per_row = fp8_format.reference_linear(fx, codes, scale)
        if mode == "glu":
            ref, per_row = (F.silu(y[:, : n // 2]) * y[:, n // 2 :] for y in (ref, per_row))
        elif mode == "resid":
            ref, per_row = ref + r, per_row + r
        if mode == "glu" and m > 1:
            continue  # GLU is the one-row form
        got = fp8_gemv.gemv(x, codes, scale, input_scale=static, glu=mode == "glu", **kw)
        assert rel(got, ref) < 4e-3, (m, rel(got, ref))
        assert rel(got, per_row) > 2 * rel(got, ref), m


@pytest.mark.parametrize("mode", ["plain", "norm", "silu", "resid"])
def test_fp8_products_compute_the_fp8_model(dev, mode, monkeypatch):
    """e4m3 weights with per-row scales at 1 row (the GEMV, two launch shapes), 2-16 rows (the
    tensor-core rows kernel, f(x) quantised per row) and K split in 4 (each launch the same
    bits, counters left at zero) against the reference rule's float32 sums."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8 as cuda_fp8
    from mathagent.serving.engine.cuda import fp8_gemv
    from mathagent.serving.engine.cuda.forward import rms_norm

    torch.manual_seed(5)
    n, k, bf16 = 192, 1024, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    g = torch.randn(k, device=dev, dtype=bf16)
    for m in (1, 5, 16):
        x = torch.randn(m, 2 * k if mode == "silu" else k, device=dev, dtype=bf16) * 3
        r = torch.randn(m, n, device=dev, dtype=bf16)
        kw = {"norm": dict(norm=g, eps=1e-5), "silu": dict(silu_mul=True),
              "resid": dict(residual=r)}.get(mode, {})  # fmt: skip
        f = {"norm": lambda x: rms_norm(x, g, 1e-5),
             "silu": lambda x: F.silu(x[:, :k]) * x[:, k:]}.get(mode, lambda x: x)  # fmt: skip
        ref = fp8_format.reference_linear(f(x), codes, scale) + (r if mode == "resid" else 0)
        if m == 1:
            for cfg in (None, [8, 256, 4]):
                assert rel(fp8_gemv.gemv(x, codes, scale, config=cfg, **kw), ref) < 4e-3, cfg
        else:
            monkeypatch.setitem(cuda_fp8.ROWS_CONFIGS, (n, k), cuda_fp8.RowsConfig(64, 128, 4, 3))
            assert rel(fp8_gemv.gemv(x, codes, scale, **kw), ref) < 4e-3, m
        if mode != "plain":
            continue
        q, s = cuda_fp8.quantize_rows(x)
        split = cuda_fp8.RowsConfig(64, 128, 4, 3, 4)
        outs = [torch.empty(m, n, device=dev, dtype=bf16) for _ in range(2)]
        for y in outs:
            cuda_fp8.rows_launch(q, s.view(-1), codes, scale, y, split, r)
        assert rel(outs[0], ref + r) < 4e-3 and torch.equal(outs[0], outs[1]), m
        assert not cuda_kernels.arrival_counters("fp8_rows", 1, q.device).any()


@pytest.mark.parametrize("codes_in", [False, True])
def test_fp8_one_row_split_k_adds_its_slices_in_order(dev, codes_in):
    """The one-row GEMV with K in 2 and 4 slices (Fp8GemvConfig.split), a partial last row
    block, the row kernel's codes or codes in (w2 after a CODES w13): the FP8 model's product,
    the same bits at every launch whichever slice arrives last, the counters left at zero."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8_gemv

    torch.manual_seed(7)
    n, k, bf16 = 200, 1024, torch.bfloat16  # 200 rows: the last 16-row block is partial
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    r = torch.randn(1, n, device=dev, dtype=bf16)
    static = torch.tensor([0.05], device=dev)
    kw = dict(residual=r, input_scale=static if codes_in else None)

    def launch(x, config):
        arg = fp8_format.quantize_rows(x, static)[0] if codes_in else x
        return fp8_gemv.gemv(arg, codes, scale, config=config, **kw)

    # two inputs in turn: a slice summed before it was written shows the other input's sums
    xs = [torch.randn(1, k, device=dev, dtype=bf16) * 3 for _ in range(2)]
    refs = [fp8_format.reference_linear(x, codes, scale, static if codes_in else None) + r
            for x in xs]  # fmt: skip
    for split in (2, 4):
        outs = [launch(xs[i % 2], [16, 128, 4, split]) for i in range(4)]
        for i, y in enumerate(outs):
            assert rel(y, refs[i % 2]) < 4e-3, (split, i)
            assert rel(y, launch(xs[i % 2], [16, 128, 4])) < 4e-3, (split, i)
        assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3]), split
        assert not any(b.any() for b in cuda_kernels._ARRIVALS[("fp8_gemv", r.device)]), split
    x = xs[0]
    arg = fp8_format.quantize_rows(x, static)[0] if codes_in else x
    with pytest.raises(ValueError, match="split"):  # K 1024 is not 2 * 128 * 8 slices
        fp8_gemv.gemv(arg, codes, scale, config=[16, 128, 4, 8], **kw)
    with pytest.raises(ValueError, match="split"):  # the GLU form is not split
        fp8_gemv.gemv(x, codes, scale, config=[8, 128, 4, 2], glu=True)


@pytest.mark.parametrize("mode", ["plain", "norm", "silu", "resid", "glu"])
def test_fp8_one_row_a16_reads_the_plain_row(dev, mode, monkeypatch):
    """fp8_gemv.A16 (W8A16): the one-row product of e4m3 weights and per-row scales against
    the unquantised f(x), with no row kernel, two launch shapes: the float32 sums of codes
    times g * x, scaled by 1/rms and the weight scale, rounded once (RMSNorm's own roundings
    skipped); the SiLU product and GLU in the eager roundings; near the eager model's order."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8_gemv

    monkeypatch.setattr(fp8_gemv, "A16", True)
    called = []
    monkeypatch.setattr(fp8_gemv, "quantize_row", lambda *a: called.append(a))
    torch.manual_seed(9)
    n, k, bf16 = 384, 1024, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    dequant = codes.float() * scale[:, None]
    x = torch.randn(1, 2 * k if mode == "silu" else k, device=dev, dtype=bf16) * 3
    kw = {"norm": dict(norm=torch.randn(k, device=dev, dtype=bf16), eps=1e-5),
          "glu": dict(norm=torch.randn(k, device=dev, dtype=bf16), eps=1e-5, glu=True),
          "silu": dict(silu_mul=True),
          "resid": dict(residual=torch.randn(1, n, device=dev, dtype=bf16))}.get(mode, {})  # fmt: skip
    eager = fused_reference(x, dequant, kw)
    pre, rstd = x.float(), 1.0
    if "norm" in kw:
        pre, rstd = pre * kw["norm"].float(), torch.rsqrt(x.float().pow(2).mean() + 1e-5)
    elif mode == "silu":
        pre = (F.silu(x[:, :k]) * x[:, k:]).float()
    ref = ((pre @ codes.float().t()) * (rstd * scale)).to(bf16)
    if mode == "glu":
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    ref = ref + kw["residual"] if mode == "resid" else ref
    for cfg in (None, [8, 256, 4]):
        got = fp8_gemv.gemv(x, codes, scale, config=cfg, **kw)
        assert got.shape == ref.shape and rel(got, ref) < 2e-3, cfg
        assert rel(got, eager) < 1e-2, cfg
    assert not called


def test_fp8_glu_codes_out_are_the_row_kernels_codes_and_feed_w2(dev):
    """GLU_CODES: the one-row GLU w13 stores silu(gate) * up as w2's e4m3 codes with w2's
    static scale, bit for bit what the row kernel makes of the bf16 result; w2 reads them
    (no row kernel) and computes what it computes from the bf16 row."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8_gemv

    torch.manual_seed(8)
    n, k, bf16 = 256, 1024, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(2 * n, k, device=dev))
    w2, s2 = fp8_format.quantize_rows(torch.randn(k, n, device=dev))
    scale, s2 = scale.squeeze(-1), s2.squeeze(-1)
    g = torch.randn(k, device=dev, dtype=bf16)
    x, r = torch.randn(1, k, device=dev, dtype=bf16), torch.randn(1, k, device=dev, dtype=bf16)
    kw = dict(norm=g, eps=1e-5, glu=True)
    act = fp8_gemv.gemv(x, codes, scale, **kw)
    static = act.float().abs().amax().reshape(1) / 448 * 0.8  # the largest clamp
    act_codes = fp8_gemv.gemv(x, codes, scale, out_scale=static, **kw)
    assert act_codes.dtype == torch.float8_e4m3fn and act_codes.shape == act.shape
    want, _ = fp8_format.quantize_rows(act, static)
    assert torch.equal(act_codes.view(torch.uint8), want.view(torch.uint8))
    from_codes = fp8_gemv.gemv(act_codes, w2, s2, residual=r, input_scale=static)
    from_row = fp8_gemv.gemv(act, w2, s2, residual=r, input_scale=static)
    assert from_codes.dtype == bf16 and torch.equal(from_codes, from_row)
    with pytest.raises(ValueError, match="codes in need"):
        fp8_gemv.gemv(act_codes, w2, s2, input_scale=static)
    with pytest.raises(ValueError, match="codes out"):
        fp8_gemv.gemv(x, codes, scale, out_scale=static, norm=g, eps=1e-5)


def test_fp8_one_row_glu_writes_silu_of_gate_times_up(dev):
    """w13 in the GLU form at one row (gate rows then up rows, normed input): the FP8 model's
    product, then silu(gate) * up in the eager model's roundings; the same codes and sums as
    the plain product, so equal to it up to silu's last bit."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8_gemv
    from mathagent.serving.engine.cuda.forward import rms_norm

    torch.manual_seed(7)
    n, k, bf16 = 384, 1024, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    g = torch.randn(k, device=dev, dtype=bf16)
    x = torch.randn(1, k, device=dev, dtype=bf16) * 3
    gate, up = fp8_format.reference_linear(rms_norm(x, g, 1e-5), codes, scale).chunk(2, dim=-1)
    ref = F.silu(gate) * up
    pg, pu = fp8_gemv.gemv(x, codes, scale, norm=g, eps=1e-5).chunk(2, dim=-1)
    for cfg in (None, [8, 256, 4], [4, 128, 4], [2, 512, 4]):  # 2 rows: the H100's form
        got = fp8_gemv.gemv(x, codes, scale, norm=g, eps=1e-5, config=cfg, glu=True)
        assert got.shape == (1, n // 2) and rel(got, ref) < 4e-3, cfg
        assert max_rel(got, F.silu(pg) * pu) < 1e-2, cfg


@pytest.mark.parametrize("static", [False, True])
def test_fp8_head_gives_the_unfused_heads_values_from_two_kernels(dev, static):
    """fp8_head.head: the row kernel normalises the residual stream and stores that hidden
    state beside its codes, the GEMV stores float32 logits: forward.rms_norm's hidden state,
    and bit for bit the logits the unfused head (its row kernel, the GEMV, a float copy)
    computes from it; per-token and static input scales."""
    from mathagent.serving.engine import fp8_format
    from mathagent.serving.engine.cuda import fp8_gemv, fp8_head
    from mathagent.serving.engine.cuda.forward import rms_norm

    torch.manual_seed(13)
    n, k, bf16 = 256, 512, torch.bfloat16
    codes, scale = fp8_format.quantize_rows(torch.randn(n, k, device=dev))
    scale = scale.squeeze(-1)
    h = torch.randn(1, 1, k, device=dev, dtype=bf16) * 4
    g = torch.randn(k, device=dev, dtype=bf16)
    input_scale = torch.tensor([0.05], device=dev) if static else None
    logits, hidden = fp8_head.head(h, codes, scale, input_scale, g, 1e-5)
    assert hidden.shape == h.shape and hidden.dtype == bf16
    assert torch.equal(hidden, rms_norm(h, g, 1e-5))
    want = fp8_gemv.gemv(hidden, codes, scale, input_scale=input_scale).float()
    assert logits.shape == (1, 1, n) and logits.dtype == torch.float32
    assert torch.equal(logits, want)
    assert fp8_head.fused_ok((codes, scale, input_scale), 1)
    assert not fp8_head.fused_ok((codes, scale, input_scale), 2) and not fp8_head.fused_ok(g, 1)


def test_fp8_layer_with_producer_written_codes_equals_the_row_kernels(dev, monkeypatch):
    """A one-row FP8 layer with static input scales: the attention writing wo's codes and the
    GLU w13 writing w2's (ATTENTION_CODES, GLU_CODES) computes bit for bit what the same layer
    computes with a row kernel before wo and w2; both cache writes agree too."""
    from mathagent.serving.engine import fp8_calibration
    from mathagent.serving.engine.cuda import fp8_gemv
    from mathagent.serving.engine.cuda.forward import (
        LayerShape,
        StepInputs,
        layer_step,
        layer_weights,
    )
    from mathagent.serving.engine.model import ModelArgs, Transformer, rope_table
    from mathagent.serving.engine.quant import quantize_fp8

    torch.manual_seed(0)
    shape = dict(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"])  # fmt: skip
    model = Transformer(ModelArgs.from_hf_config(shape)).eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.08)
    model = quantize_fp8(model)
    fp8_calibration.calibrate(model, None, torch.bfloat16)
    model = model.to(dev)
    a, bf16, max_seq = model.args, torch.bfloat16, 64
    weights = layer_weights(model.layers[0])
    assert weights[5][2] is not None and weights[8][2] is not None  # wo, w2: static scales
    layer = LayerShape(a.num_heads, a.num_kv_heads, a.head_dim, a.intermediate_size,
                       a.rms_norm_eps, frozenset())  # fmt: skip
    inp = StepInputs.allocate(1, 1, dev)
    for field in (inp.positions, inp.write, inp.start):
        field.fill_(9)
    cos, sin = (t.to(dev, bf16).contiguous() for t in rope_table(a, max_seq))
    h = torch.randn(1, 1, a.hidden_size, device=dev, dtype=bf16)
    kv = torch.randn(2, 2, a.num_kv_heads, max_seq, a.head_dim, device=dev, dtype=bf16)
    outs, real, calls = {}, fp8_gemv.quantize_row, []
    monkeypatch.setattr(fp8_gemv, "quantize_row", lambda *a: calls.append(1) or real(*a))
    for on in (True, False):
        monkeypatch.setattr(fp8_gemv, "ATTENTION_CODES", on)
        monkeypatch.setattr(fp8_gemv, "GLU_CODES", on)
        k_cache, v_cache = kv.clone()
        calls.clear()
        out, delta = layer_step(layer, weights, h, None, k_cache, v_cache, cos, sin, inp)
        assert delta is None  # the fused one-row layer
        assert len(calls) == (2 if on else 4)  # row kernels: before qkv and w13 only, or all
        outs[on] = (out, k_cache, v_cache)
    for a_, b_ in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a_, b_)


def test_fp8_launch_shapes_are_the_cards_own_where_measured(monkeypatch):
    """An H100 takes its own measured launch shapes where it has them (wo, the GLU w13, the
    head), the H200's elsewhere; a card without a table, and a host without CUDA, the H200's."""
    from mathagent.serving.engine.cuda import fp8_gemv

    def launch(n, k, glu=False):
        cfg = fp8_gemv.fp8_gemv_config(n, k, glu)
        return cfg.block_n, cfg.block_k, cfg.num_warps

    monkeypatch.setattr(fp8_gemv.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fp8_gemv.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fp8_gemv, "_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    assert fp8_gemv.card_key() == "H100 80GB HBM3"
    assert launch(4096, 4096) == (4, 512, 4)
    assert launch(28672, 4096, glu=True) == (2, 2048, 4)
    assert launch(128256, 4096) == (4, 1024, 4)
    h200 = {shape: (c.block_n, c.block_k, c.num_warps)
            for shape, c in fp8_gemv.FP8_GEMV_CONFIGS.items()}  # fmt: skip
    assert launch(6144, 4096) == h200[(6144, 4096)]
    assert launch(4096, 14336) == h200[(4096, 14336)]
    for name in ("NVIDIA H200", "NVIDIA H100 NVL"):
        monkeypatch.setattr(fp8_gemv, "_device_name", lambda index, name=name: name)
        assert fp8_gemv.card_key() is None
        assert launch(4096, 4096) == h200[(4096, 4096)]
        assert launch(28672, 4096, glu=True) == (8, 512, 4)
    monkeypatch.setattr(fp8_gemv.torch.cuda, "is_available", lambda: False)
    assert fp8_gemv.card_key() is None


@pytest.mark.parametrize("bucket", [1, 4, 32])
def test_a_decode_step_advances_its_own_inputs_and_stores_its_tokens(dev, bucket) -> None:
    """``decode_advance.advance`` (the last launch of a captured decode step): every row's
    token reaches the host buffer; rows not in the scratch slot take their token as the next
    input, one position, write position and start further on; scratch rows stay as they were
    (their K/V keeps going to the scratch slot's same position)."""
    from mathagent.serving.engine.cuda import decode_advance
    from mathagent.serving.engine.cuda.forward import StepInputs

    gen, scratch = torch.Generator().manual_seed(bucket), 99
    inp = StepInputs.allocate(bucket, 1, dev)
    slots = torch.randperm(scratch, generator=gen)[:bucket]
    live = bucket - bucket // 4  # the last quarter of the rows are padding
    slots[live:] = scratch
    pos = torch.randint(0, 500, (bucket,), generator=gen)
    inp.packed.copy_(torch.cat([torch.randint(0, 50, (bucket,), generator=gen), pos, pos,
                                slots, slots, pos]).to(dev))  # fmt: skip
    before = inp.packed.clone()
    tokens = torch.randint(0, 49152, (bucket,), generator=gen).to(dev)
    host = torch.full((bucket,), -1, dtype=torch.long)
    if dev.type == "cuda":  # pinned, as the engine's: the kernel stores there
        host = host.pin_memory()
    staging = torch.zeros(bucket, dtype=torch.long, device=dev)
    decode_advance.advance(tokens, inp.packed, scratch, host, staging)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    assert host.tolist() == tokens.tolist()
    was = StepInputs.allocate(bucket, 1, dev)
    was.packed.copy_(before)
    assert torch.equal(inp.tokens[:live, 0], tokens[:live])
    assert torch.equal(inp.tokens[live:], was.tokens[live:])
    for field in ("positions", "write", "start"):
        now, then = getattr(inp, field).flatten(), getattr(was, field).flatten()
        assert torch.equal(now[:live], then[:live] + 1) and torch.equal(now[live:], then[live:])
    assert torch.equal(inp.slots, was.slots) and torch.equal(inp.write_slot, was.write_slot)
    want = before.clone()
    decode_advance.reference(tokens, want, scratch, torch.empty_like(host))
    assert torch.equal(inp.packed, want)
