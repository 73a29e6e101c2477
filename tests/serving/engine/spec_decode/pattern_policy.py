"""A draft-length policy that follows a fixed pattern (``plain`` plain steps, then ``spec``
speculative ones), and what each speculative step landed by the committed length it started
from: so a step right after plain ones can be compared with drafting every step there."""

from __future__ import annotations


class PatternPolicy:
    """``plain`` plain steps then ``spec`` steps of ``k`` drafts, repeating (``plain=0``: every
    step drafts); logs each step's kind, its place in the run of speculative steps, and what
    it landed. Tells the engine its choices ahead, as ``DraftPolicy`` does."""

    def __init__(self, k: int, plain: int = 0, spec: int = 1) -> None:
        self.k, self.plain, self.spec, self.n = k, plain, spec, 0
        self.log: list[list] = []  # [draft length, index after plain (plain: < 0), landed]

    def _k(self, n: int) -> int:
        return self.k if n % (self.plain + self.spec) >= self.plain else 0

    def choose(self, batch: int) -> int:
        k = self._k(self.n)
        self.log.append([k, self.n % (self.plain + self.spec) - self.plain, None])
        self.n += 1
        return k

    def plain_next(self, batch: int) -> bool:
        return self._k(self.n) == 0

    def keeps(self, batch: int, k: int) -> bool:
        return self._k(self.n) == k

    def observed(self, batch: int, k: int, seconds: float) -> None:
        pass

    def caught_up(self, batch: int, seconds: float) -> None:
        pass

    def accepted(self, asked: int, accepted: list[int]) -> None:
        self.log[-1][2] = accepted[0] if accepted else None

    def describe(self) -> dict:
        return {}


def landed_by_position(engine, prompts: list, params, policy: PatternPolicy) -> tuple[list, list]:
    """Generate each prompt alone under ``policy``; per prompt, {committed length at which a
    speculative step started: (its index after plain, drafts landed)}, and the outputs."""
    engine.speculator.policy = policy
    speculator, starts = engine.speculator, []
    step = speculator.step

    def recorded(seqs, k=None):  # the committed length each speculative step starts from
        starts.append(seqs[0].num_cached)
        return step(seqs, k)

    speculator.step = recorded
    by_position, outputs = [], []
    try:
        for prompt in prompts:
            first, begun = len(policy.log), len(starts)
            (result,) = engine.generate([prompt], params)
            outputs.append(result.token_ids)
            spec = [(i, a) for k, i, a in policy.log[first:] if k]
            by_position.append(dict(zip(starts[begun:], spec, strict=True)))
    finally:
        del speculator.step
    return by_position, outputs


def after_plain_against_every_step(engine, prompts: list, params, k: int) -> list[tuple]:
    """(index after plain, landed there, landed by drafting every step) at every committed
    length where both started a speculative step; outputs checked equal (greedy)."""
    every, every_out = landed_by_position(engine, prompts, params, PatternPolicy(k))
    pattern, pattern_out = landed_by_position(engine, prompts, params, PatternPolicy(k, 5, 3))
    assert pattern_out == every_out
    return [
        (index, landed, e[position][1])
        for e, p in zip(every, pattern, strict=True)
        for position, (index, landed) in p.items()
        if position in e
    ]
