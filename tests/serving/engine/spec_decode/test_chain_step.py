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


class _Kept(_Chain):
    """A drafter that keeps the streams it is shown, as EAGLE-3's head fuses them."""

    def __init__(self, slots: int, seq: int, width: int) -> None:
        super().__init__(0)
        self.feats = torch.zeros(slots, seq, width)

    def verified(self, inp: ChainInputs, pos: torch.Tensor, captured) -> None:
        self.feats[inp.slots[:, None].expand_as(pos), pos] = captured


def _glue_case():
    """One tree step's inputs and outcome on the CPU: ``ChainStep.feed`` then ``finish``."""
    from types import SimpleNamespace

    from mathagent.serving.engine.cuda.forward import StepInputs
    from mathagent.serving.engine.spec_decode.tree_batch import TreeBatch

    gen = torch.Generator().manual_seed(3)
    k, width, bucket, layers, seq, hidden = 3, 2, 4, 2, 40, 5
    kv = [torch.randn(layers, SCRATCH + 1, 1, seq, 2, generator=gen) for _ in range(2)]
    graphs = SimpleNamespace(forward=SimpleNamespace(k=kv[0], v=kv[1]), scratch_slot=SCRATCH)
    drafter = _Kept(SCRATCH + 1, seq, 3)
    step = ChainStep(drafter, graphs, width)
    inp = ChainInputs.allocate(bucket, k + 1, torch.device("cpu"))
    values = ChainInputs.columns([0, 4, 7, SCRATCH], [5, 9, 0, 0], [[1, 2, 3, 4]] * bucket)
    inp.packed.copy_(torch.tensor(values))
    beams = torch.randint(0, 50, (bucket, width, k + 1), generator=gen)
    tree = TreeBatch(beams, [])
    verify = StepInputs.allocate(bucket, tree.nodes, torch.device("cpu"))
    c = step.feed(tree, inp, verify)
    nodes = tree.nodes
    hidden_states = torch.randn(bucket, nodes, hidden, generator=gen)
    captured = torch.randn(bucket, nodes, 3, generator=gen)
    accepted = torch.tensor([2, 0, 3, 1])
    path = torch.tensor([[0, 4, 5, 5], [0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 1, 1]])
    tokens = torch.randint(0, 50, (bucket, k + 1), generator=gen)
    out = step.finish(inp, c, accepted, path, tokens, hidden_states, captured, width)
    return c, verify, inp, kv, drafter.feats, out, (hidden_states, captured, path, accepted)


def test_the_verify_inputs_and_the_step_after_it() -> None:
    """What a captured chain step writes around its verify forward: the forward's inputs (root
    at ``c = start + k + 1``, nodes at consecutive write positions, rope positions by depth,
    every node on the row's slot, all in one copy into the packed buffer), the accepted path's
    K/V and kept streams moved into place, the outcome and the next step's inputs."""
    c, verify, _, kv, feats, (outcome, last), (hidden, captured, _, accepted) = _glue_case()
    assert c.tolist() == [9, 13, 4, 4]
    assert verify.slots.tolist() == [0, 4, 7, SCRATCH] and verify.start.tolist() == c.tolist()
    assert verify.write[0].tolist() == list(range(9, 16))
    assert verify.positions[0].tolist() == [9, 10, 11, 12, 10, 11, 12]  # two beams of depth 3
    assert (verify.write_slot[1] == 4).all()
    assert outcome[:, 0].tolist() == accepted.tolist()
    assert torch.equal(last[0], hidden[0, 5])  # row 0 accepted 2 drafts of beam 1: node 5
    assert torch.equal(feats[0, 9 + 2], captured[0, 5])  # its stream, moved to position c + 2
    assert torch.equal(kv[0][:, 0, :, 9 + 1], kv[0][:, 0, :, 9 + 4])  # and its K/V


def test_a_chain_no_graph_takes_is_refused_with_one_warning(caplog) -> None:
    # H200, run 81: chains of 8 beside the lookup branch verify 17 tokens a row, one more than
    # the widest graph, and every step ran on the host path (36.7 ms against 1.2)
    from types import SimpleNamespace

    from mathagent.serving.engine.cuda.graphs import MAX_WIDTH

    graphs = SimpleNamespace(accepts=lambda batch, width: batch <= 8 and width <= MAX_WIDTH)
    step = ChainStep(SimpleNamespace(device=torch.device("cpu")), graphs, width=2)  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        assert step.fits(4, 7) and not step.fits(16, 7)  # too many rows: no warning
        assert not step.fits(1, 8) and not step.fits(4, 8)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "17 tokens a row" in warned[0]
