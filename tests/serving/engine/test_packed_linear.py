"""MKL-packed float32 linears: nn.Linear's results, and per-row results that do not depend on
how many rows share the step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mathagent.serving.engine import packed_linear
from mathagent.serving.engine.packed_linear import PACK_ROWS, PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch built without MKL")


@pytest.fixture
def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(96, 160, bias=True).requires_grad_(False)


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 8, 9, 13, 16, 17, 33])
def test_matches_nn_linear(linear, rows):
    x = torch.randn(rows, 1, 96)
    packed = PackedLinear(linear)
    out = packed(x)
    assert out.shape == (rows, 1, 160)
    torch.testing.assert_close(out, linear(x), rtol=1e-5, atol=1e-5)
    if not any(p // 2 <= rows <= p for p in PACK_ROWS):
        assert torch.equal(out, linear(x))  # the plain path, bit for bit


@pytest.mark.parametrize("pack", PACK_ROWS)
def test_a_row_gets_the_same_bits_in_a_padded_step_or_in_a_full_one(linear, pack):
    x = torch.randn(pack, 96)
    packed = PackedLinear(linear)
    assert torch.equal(packed(x[: pack // 2 + 1]), packed(x)[: pack // 2 + 1])


def test_pack_linears_swaps_float32_linears_and_keeps_tied_weights():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 64, bias=False))
    model[2].weight = nn.Parameter(torch.randn(64, 32), requires_grad=False)
    tied = model[2].weight
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and model[2].weight is tied
    assert pack_linears(model) == 0  # already packed
