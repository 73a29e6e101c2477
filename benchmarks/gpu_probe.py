"""Early probe of what batch-1 decode can reach on this GPU, before the engine exists.

A gpt-fast-style static-KV Llama decode step over the shared random weights, timed as
(a) a CUDA graph of its eager kernels, (b) a CUDA graph of per-layer ``torch.compile`` kernels,
plus the floor of its matrix products alone. Prints JSON; see benchmarks/GPU_NOTES.md.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gpu_common import build_hf_model, copy_bandwidth, cuda_time_ms, hf_generate_tok_s, roofline


class Layer(torch.nn.Module):
    def __init__(self, hf, cfg, batch: int, max_len: int):
        super().__init__()
        a, m = hf.self_attn, hf.mlp
        self.wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
        self.wo = a.o_proj.weight.detach()
        self.w13 = torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()
        self.w2 = m.down_proj.weight.detach()
        self.n1, self.n2 = (
            hf.input_layernorm.weight.detach(),
            hf.post_attention_layernorm.weight.detach(),
        )
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        shape = (batch, self.kvh, max_len, self.d)
        self.k_cache = torch.zeros(shape, dtype=self.wo.dtype, device="cuda")
        self.v_cache = torch.zeros(shape, dtype=self.wo.dtype, device="cuda")

    def norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def forward(self, x, cos, sin, pos, mask):
        b, t, _ = x.shape
        qkv = F.linear(self.norm(x, self.n1), self.wqkv)
        q, k, v = qkv.split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], -1)
        q = q.view(b, t, self.h, self.d).transpose(1, 2)
        k = k.view(b, t, self.kvh, self.d).transpose(1, 2)
        v = v.view(b, t, self.kvh, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        o = F.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True
        )
        x = x + F.linear(o.transpose(1, 2).reshape(b, t, -1), self.wo)
        gu = F.linear(self.norm(x, self.n2), self.w13)
        g, u = gu.chunk(2, -1)
        return x + F.linear(F.silu(g) * u, self.w2)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Model(torch.nn.Module):
    def __init__(self, hf, batch: int, max_len: int):
        super().__init__()
        cfg = hf.config
        self.embed = hf.model.embed_tokens.weight.detach()
        self.head = hf.lm_head.weight.detach()
        self.norm_w = hf.model.norm.weight.detach()
        self.layers = torch.nn.ModuleList(Layer(hl, cfg, batch, max_len) for hl in hf.model.layers)
        inv = hf.model.rotary_emb.inv_freq.float()
        t = torch.arange(max_len, device="cuda", dtype=torch.float32)
        f = torch.outer(t, inv) * hf.model.rotary_emb.attention_scaling
        self.cos, self.sin = f.cos(), f.sin()
        self.causal = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device="cuda"))
        self.eps = cfg.rms_norm_eps

    def forward(self, tokens, pos):
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        mask = self.causal[pos][None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, pos, mask)
        return F.linear(self.layers[0].norm(x, self.norm_w), self.head)


def graph_step(model, batch: int):
    tok = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(tok, pos)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(tok, pos)
    return g, tok, pos, out


def time_decode(model, batch: int, steps: int = 64) -> float:
    g, tok, pos, out = graph_step(model, batch)

    def run():
        for i in range(steps):
            pos.fill_(100 + i)
            g.replay()
            tok.copy_(out[:, -1:].argmax(-1))

    run()
    ms = cuda_time_ms(run, 5)
    return steps / (ms / 1e3)


def gemv_floor(model, batch: int) -> float:
    """Milliseconds of the matrix products alone (one decode step's weights), graphed."""
    ws = [w for ly in model.layers for w in (ly.wqkv, ly.wo, ly.w13, ly.w2)] + [model.head]
    xs = {
        w.shape[1]: torch.randn(batch, w.shape[1], dtype=torch.bfloat16, device="cuda") for w in ws
    }

    def fn():
        for w in ws:
            F.linear(xs[w.shape[1]], w)

    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return cuda_time_ms(lambda: [g.replay() for _ in range(10)], 5) / 10


@torch.inference_mode()
def probe(shape: str, copy_bw: float) -> dict:
    t0 = time.perf_counter()
    hf = build_hf_model(shape)
    res = {"build_s": time.perf_counter() - t0, **roofline(hf, copy_bw)}
    res["hf_generate_tok_s"] = hf_generate_tok_s(hf, 32, 24)
    max_len = 1024
    model = Model(hf, 1, max_len)
    for b in (1, 8, 64):
        ms = gemv_floor(model, b)
        res[f"gemv_floor_ms_b{b}"] = ms
    res["gemv_floor_tok_s_b1"] = 1e3 / res["gemv_floor_ms_b1"]
    res["graph_eager_tok_s_b1"] = time_decode(model, 1)
    t0 = time.perf_counter()
    for layer in model.layers:
        layer.compile(fullgraph=True, dynamic=False)
    res["graph_compiled_tok_s_b1"] = time_decode(model, 1)
    res["compile_s_b1"] = time.perf_counter() - t0
    del model
    model = Model(hf, 64, 512)
    t0 = time.perf_counter()
    for layer in model.layers:
        layer.compile(fullgraph=True, dynamic=False)
    res["graph_compiled_tok_s_b64_aggregate"] = 64 * time_decode(model, 64, 32)
    res["compile_s_b64"] = time.perf_counter() - t0
    return res


def main() -> None:
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    out["copy_bytes_per_s"] = copy_bandwidth()
    for shape in ("llama-3-8b", "llama-3.2-1b"):
        out[shape] = probe(shape, out["copy_bytes_per_s"])
        print(json.dumps({shape: out[shape]}), flush=True)
        torch.cuda.empty_cache()
    text = json.dumps(out, indent=1)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
