"""The sampler's table form (what a decode step's tail graph samples from) against its host
form: the same draws from each request's generator, the same tokens."""

from __future__ import annotations

import torch

from mathagent.serving.engine.sampler import Cuts, Sampler, SamplingBatch
from mathagent.serving.engine.sampling_params import SamplingParams


def test_the_table_samples_what_the_host_sampler_samples() -> None:
    params = [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, top_p=0.7),
        SamplingParams(temperature=0.6, top_k=5),
    ]
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3
    for step in range(5):
        seeds = [100 + step, None, 200 + step, 300 + step]
        host_gens = [torch.Generator().manual_seed(s) if s else None for s in seeds]
        table_gens = [torch.Generator().manual_seed(s) if s else None for s in seeds]
        want = Sampler()(logits, SamplingBatch.build(params, host_gens, torch.device("cpu")))
        rows = [None if p.greedy else (p, g) for p, g in zip(params, table_gens, strict=True)]
        cuts = Cuts.of_rows(rows)
        assert cuts == Cuts(8, True)  # top-k 5 looks at the 8 largest
        table = Sampler.table(rows, 4)
        assert table[1].tolist() == [0.0, 1.0, 0.0, 0.0]  # a greedy row draws nothing
        got = Sampler.sample(logits, SamplingBatch.of_table(table, cuts), table[:, 3],
                             logits.argmax(-1))  # fmt: skip
        assert got.tolist() == want.tolist()
        for a, b in zip(host_gens, table_gens, strict=True):  # one draw each, same state
            if a is not None:
                assert torch.equal(a.get_state(), b.get_state())


def test_top_k_cuts_share_graphs_by_powers_of_two() -> None:
    def cuts(*ks: int) -> Cuts:
        return Cuts.of([SamplingParams(top_k=k) for k in ks])

    assert cuts(20) == cuts(30) == cuts(17, 32) == Cuts(32, False)
    assert cuts(0) == Cuts() and cuts(1) == Cuts(1, False) and cuts(33) == Cuts(64, False)


def test_all_greedy_rows_have_no_warp() -> None:
    assert Cuts.of_rows([None, None]) is None and Cuts.of_rows(None) is None
    assert Cuts.of_rows([None, (SamplingParams(temperature=0.5), None)]) == Cuts()
