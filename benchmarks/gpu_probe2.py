"""Probe 2: the CUDA path (Triton GEMV + split-KV attention + per-layer compile + CUDA graphs)
over the engine's Transformer, before the engine's runner exists: correctness against the eager
model, step times, and a kernel-time profile of one step. Prints JSON; see GPU_NOTES.md."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gpu_common import SHAPES, build_hf_model, cuda_time_ms  # noqa: E402

from mathagent.serving.engine import cuda_kernels  # noqa: E402
from mathagent.serving.engine.cuda_graphs import CudaGraphRunner  # noqa: E402
from mathagent.serving.engine.kv_cache import KVCache  # noqa: E402
from mathagent.serving.engine.model import ForwardContext, ModelArgs, Transformer, rope_table  # noqa: E402

HF_TO_ENGINE = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
                "self_attn.o_proj": "attention.wo", "mlp.down_proj": "feed_forward.w2"}  # fmt: skip


def engine_from_hf(hf) -> Transformer:
    cfg = hf.config.to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    args = ModelArgs.from_hf_config(cfg)
    with torch.device("meta"):
        model = Transformer(args)
    sd = hf.state_dict()
    st = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"],
          "output.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"])}
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        st[f"layers.{i}.attention.wqkv.weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        st[f"layers.{i}.feed_forward.w13.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        for a, b in HF_TO_ENGINE.items():
            st[f"layers.{i}.{b}.weight"] = sd[p + a + ".weight"]
    model.load_state_dict(st, assign=True, strict=True)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.eval()


def make(model, slots, max_seq):
    a = model.args
    dt = model.output.weight.dtype
    cache = KVCache(a.num_layers, slots + 1, a.num_kv_heads, max_seq, a.head_dim, dt, torch.device("cuda"))
    cos, sin = rope_table(a, max_seq)
    cos, sin = cos.cuda().to(dt), sin.cuda().to(dt)
    return cache, cos, sin, CudaGraphRunner(model, cache, cos, sin, slots, slots)


def eager_forward(model, cache, cos, sin, tokens, positions, slot):
    kv_len = int(positions.max()) + 1
    ctx = ForwardContext(cache=cache, slots=torch.tensor([slot], device="cuda"), write_positions=positions,
                         kv_len=kv_len, attn_mask=(torch.arange(kv_len, device="cuda") <= positions[:, :, None])[:, None],
                         cos=cos[positions][:, None], sin=sin[positions][:, None], slot_start=slot)
    h = model(tokens, ctx)
    return model.logits(h)


@torch.inference_mode()
def check(dtype) -> dict:
    torch.manual_seed(1)
    cfg = dict(SHAPES["llama-3.2-1b"], hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
               vocab_size=1000, head_dim=64, num_attention_heads=16, num_key_value_heads=4)
    SHAPES["check"] = cfg
    hf = build_hf_model("check").to(dtype)
    for p in hf.parameters():  # peaky logits so argmax is stable
        p.data.normal_(0, 0.08)
    model = engine_from_hf(hf)
    cache, cos, sin, runner = make(model, 4, 256)
    L = 40
    toks = torch.randint(0, 1000, (1, L), device="cuda")
    ref = eager_forward(model, cache, cos, sin, toks, torch.arange(L, device="cuda")[None], 1)[0]  # [L, V]
    cache.k.zero_(); cache.v.zero_()
    outs = []
    for i in range(L):
        lg, _ = runner.run(toks[:, i:i+1], torch.tensor([[i]], device="cuda"), torch.tensor([1], device="cuda"),
                           torch.tensor([[i]], device="cuda"))
        outs.append(lg[0, 0].clone())
    out = torch.stack(outs)
    # verify window of 4 after 20 cached tokens, in slot 2 (batch of 2 rows with slot 3)
    cache.k.zero_(); cache.v.zero_()
    pos = torch.arange(L, device="cuda")[None]
    eager_forward(model, cache, cos, sin, toks[:, :20], pos[:, :20], 2)
    eager_forward(model, cache, cos, sin, toks[:, :20], pos[:, :20], 3)
    wv, _ = runner.run(toks[:, 20:24].expand(2, 4), pos[:, 20:24].expand(2, 4), torch.tensor([2, 3], device="cuda"),
                       pos[:, 20:24].expand(2, 4))
    rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())
    return {"dtype": str(dtype), "decode_rel_err": rel(out, ref), "decode_argmax_equal": bool((out.argmax(-1) == ref.argmax(-1)).all()),
            "verify_rel_err": rel(wv[0], ref[20:24]), "verify_row2_rel_err": rel(wv[1], ref[20:24]),
            "verify_argmax_equal": bool((wv.argmax(-1) == ref[20:24].argmax(-1)).all())}


def gemv_vs_cublas(model) -> dict:
    res = {}
    b0 = model.layers[0]
    ws = {"wqkv": b0.attention.wqkv.weight, "wo": b0.attention.wo.weight, "w13": b0.feed_forward.w13.weight,
          "w2": b0.feed_forward.w2.weight, "head": model.output.weight}
    for name, w in ws.items():
        for m in (1, 4):
            x = torch.randn(m, w.shape[1], dtype=w.dtype, device="cuda")
            ref = F.linear(x, w)
            y = cuda_kernels.gemv(x, w)
            err = float((y.float() - ref.float()).norm() / ref.float().norm())
            t_tr = cuda_time_ms(lambda: [cuda_kernels.gemv(x, w) for _ in range(20)], 5) / 20
            t_cb = cuda_time_ms(lambda: [F.linear(x, w) for _ in range(20)], 5) / 20
            gb = w.numel() * w.element_size() / 1e9
            res[f"{name}_m{m}"] = {"triton_TBps": gb / t_tr, "cublas_TBps": gb / t_cb, "rel_err": err}
    return res


def decode_tok_s(runner, batch, steps=64, width=1, start=200) -> float:
    dev = "cuda"
    toks = torch.zeros(batch, width, dtype=torch.long, device=dev)
    slots = torch.arange(batch, device=dev)
    pos = torch.full((batch, width), start, device=dev) + torch.arange(width, device=dev)
    runner.run(toks, pos, slots, pos)  # capture
    key = (runner.bucket(batch), width)
    graph, inp, (logits, _) = runner.graphs[key]

    def loop():
        for i in range(steps):
            inp.positions.add_(1); inp.start.add_(1)
            graph.replay()
            inp.tokens.copy_(logits[:, -width:].argmax(-1))
    loop()
    ms = cuda_time_ms(loop, 3)
    return steps / (ms / 1e3)


def profile_step(runner, model) -> list:
    from torch.profiler import ProfilerActivity, profile
    key = (1, 1)
    _, inp, _ = runner.graphs[key]
    fwd = runner.forward
    with torch.inference_mode():
        fwd(inp)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd(inp)
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append((e.key[:90], e.count, round(e.device_time_total, 1)))
    rows.sort(key=lambda r: -r[2])
    return rows[:25]


@torch.inference_mode()
def speed(shape) -> dict:
    hf = build_hf_model(shape)
    model = engine_from_hf(hf)
    del hf
    res = {"gemv": gemv_vs_cublas(model)}
    t0 = time.perf_counter()
    cache, cos, sin, runner = make(model, 64, 1024)
    res["b1_tok_s"] = decode_tok_s(runner, 1)
    res["b1_first_capture_s"] = time.perf_counter() - t0
    res["b1_tok_s_again"] = decode_tok_s(runner, 1)
    for w in (2, 4, 5):
        res[f"verify_T{w}_steps_s"] = decode_tok_s(runner, 1, 32, width=w)
    for b in (8, 64):
        t0 = time.perf_counter()
        res[f"b{b}_aggregate_tok_s"] = b * decode_tok_s(runner, b, 32)
        res[f"b{b}_capture_s"] = time.perf_counter() - t0
    res["profile_b1"] = profile_step(runner, model)
    return res


def main():
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        try:
            out[f"check_{dt}"] = check(dt)
        except Exception as e:  # noqa: BLE001
            import traceback; traceback.print_exc()
            out[f"check_{dt}"] = repr(e)[:2000]
        print(json.dumps(out), flush=True)
    for shape in sys.argv[1:] or ("llama-3-8b", "llama-3.2-1b"):
        try:
            out[shape] = speed(shape)
        except Exception as e:  # noqa: BLE001
            import traceback; traceback.print_exc()
            out[shape] = repr(e)[:2000]
        print(json.dumps({shape: out[shape]}), flush=True)
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe2.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
