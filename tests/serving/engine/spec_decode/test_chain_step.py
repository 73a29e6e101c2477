"""A fused chain step launched ahead runs on inputs its own graph advanced from the step
before; the host claims it only when those equal what it would have sent. Both sides compute
the same advance: the device's in the graph (:meth:`ChainStep.advance`), the host's in
:func:`advanced`. Here both run on the CPU over random outcomes, padded rows included."""

from __future__ import annotations

import torch

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, ChainStep, advanced

SCRATCH = 9


def test_the_graph_and_the_host_advance_a_step_alike() -> None:
    gen = torch.Generator().manual_seed(5)
    k, rows, bucket = 4, 3, 4
    for _ in range(50):
        slots = [0, 2, 5]
        starts = torch.randint(0, 100, (rows,), generator=gen).tolist()
        windows = torch.randint(0, 500, (rows, k + 1), generator=gen).tolist()
        accepted = torch.randint(0, k + 1, (bucket,), generator=gen)
        tokens = torch.randint(0, 500, (bucket, k + 1), generator=gen)
        tokens[torch.arange(k + 1)[None] > accepted[:, None]] = -1  # after the bonus token
        inp = ChainInputs.allocate(bucket, k + 1, torch.device("cpu"))
        values = ChainInputs.columns([*slots, SCRATCH], [*starts, 0], [*windows, [0] * (k + 1)])
        inp.packed.copy_(torch.tensor(values))
        ChainStep.advance(inp, accepted, tokens, SCRATCH)
        outcome = torch.cat([accepted[:, None], tokens], 1).tolist()
        want_starts, want_windows = advanced(starts, windows, outcome[:rows])
        assert inp.start[:rows].tolist() == want_starts
        assert inp.window[:rows].tolist() == want_windows
        assert inp.start[rows].item() == 0 and inp.window[rows].tolist() == [0] * (k + 1)
        assert inp.slots.tolist() == [*slots, SCRATCH]
        a = outcome[0][0]
        assert want_windows[0][-1] == outcome[0][a + 1]  # the new root: the bonus token


class _Chain:
    """A chain drafter that drafts ``base + j`` and records what the step told it."""

    device = torch.device("cpu")

    def __init__(self, base: int) -> None:
        self.base, self.seen = base, []

    def run(self, inp: ChainInputs, k: int) -> torch.Tensor:
        drafts = self.base + torch.arange(k).expand(inp.window.shape[0], k)
        return torch.cat([inp.window[:, -1:], drafts], 1)

    def verified(self, inp: ChainInputs, pos: torch.Tensor, captured) -> None:
        self.seen.append(pos)


class _Sampling(_Chain):
    def run_sampled(self, inp, k, warp, u):
        return self.run(inp, k), torch.full((inp.window.shape[0], k, 3), 1 / 3)


def test_branches_stack_their_chains_sample_the_first_and_hear_every_verify() -> None:
    from mathagent.serving.engine.spec_decode.chain_step import Branches, samples_drafts

    inp = ChainInputs.allocate(2, 4, torch.device("cpu"))
    head, lookup = _Sampling(100), _Chain(200)
    tree = Branches(head, lookup)
    assert samples_drafts(tree) and not samples_drafts(Branches(lookup, head))
    assert samples_drafts(head) and not samples_drafts(lookup)
    beams = tree.run(inp, 3)
    assert beams.shape == (2, 2, 4) and beams[0, 1, 1:].tolist() == [200, 201, 202]
    sampled, q = tree.run_sampled(inp, 3, None, None)
    assert torch.equal(sampled, beams) and q.shape == (2, 3, 3)
    pos = torch.arange(4).expand(2, 4)
    tree.verified(inp, pos, None)
    assert len(head.seen) == len(lookup.seen) == 1
