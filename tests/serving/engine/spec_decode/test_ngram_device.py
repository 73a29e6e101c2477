"""The device n-gram lookup (``ngram_device.py``, run inside the one-graph step on CUDA) drafts
what the host's :class:`NgramProposer` drafts, over the same histories. Here both run on the
CPU, over random histories with planted repeats, through the table the step keeps: filled by
the host once, then extended by each step's window."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs
from mathagent.serving.engine.spec_decode.ngram import NgramProposer
from mathagent.serving.engine.spec_decode.ngram_device import DeviceNgram


def _host(lookup: NgramProposer, ids: list[int], k: int) -> list[int]:
    draft = lookup.propose(torch.tensor(ids), k)
    return draft + [-1] * (k - len(draft))


def test_the_device_lookup_drafts_what_the_host_lookup_drafts() -> None:
    gen = torch.Generator().manual_seed(8)
    k, max_seq = 4, 400
    for window in (1024, 16):  # the whole history, and only its latest tokens
        lookup = NgramProposer(max_window=window)
        device = DeviceNgram(lookup, slots=3, max_seq=max_seq, device=torch.device("cpu"))
        for trial in range(30):
            vocab = int(torch.randint(3, 40, (1,), generator=gen))  # small: many repeats
            length = int(torch.randint(k + 2, 300, (1,), generator=gen))
            ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
            seq = SimpleNamespace(slot=trial % 3, all_ids=ids, num_cached=length - 1,
                                  request_id=f"r{trial}")  # fmt: skip
            device.sync(seq, k + 1)
            c = seq.num_cached
            inp = ChainInputs.allocate(1, k + 1, torch.device("cpu"))
            values = ChainInputs.columns([seq.slot], [c - (k + 1)], [ids[c - k : c + 1]])
            inp.packed.copy_(torch.tensor(values))
            beams = device.run(inp, k)[0].tolist()
            assert beams == [ids[-1], *_host(lookup, ids, k)], (window, trial)


def test_the_table_follows_the_steps_windows_and_a_new_request() -> None:
    gen = torch.Generator().manual_seed(9)
    k, lookup = 3, NgramProposer()
    device = DeviceNgram(lookup, slots=2, max_seq=200, device=torch.device("cpu"))
    ids = torch.randint(0, 6, (20,), generator=gen).tolist()
    seq = SimpleNamespace(slot=1, all_ids=ids, num_cached=19, request_id="a")
    device.sync(seq, k + 1)
    for _ in range(10):  # each step commits 1..k+1 tokens; only its window reaches the table
        ids += torch.randint(0, 6, (int(torch.randint(1, k + 2, (1,), generator=gen)),),
                             generator=gen).tolist()  # fmt: skip
        seq.num_cached = len(ids) - 1
        device.sync(seq, k + 1)  # covered by the window: no host fill
        c = seq.num_cached
        inp = ChainInputs.allocate(1, k + 1, torch.device("cpu"))
        inp.packed.copy_(torch.tensor(ChainInputs.columns([1], [c - (k + 1)], [ids[c - k :]])))
        assert device.run(inp, k)[0].tolist() == [ids[-1], *_host(lookup, ids, k)]
    assert device.table[1, : len(ids)].tolist() == ids
    other = SimpleNamespace(slot=1, all_ids=[5, 5, 5, 5, 5, 5], num_cached=5, request_id="b")
    device.sync(other, k + 1)  # a new request in the slot: the old tokens are gone
    assert device.table[1, :7].tolist() == [5] * 6 + [-2]
