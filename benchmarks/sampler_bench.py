"""Time the sampling warp on the device: ``Sampler.probs`` + inverse-CDF sampling per row set.

Each case is captured in one CUDA graph and replayed (so launch gaps do not count), for the
default model's vocabulary (49152) at 1, 7 (a chain of 6 plus its root) and 32 rows, for the
cuts a batch can ask for. ``two_sorts`` is the rule before run 66 (a sort for top-k, another
for top-p, the kept set scattered back), kept here as the "before" of the A/B.

    PYTHONPATH=. python benchmarks/sampler_bench.py --out sampler.json
"""

from __future__ import annotations

import argparse
import json

import torch

from mathagent.serving.engine.sampler import Cuts, Sampler, SamplingBatch


def two_sorts(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The warp before: both cuts always, each from its own sort."""
    temp = torch.where(batch.temperature > 0, batch.temperature, 1.0)
    logits = logits.float() / temp[:, None]
    vocab = logits.shape[-1]
    k = torch.where(batch.top_k > 0, batch.top_k, vocab).clamp(max=vocab)
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = (cum - sorted_logits.softmax(-1)) >= batch.top_p[:, None]
    drop_sorted &= (batch.top_p < 1.0)[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf")).softmax(dim=-1)


def time_graph(fn, replays: int = 50) -> float:
    """Microseconds per replay of ``fn`` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 7, 32])
    parser.add_argument("--out")
    args = parser.parse_args()
    dev = torch.device("cuda")
    cases = {"temperature": (1.0, 0, Cuts()), "top_k 50": (1.0, 50, Cuts(50, False)),
             "top_p 0.95": (0.95, 0, Cuts(0, True)), "top_k 50 + top_p 0.95": (0.95, 50, Cuts(50, True))}  # fmt: skip
    out = {"vocab": args.vocab, "device": torch.cuda.get_device_name(), "us": {}}
    for rows in args.rows:
        logits = torch.randn(rows, args.vocab, device=dev) * 4
        u = torch.rand(rows, device=dev)
        for name, (top_p, top_k, cuts) in cases.items():
            batch = SamplingBatch(torch.full((rows,), 0.7, device=dev), torch.full((rows,), top_p, device=dev),
                                  torch.full((rows,), top_k, device=dev, dtype=torch.long), [], False, cuts)  # fmt: skip
            new = time_graph(
                lambda b=batch, x=logits, v=u: Sampler.sample_at(Sampler.probs(x, b), v)
            )
            old = time_graph(lambda b=batch, x=logits, v=u: Sampler.sample_at(two_sorts(x, b), v))
            same = torch.allclose(Sampler.probs(logits, batch), two_sorts(logits, batch), atol=1e-6)
            out["us"][f"{rows} rows, {name}"] = {"now": round(new, 1), "two_sorts": round(old, 1), "same_law": same}  # fmt: skip
            print(rows, name, round(new, 1), round(old, 1), same, flush=True)
    text = json.dumps(out, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
