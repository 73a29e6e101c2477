"""The ReDrafter head: checkpoint format, teacher forcing and beam search."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from mathagent.serving.engine.spec_decode.ngram import NgramProposer
from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig

# What TensorRT-LLM's examples/redrafter/convert_checkpoint.py reads from a drafter folder.
TRTLLM_CONFIG_KEYS = {"hidden_size", "exit_dim", "num_draft_layers", "rnn", "vocab_size"}


def trtllm_tensor_names(config: dict) -> set[str]:
    names = {
        f"lm_head.{config['num_draft_layers']}.weight",
        "rnn_u.weight",
        "rnn_u.bias",
        "rnn_w.weight",
    }
    for i in range(config["num_draft_layers"]):
        names |= {f"lm_head.{i}.linear.weight", f"lm_head.{i}.linear.bias"}
    if config["exit_dim"] != 2 * config["hidden_size"]:
        names |= {"input_proj.weight", "input_proj.bias"}
    return names


def assert_trtllm_checkpoint(path: Path) -> None:
    """The folder holds exactly what the TensorRT-LLM converter looks up."""
    config = json.loads((path / "config.json").read_text())
    assert config.keys() >= TRTLLM_CONFIG_KEYS
    assert set(load_file(str(path / "model.safetensors"))) == trtllm_tensor_names(config)


def _drafter(exit_dim: int = 32) -> Drafter:
    torch.manual_seed(0)
    d = Drafter(DrafterConfig(vocab_size=50, hidden_size=16, exit_dim=exit_dim, num_draft_layers=2))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return d


def test_checkpoint_round_trip_uses_trtllm_names(tmp_path: Path) -> None:
    for exit_dim in (32, 24):
        d = _drafter(exit_dim)
        d.save_pretrained(tmp_path / str(exit_dim))
        assert_trtllm_checkpoint(tmp_path / str(exit_dim))
        again = Drafter.from_pretrained(tmp_path / str(exit_dim))
        x, s = torch.randn(3, 16), torch.randn(3, 16)
        torch.testing.assert_close(again.logits(x, s), d.logits(x, s))


def test_teacher_forcing_matches_step_by_step_drafting() -> None:
    d = _drafter()
    emb = torch.randn(50, 16)
    hidden, toks = torch.randn(1, 6, 16), torch.randint(0, 50, (6,))
    tf = d.teacher_forced_features(hidden, emb[toks][None], steps=3)
    t = 1  # position 1: state advances on tokens 2, 3, 4 and predicts 3, 4, 5
    state = torch.zeros(1, 16)
    for i in range(3):
        state = d.step_state(state, emb[toks[t + 1 + i]][None])
        torch.testing.assert_close(d.lm_head[-1](tf[i][0, t]), d.logits(hidden[:, t], state)[0])


def test_beam_search_top_beam_is_greedy_and_beams_are_distinct() -> None:
    d = _drafter()
    emb = torch.randn(50, 16)
    ctx, root = torch.randn(2, 16), torch.tensor([3, 7])
    beams = d.beam_search(ctx, root, emb, width=4, length=3)
    assert beams.shape == (2, 4, 4)
    assert (beams[..., 0] == root[:, None]).all()
    for b in range(2):
        assert len({tuple(r) for r in beams[b].tolist()}) == 4
    one = d.beam_search(ctx, root, emb, width=1, length=3)
    state, tok = torch.zeros(2, 16), root
    for i in range(3):
        state = d.step_state(state, emb[tok])
        tok = d.logits(ctx, state).argmax(-1)
        assert one[:, 0, 1 + i].tolist() == tok.tolist()


def test_ngram_copies_what_followed_the_latest_match() -> None:
    prop = NgramProposer(max_ngram=2)
    hist = torch.tensor([1, 2, 3, 4, 9, 1, 2, 5, 6, 1, 2])
    assert prop.propose(hist, 3) == [5, 6, 1]
    assert prop.propose(torch.tensor([7, 8]), 3) == []
    batch = prop.propose_batch([hist, torch.tensor([4, 4])], 2)
    assert batch.tolist() == [[5, 6], [4, -1]]


def test_a_shared_head_drafts_like_the_own_head() -> None:
    torch.manual_seed(1)
    emb = torch.randn(50, 16)
    d = Drafter(DrafterConfig(vocab_size=50, hidden_size=16, exit_dim=16, lm_head_from_base=True))
    d.lm_head[-1].weight.data.copy_(emb)
    ctx, root = torch.randn(2, 16), torch.tensor([3, 7])
    own = [d.beam_search(ctx, root, emb, width=w, length=3) for w in (1, 3)]
    calls = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape)
        return x @ emb.T

    d.use_head(head)
    shared = [d.beam_search(ctx, root, emb, width=w, length=3) for w in (1, 3)]
    assert calls and all(len(s) == 2 for s in calls)  # the head sees [N, exit_dim] rows
    for a, b in zip(own, shared, strict=True):
        assert torch.equal(a, b)


def test_a_draft_vocabulary_restricts_drafts_and_round_trips(tmp_path: Path) -> None:
    d = _drafter()
    emb = torch.randn(50, 16)
    vocab = torch.tensor([2, 5, 11, 17, 23, 29, 31, 40])
    ctx, root = torch.randn(2, 16), torch.tensor([3, 7])
    full = d.logits(ctx, torch.randn(2, 16))
    d.set_draft_vocab(vocab)
    beams = d.beam_search(ctx, root, emb, width=3, length=3)
    chain = d.beam_search(ctx, root, emb, width=1, length=3)
    for drafts in (beams[..., 1:], chain[..., 1:]):
        assert bool(torch.isin(drafts, vocab).all())
    state = torch.randn(2, 16)
    sub = d.logits(ctx, state)
    assert sub.shape == (2, 8)
    # the restricted head is the full head's columns: the argmax within the vocabulary agrees
    d_full = _drafter()
    torch.testing.assert_close(d_full.logits(ctx, state)[:, vocab], sub)
    assert full.shape == (2, 50)
    drafts, q = d.sample_chain(ctx[:1], root[:1], emb, 3, lambda x: x.softmax(-1))
    assert q.shape == (1, 3, 50) and bool(torch.isin(drafts, vocab).all())
    torch.testing.assert_close(q.sum(-1), torch.ones(1, 3))
    assert float(q[..., [i for i in range(50) if i not in vocab.tolist()]].abs().sum()) == 0.0
    d.save_pretrained(tmp_path / "dv")
    again = Drafter.from_pretrained(tmp_path / "dv")
    assert again.config.draft_vocab_size == 8 and torch.equal(again.draft_vocab, vocab)
    torch.testing.assert_close(again.logits(ctx, state), sub)


def test_the_device_drafter_searches_from_per_slot_contexts_kept_current() -> None:
    """The one-graph ReDrafter step's drafter (``redrafter_device``): beams from each slot's
    context as the host path's beam search draws them, the context written from the host only
    when the device's is not current, and taken from the step's own verify otherwise."""
    from types import SimpleNamespace

    from mathagent.serving.engine.spec_decode.chain_step import ChainInputs
    from mathagent.serving.engine.spec_decode.redrafter import ReDrafterProposer
    from mathagent.serving.engine.spec_decode.redrafter_device import DeviceReDrafter

    torch.manual_seed(0)
    d = Drafter(DrafterConfig(vocab_size=50, hidden_size=16, exit_dim=32, num_draft_layers=2))
    for p in d.parameters():
        p.data.normal_(0.0, 0.3)
    emb = torch.randn(50, 16)
    proposer = ReDrafterProposer(d, emb, beams=3)
    device = DeviceReDrafter(proposer, slots=5, device=torch.device("cpu"))
    hidden = torch.randn(2, 16)
    rows = [SimpleNamespace(seq=SimpleNamespace(slot=s, request_id=f"r{s}"), hidden=h)
            for s, h in zip((3, 1), hidden, strict=True)]  # fmt: skip
    for row in rows:
        device.sync(row)
    inp = ChainInputs.allocate(2, 4, torch.device("cpu"))
    inp.slots.copy_(torch.tensor([3, 1]))
    inp.window.copy_(torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]))
    beams = device.run(inp, 3)
    assert torch.equal(beams, d.beam_search(hidden, torch.tensor([4, 8]), emb, 3, 3))
    last = torch.randn(2, 16)
    device.settled(inp, last)  # the step's verify: the next contexts
    device.sync(rows[0])  # current: the host's older hidden must not overwrite it
    assert torch.equal(device.context[3], last[0])
    device.forget(3)  # the general path drafted for slot 3
    device.sync(rows[0])
    assert torch.equal(device.context[3], hidden[0]) and torch.equal(device.context[1], last[1])
