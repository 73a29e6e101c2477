"""The draft model's chain as the one-graph step drafts it (``draft_model_device``), run eagerly
on the CPU: from a draft cache caught up to the window's start, the window's forward and the
one-token steps after it draft exactly what the general path's proposer drafts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from mathagent.config import EngineSettings
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model
from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, windows_of
from mathagent.serving.engine.spec_decode.draft_model import DraftModelProposer, draft_runner
from mathagent.serving.engine.spec_decode.draft_model_device import DeviceDraftModel


def _row(slot: int, ids: list[int]) -> SimpleNamespace:
    seq = SimpleNamespace(slot=slot, all_ids=ids, num_cached=len(ids) - 1, request_id=f"r{slot}",
                          last_token=ids[-1])  # fmt: skip
    return SimpleNamespace(seq=seq, state={}, greedy=True, hidden=None, warp=None)


def test_the_device_chain_drafts_what_the_general_path_drafts() -> None:
    settings = EngineSettings(device="cpu", dtype="float32", max_batch_size=4, max_seq_len=64)
    config = EngineConfig.from_settings(settings, "random:tiny")
    loaded = load_model("random:tiny", Path("/nonexistent"), config.device, config.dtype)
    engine = LLMEngine(config, Path("/nonexistent"), loaded)
    draft = load_model("random:tiny", Path("/nonexistent"), config.device, config.dtype).model
    with torch.no_grad():
        draft.output.weight.mul_(12.0)
    gen = torch.Generator().manual_seed(4)
    k = 3
    histories = [torch.randint(0, 1024, (n,), generator=gen).tolist() for n in (9, 14)]
    want = DraftModelProposer(draft_runner(draft, engine.runner))
    got = DraftModelProposer(draft_runner(draft, engine.runner))
    want_rows = [_row(s, h) for s, h in zip((1, 2), histories, strict=True)]
    drafts = want.propose(want_rows, k)  # the general path: the whole history, then k drafts
    rows = [_row(s, h) for s, h in zip((1, 2), histories, strict=True)]
    for row in rows:  # what the one-graph step's host side does first
        got.catch_up_to([row], row.seq.num_cached - k)
        assert row.state["cached"] == row.seq.num_cached - k
    slots, starts, windows = windows_of(rows, k)
    inp = ChainInputs.allocate(2, k + 1, torch.device("cpu"))
    inp.packed.copy_(torch.tensor(ChainInputs.columns(slots, starts, windows)))
    beams = DeviceDraftModel(got).run(inp, k)
    for b, d in enumerate(drafts):
        assert beams[b].tolist() == d.beams[0].tolist()
        # and the draft cache holds the same K/V at the same positions (rotary included):
        # the history, then the drafts but the last
        slot, end = slots[b], rows[b].seq.num_cached + k
        for cache in ("k", "v"):
            mine = getattr(got.runner.cache, cache)[:, slot, :, :end]
            theirs = getattr(want.runner.cache, cache)[:, slot, :, :end]
            assert torch.allclose(mine, theirs, atol=1e-5), (b, cache)
