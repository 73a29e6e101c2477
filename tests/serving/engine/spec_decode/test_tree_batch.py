"""Ragged trees (a chain of ``k`` beside a longer prompt-lookup chain): the verify nodes, mask
and greedy acceptance are those of the same beams padded to one depth, less the padding's
nodes, which no argmax can accept."""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.spec_decode.tree_batch import TreeBatch, layout


def test_a_uniform_layout_is_the_padded_block_flattened() -> None:
    lay = layout((3, 3), 3, torch.device("cpu"))
    assert lay.depths.tolist() == [0, 1, 2, 3, 1, 2, 3]
    assert lay.parents.tolist() == [0, 1, 2, 0, 4, 5]
    assert lay.offsets.tolist() == [1, 4]
    assert lay.gather.tolist() == [0, 1, 2, 3, 5, 6, 7]


def test_a_ragged_layout_leaves_the_short_beams_padding_out() -> None:
    lay = layout((2, 4), 4, torch.device("cpu"))  # the longer beam 1 takes nodes 1-4
    assert lay.depths.tolist() == [0, 1, 2, 3, 4, 1, 2]
    assert lay.offsets.tolist() == [5, 1]
    assert lay.gather.tolist() == [0, 6, 7, 8, 9, 1, 2]
    # columns 2, 3 of beam 0 are padding (parent: the root); beam 1's chain runs 1 -> 4
    assert lay.parents.tolist() == [0, 5, 0, 0, 0, 1, 2, 3]
    seen = lay.mask.int()
    assert seen[6].tolist() == [1, 0, 0, 0, 0, 1, 1]  # beam 0, depth 2: root and its beam
    assert seen[4].tolist() == [1, 1, 1, 1, 1, 0, 0]  # beam 1, depth 4


@pytest.mark.parametrize("lengths", [(4, 11), (6, 9), (11, 4), (3, 3), (5,), (2, 7, 4)])
def test_no_accepted_path_moves_kv_onto_a_position_another_move_reads(lengths) -> None:
    """``move_path`` (one program per position, in parallel on the GPU) is safe only if the
    positions it writes and the nodes it reads from are apart, for every beam and accepted
    count: a chain of 4 laid out before a lookup of 11 failed this (H200, float32: 5 of 32
    outputs left plain greedy, run 109)."""
    depth = max(lengths)
    lay = layout(lengths, depth, torch.device("cpu"))
    for w, n in enumerate(lengths):
        for accepted in range(n + 1):
            nodes = [int(lay.offsets[w]) + j - 1 for j in range(1, accepted + 1)]
            path = [0, *nodes] + [nodes[-1] if nodes else 0] * (depth - accepted)
            moved = [j for j in range(depth + 1) if path[j] != j]
            assert not {path[j] for j in moved} & set(moved), (w, accepted, path)


def test_ragged_acceptance_is_the_padded_trees_without_its_padding_nodes() -> None:
    """Random beams and target logits: the ragged tree accepts the same count and tokens as
    the padded tree (whose padding nodes never match), at the corresponding nodes."""
    gen = torch.Generator().manual_seed(5)
    k, d, vocab, batch = 3, 6, 4, 64  # a small vocabulary: long accepted prefixes happen
    beams = torch.randint(0, vocab, (batch, 2, d + 1), generator=gen)
    beams[:, 1, 0] = beams[:, 0, 0]
    beams[:, 0, 1 + k :] = -1
    padded, ragged = TreeBatch(beams, []), TreeBatch(beams, [], (k, d))
    assert (padded.nodes, ragged.nodes) == (1 + 2 * d, 1 + k + d)
    logits = torch.randn(batch, padded.nodes, vocab, generator=gen)
    pred = logits.argmax(-1)
    for row in range(batch // 4):  # a quarter of the rows: beam 1 right for a random stretch
        right = int(torch.randint(k, d + 1, (1,), generator=gen))
        for j in range(1, right + 1):
            beams[row, 1, j] = pred[row, 0 if j == 1 else d + j - 1]
    # the padded tree's node of each ragged node: root, all of beam 1, beam 0's first k
    keep = torch.tensor([0, *range(1 + d, 1 + 2 * d), *range(1, 1 + k)])
    want = padded.greedy_accept(logits)
    got = ragged.greedy_accept(logits[:, keep])
    assert torch.equal(want[0], got[0]) and torch.equal(want[2], got[2])
    assert torch.equal(keep[got[1]], want[1])
    assert torch.equal(ragged.tokens(), padded.tokens()[:, keep])
    assert torch.equal(ragged.node_depths(), padded.node_depths()[keep])
    assert torch.equal(ragged.mask(), padded.mask()[keep][:, keep])
    assert (got[0] > k).any(), "no row accepted past the chain: the case is not exercised"
