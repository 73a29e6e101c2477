"""The device-side speculative step through LLMEngine: token trees whose winning beam is not the
first (its K/V moved into place), chains of uneven length in one batch, and the draft-length
policy falling back to plain decoding. Float32 random model with sharp weights; on the CPU
(eager) and, where one exists, on CUDA (graphs): greedy speculative output equals plain.
"""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import LoadedModel
from mathagent.serving.engine.model import ModelArgs, Transformer
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow

VOCAB = 512
SHAPE = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"])  # fmt: skip
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ORACLE = SpecMethod("draft", "oracle")


class OracleBeams:
    """Beams over a known continuation: beam ``good`` is right for ``hits`` tokens, the others
    wrong from their first token; row ``i`` drafts ``k - i % 2`` tokens (uneven chains)."""

    def __init__(self, refs: dict[tuple, list[int]], beams: int, good: int, hits: int) -> None:
        self.refs, self.beams, self.good, self.hits = refs, beams, good, hits

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        out = []
        for i, row in enumerate(rows):
            seq = row.seq
            done = len(seq.all_ids) - len(seq.prompt_ids)
            depth = max(1, k - i % 2)
            true = (self.refs[tuple(seq.prompt_ids)] + [0] * (done + k))[done : done + depth]
            beams = []
            for w in range(self.beams):
                beam = list(true)
                start = self.hits if w == self.good else 0
                for j in range(start, depth):
                    beam[j] = (beam[j] + 1 + w) % VOCAB
                beams.append([seq.last_token, *beam])
            out.append(Draft(torch.tensor(beams)))
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass


def make_engine(device: str) -> LLMEngine:
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_hf_config(SHAPE)).to(device).eval()
    for p in model.parameters():
        p.data.normal_(0.0, 0.15)
    config = EngineConfig(model=None, device=torch.device(device), dtype=torch.float32,
                          max_batch_size=4, max_seq_len=128, speculative="none", draft_len=3,
                          draft_beams=3, eager=device == "cpu", threads=None,
                          adaptive_draft=False)  # fmt: skip
    return LLMEngine(config, None, LoadedModel(model, None, "random:test", None, ()))


@pytest.fixture(scope="module", params=DEVICES)
def setup(request):
    engine = make_engine(request.param)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, VOCAB, (3, 12), generator=gen).tolist()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = [r.token_ids for r in engine.generate(prompts, params)]
    return engine, prompts, plain


@pytest.mark.parametrize(("beams", "good", "hits"), [(1, 0, 2), (3, 2, 3), (3, 1, 1), (2, 0, 0)])
def test_tree_and_chain_steps_equal_plain_greedy(setup, beams, good, hits) -> None:
    engine, prompts, plain = setup
    refs = {tuple(p): o for p, o in zip(prompts, plain, strict=True)}
    engine.speculator.proposers.register(ORACLE, OracleBeams(refs, beams, good, hits))
    engine.speculator.stats.__init__()
    params = SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, speculative="draft:oracle"
    )
    out = [r.token_ids for r in engine.generate(prompts, params)]
    assert out == plain
    stats = engine.speculator.stats.as_dict()
    assert stats["accepted_tokens"] > 0 or hits == 0
    if hits:  # the good beam was accepted (so its K/V was moved when it is not the first)
        assert stats["acceptance_length"] > 1.5


def test_policy_falls_back_to_plain_when_drafts_never_land(setup) -> None:
    engine, prompts, plain = setup
    refs = {tuple(p): o for p, o in zip(prompts, plain, strict=True)}
    engine.speculator.proposers.register(ORACLE, OracleBeams(refs, 1, 0, 0))
    policy = DraftPolicy(3, adaptive=True)
    for _ in range(9):  # what a loaded machine measured before: plain steps are the cheaper
        policy.observed(1, 0, 0.001)
        policy.observed(1, 3, 0.002)
    engine.speculator.policy = policy
    engine.speculator.stats.__init__()
    params = SamplingParams(
        max_tokens=96, temperature=0.0, ignore_eos=True, speculative="draft:oracle"
    )
    (res,) = engine.generate(prompts[:1], params)
    assert res.token_ids[:24] == plain[0]
    # nothing is accepted (1 token per step either way): most steps are plain decode, with a
    # few probes of speculation (96 steps would speculate with the policy off)
    assert engine.speculator.stats.forwards < 40


def test_policy_picks_the_faster_step_from_measurements() -> None:
    policy = DraftPolicy(4, lengths=(3,))
    for _ in range(5):  # speculative steps cost 2x a plain one and accept 3 of 4 drafts
        policy.observed(1, 4, 2.0)
        policy.accepted(1, [3])
    for _ in range(5):
        policy.observed(1, 0, 1.0)
    assert policy.expected_tokens(4) == pytest.approx(4.0)
    assert policy.choose(1) == 3  # the 4th draft never lands: 3 drafts at a lower cost win
    assert DraftPolicy(4).lengths == [0, 4]
    for _ in range(200):  # now nothing is accepted: plain wins, with rare probes
        policy.accepted(1, [0])
    choices = [policy.choose(1) for _ in range(200)]
    assert choices.count(0) > 180
