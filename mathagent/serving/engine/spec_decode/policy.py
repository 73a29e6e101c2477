"""The draft length of each speculative step, from what speculation measurably buys.

In the spirit of TensorRT-LLM's AUTO speculation and vLLM's dynamic speculative decoding: a
step of ``k`` drafts costs ``t(b, k)`` seconds at batch bucket ``b`` and commits ``E(k)``
tokens per row, so the step worth running maximises ``E(k) / t(b, k)``; ``k = 0`` is a plain
decode step. The candidates are plain and the configured draft length (``lengths`` may add
others): on the CUDA path each new verify width is a graph capture of a second or more, which
an exploring policy would pay inside serving. Both sides are measured while serving: step
times per (bucket, k) as the lower quartile of the latest steps (never a step that captured a
graph; the first timed step of a shape is dropped), acceptance as decayed counts of how often draft
position ``i`` was accepted per row that asked for drafts (no proposal counts as a miss).

Probing is paid for. While plain wins, a probe (two speculative steps) comes after a gap of
plain steps sized so that probes cost at most ``_BUDGET`` of the plain time at the measured
cost ratio ``r = t(b, k) / t(b, 0)`` (a probe loses at most ``r - 1`` plain steps, and its first
step what a drafter catching up costs), doubling each time plain still wins. A bucket where even
a perfect drafter (``E = 1 + k``) cannot win by the margin is closed: it is only re-measured,
on the far smaller ``_CLOSED_BUDGET``; an
unmeasured bucket above a closed one starts closed (a verify step's cost grows with rows x
width while plain batched decode stays cheap per row), and one above a bucket where speculation
loses at the acceptance measured now starts plain with probes, so neither is measured by
speculating (run 31, 8B float32, batch 32: measuring each new bucket by speculating cost ~5%
of the run). Nor is a bucket measured by speculating once drafts all but never land: at
``E(k) < 1 + _FUTILE`` plain wins whatever the costs (run 31, batch 8: 2.5% of the run), seen
on ``_FUTILE_ROWS`` drafted rows (on two, a fresh CPU engine's one chat request went plain for
good after its first two drafts missed, where drafting every step ran 1.4x plain).
A cold bucket above one (a batch ramping up from nothing) is timed plain first, and speculation
there is judged on its first two timed steps: kept and timed fully if it wins, else plain with
probes.
A bucket below one where speculation wins (a batch draining) speculates without timing plain:
the argument above, the other way round.

Speculation wins only by a margin: its estimated rate must beat plain's by ``_MARGIN`` to be
chosen (once chosen it stays until it trails by more than one standard error of its estimate,
``_noise``: a bar at the break-even itself left on the estimate's dips, run 112). Near a tie
the gain is small and both estimates are noisy (CPU int4, batch 32: a probe measured 2.48
tokens a step where the run averaged 1.72; 0.86-0.95x plain before the margin). A lead short of
the margin seen on fewer than ``_SURE_ROWS`` drafted rows is measured on by speculating, at no
cost by the estimate (run 83, top-p: five steps estimated 1.13x, and plain was chosen at 0.987x
where every step drafting ran 1.265x), and so is a trail within two standard errors. A probe
counts the history before it as one row: plain was chosen when that estimate was low, and
halved it outweighed the probe's own rows (run 112, sampled: the policy 0.99x and 1.03x where
drafting every step ran 1.33x and 1.28x).

While speculation wins, plain is timed again now and then (``_RETIME`` plain steps, the first
not timed), so a plain measurement taken in a slow spell does not hold speculation on for good
(CPU int4, batch 8: plain timed at 55 ms against a steady 31-33 kept speculation at 0.773x);
the gap between re-timings keeps their cost, the lead given up and the drafter's catch-up, to
``_BUDGET`` of the time. One module over the usual size, because :meth:`DraftPolicy.keeps` must
predict from the same state every choice reads (a step launched ahead is thrown away when the
choice after it differs).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

_WARMUP, _READY, _WINDOW = 1, 3, 9  # steps per shape: dropped, timed before use, in the estimate
# timed speculative steps a first verdict at a cold bucket rests on (the faster: on the CPU host
# with the agent's sandbox, the first timed verify at 4 rows ran 170 ms against a steady 70)
_JUDGE = 2
_DECAY = 0.97  # per speculative step, for the acceptance counts
_PROBE = 2  # speculative steps a probe takes (the first catches up or refreshes a hidden state)
_BUDGET, _CLOSED_BUDGET = 0.005, 0.0025  # of plain time (run 81, T 0.7: 0.996x; 1%: 0.99x)
_MIN_GAP, _MAX_GAP = 8, 1 << 15  # plain steps between probes
_FUTILE, _FUTILE_ROWS = 0.1, 6.0  # drafts per row under which speculation cannot pay; rows seen
_UNTIMED_RATIO = 2.0  # cost ratio assumed for probe gaps before any bucket is timed
_MARGIN = 0.15  # how much faster than plain speculation's estimated rate must be to be chosen
_STAY_MARGIN = 0.0  # ... to stay chosen (run 90, top-p at 1.26x: a 15% bar to stay, 1.150x)
_SURE_ROWS = 16  # drafted rows (decayed) under which a close verdict is measured on
_RETIME, _RETIME_CATCH_UP = 4, 4.0  # plain steps re-timing plain takes; its drafter's catch-up


def low_quartile(times: Iterable[float]) -> float:
    """A step's cost from its latest timings: the lower quartile (the fastest of up to four).
    The host's other work only ever slows a step, and unevenly over a run: on the 2-core CPU
    host the agent's sandbox ran tool calls beside the engine and three of the first four
    verify steps at 4 rows took 72 / 448 / 231 ms (steady: 70), while plain had been timed in a
    quiet spell at 39 ms; their median closed the bucket for the rest of the eval (46.8 tok/s
    where speculating ran 83). A low quantile, not the minimum: a step with fewer drafts costs
    less than a full one."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 4]


def bucket(batch: int) -> int:
    """Batch sizes that cost about the same per step share one entry (powers of two)."""
    return 1 << max(0, batch - 1).bit_length()


@dataclass
class _Shape:
    seen: int = 0
    times: deque = field(default_factory=lambda: deque(maxlen=_WINDOW))
    seconds: float = 0.0  # low_quartile(times) (kept: every step asks for it)
    ready: bool = False  # enough steps timed

    def to_ready(self) -> int:
        """Steps still to time before the estimate is ready."""
        return max(0, _WARMUP - self.seen) + max(0, _READY - len(self.times))

    def add(self, seconds: float) -> None:
        self.seen += 1
        if self.seen > _WARMUP:
            self.times.append(seconds)
            self.ready = len(self.times) >= _READY
            self.seconds = low_quartile(self.times)


@dataclass
class _Probes:
    """When one bucket probes speculation while plain decoding wins there."""

    since: int = 0  # plain steps since the last probe
    losses: int = 0  # probes in a row after which plain still won (each doubles the gap)
    left: int = 0  # speculative steps left in the probe under way
    winning: bool = False  # speculation won the last choice here (it stays while not losing)
    spec_since: int = 0  # speculative steps since plain was last timed here
    retime_gap: int = 0  # ... before it is timed again (set as a run of winning steps starts)
    last: str = ""  # why the step now running was chosen
    retiming: int = 0  # plain steps left in a re-timing of plain under way


def closed(ceiling: float) -> bool:
    """Whether even a perfect drafter, at a bucket's measured costs, cannot win by the margin."""
    return ceiling <= 1.0 + _MARGIN


def probe_gap(ratio: float, closed: bool, losses: int, catch_up: float = 0.0) -> int:
    """Plain steps between probes: probes of ``_PROBE`` steps, each losing at most ``ratio - 1``
    plain steps, plus ``catch_up`` plain steps their first step costs beyond a steady one (the
    drafter catching up on the plain steps' positions), cost at most the budget's share of
    plain time; doubled per losing probe."""
    budget = _CLOSED_BUDGET if closed else _BUDGET
    cost = _PROBE * max(ratio - 1.0, 0.0) + max(catch_up, 0.0)
    base = max(_MIN_GAP, math.ceil(cost / budget))
    return min(base << min(losses, 20), _MAX_GAP)


class DraftPolicy:
    """Chooses the draft length of the next step; told what each step cost and accepted."""

    def __init__(self, max_len: int, adaptive: bool = True, lengths: tuple[int, ...] = ()) -> None:
        self.max_len = max_len
        self.adaptive = adaptive
        self.lengths = sorted({0, max_len, *lengths})  # the draft lengths it chooses among
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._rows = 0.0  # decayed count of rows that asked for drafts
        # decayed count of rows with position i accepted; past max_len when a drafter's second
        # branch (EAGLE-3's longer lookup) lands more than the chain's drafts
        self._accepted = [0.0] * max_len
        self._probes: dict[int, _Probes] = {}
        self._catch_up: dict[int, float] = {}  # bucket -> seconds of a first step after plain
        # choices made per (bucket, draft length), 0 plain: what /metrics shows of the policy
        # (a bucket gone plain reads as an acceptance length near 1 in every other figure)
        self.choices: Counter[tuple[int, int]] = Counter()

    def expected_tokens(self, k: int, missed: int = 0) -> float:
        """Tokens a row commits per step with ``k`` drafts (1 + accepted drafts; at the full
        length every accepted position counts, those past it too: a ragged tree's longer
        branch lands them); ``missed``: as if one more step of so many rows landed nothing."""
        rows = self._rows_after(missed)
        if rows == 0:
            return 1.0 + k  # nothing measured yet: optimistic, so speculation gets tried
        counted = self._accepted if k >= self.max_len else self._accepted[:k]
        return 1.0 + sum(counted) * (_DECAY if missed else 1.0) / rows

    def _rows_after(self, missed: int = 0) -> float:
        """Drafted rows (decayed), after one more step of ``missed`` rows if any."""
        return self._rows * _DECAY + missed if missed else self._rows

    def choose(self, batch: int) -> int:
        """The draft length of the next step of ``batch`` rows (0 = plain decode)."""
        b = bucket(batch)
        k, event = self._plan(b)
        probes = self._probes.setdefault(b, _Probes())
        if event == "probing":
            probes.left -= 1
        elif event == "retime":
            probes.retiming, probes.spec_since, probes.retime_gap = _RETIME - 1, 0, 0
        elif event == "retiming":
            probes.retiming -= 1
        elif event == "probe":  # the gap is over: measure again, from fresh acceptance
            probes.since, probes.left = 0, _PROBE - 1
            probes.losses += 1  # until it wins: then the next choice resets it
            # the history counts as one row: plain was chosen when the estimate was low, so it
            # is biased low (halved, it outweighed the probe's rows: run 112, T 0.7, 1.03x
            # where drafting every step ran 1.28x)
            scale = 1.0 / max(self._rows, 1.0)
            self._rows *= scale
            self._accepted = [a * scale for a in self._accepted]
        elif event == "plain":  # plain is timed here again: a later run of wins counts anew
            probes.since, probes.spec_since, probes.retime_gap = probes.since + 1, 0, 0
        elif event == "wins":
            probes.since = probes.losses = 0
            probes.spec_since += 1
            # fixed for the run, so a step launched ahead knows when plain comes (keeps)
            probes.retime_gap = probes.retime_gap or self._retime_gap(b)
        probes.winning = event in ("wins", "retime", "retiming")
        probes.last = event
        self.choices[(b, k)] += 1
        return k

    def plain_next(self, batch: int) -> bool:
        """Whether the next step of ``batch`` rows will be plain as a settled choice (so a plain
        step may launch its successor ahead); changes nothing."""
        return self.keeps(batch, 0)

    def keeps(self, batch: int, k: int) -> bool:
        """Whether the step after the one now running takes ``k`` drafts whatever this one
        measures, so it may be launched ahead (a changed choice throws it away, run 41; one not
        launched ahead is timed with the host's work, run 79). Changes nothing."""
        b = bucket(batch)
        chosen, event = self._plan(b)
        probes = self._probes.get(b) or _Probes()
        if probes.last in ("retime", "retiming") and not probes.retiming:
            return False  # the verdict follows the re-timing's last step
        if event == "measure":
            return chosen == k and self._shape(b, k).to_ready() >= 2
        if event == "undecided":  # still so if this step lands nothing
            return chosen == k and self._undecided(b, missed=batch)
        certain = ("plain", "wins", "fixed", "probing", "retiming", "inherits")
        return chosen == k and event in certain

    def _plan(self, b: int) -> tuple[int, str]:
        """The next step's draft length at bucket ``b`` and why; changes nothing."""
        if not self.adaptive:
            return self.max_len, "fixed"
        probes = self._probes.get(b) or _Probes()
        if probes.left:
            return self.max_len, "probing"
        if probes.retiming:
            return 0, "retiming"
        ceiling = self.ceiling(b)
        if ceiling is None and self._inherits(b):
            return self.max_len, "inherits"
        if ceiling is None:
            k, ceiling = self._unmeasured(b)
            if k is not None:
                return k, "measure"
            best = 0
        else:
            # chosen, speculation stays until it trails by more than its estimate's noise
            margin = (1 + _STAY_MARGIN) / (1 + self._noise()) - 1 if probes.winning else _MARGIN
            best = 0 if closed(ceiling) else self._best(b, margin)
            if not best and not closed(ceiling) and self._undecided(b):
                return self.max_len, "undecided"
        if best:  # plain is timed again now and then: a slow spell may have timed it (CPU run 7)
            if probes.retime_gap and probes.spec_since + 1 >= probes.retime_gap:
                return 0, "retime"
            return best, "wins"
        ratio = self._ratio(b)
        gap = probe_gap(ratio, closed(ceiling), probes.losses, self._catch_up_steps(b))
        if probes.since + 1 >= gap:
            return self.max_len, "probe"
        return 0, "plain"

    def _inherits(self, b: int) -> bool:
        """A bucket not yet timed both ways below one where speculation wins by the margin: it
        wins here too (a verify step's cost relative to a plain one falls with the rows), so
        it speculates without timing plain (H200, default model, 32 rows draining: every
        smaller bucket timed plain first, and the drafter catching up after, ran 0.881x where
        every step drafting ran 1.862x; run 94)."""
        if self._futile():
            return False
        above = next((c for c in sorted(c for c, _ in self._shapes) if c > b
                      and self._measured(c, judged=True)), None)  # fmt: skip
        return above is not None and bool(self._best(above))

    def _unmeasured(self, b: int) -> tuple[int | None, float]:
        """At a bucket not yet timed both ways: the draft length that measures it, or None and
        the ceiling to probe under while it starts plain."""
        spec, plain = self._shape(b, self.max_len), self._shape(b, 0)
        below = self._measured_below(b, judged=True)
        if self._futile() or (below is not None and not self._best(below)):
            # speculation loses below at the acceptance measured now: it loses here too (the
            # cost ratio grows with the batch), so start plain, probing on the open budget
            return None, 2.0
        if b == 1 or below is not None:  # speculation is expected to win: speculative first
            return (0 if spec.ready else self.max_len), 0.0
        # a cold bucket above one (a batch ramping up): plain first, then speculation is
        # judged on its first two timed steps (run 35, batch 32: timing a new bucket by
        # speculating first, five steps at 3.8x a plain one, cost ~5% of the run)
        if not plain.ready or len(spec.times) < _JUDGE:
            return (self.max_len if plain.ready else 0), 0.0
        if self._best(b):
            return self.max_len, 0.0  # wins on its first steps: time it fully
        return None, (1 + self.max_len) * plain.seconds / spec.seconds

    def ceiling(self, b: int) -> float | None:
        """The most a perfect drafter (every draft accepted) could speed bucket ``b`` up at the
        measured step costs; None while unknown. An unmeasured bucket above a closed one
        takes that one's ceiling."""
        if self._shape(b, self.max_len).ready and self._shape(b, 0).ready:
            return max((1 + k) / self._ratio(b, k) for k in self.lengths if k)
        below = self._measured_below(b)
        if below is not None and (c := self.ceiling(below)) is not None and closed(c):
            return c
        return None

    def _futile(self, rows: float | None = None, tokens: float | None = None) -> bool:
        """Drafted rows were seen and their drafts all but never land (any cost loses); the
        estimate's rows and tokens a step, or the policy's own."""
        rows = self._rows if rows is None else rows
        tokens = self.expected_tokens(self.max_len) if tokens is None else tokens
        return rows >= _FUTILE_ROWS and tokens < 1 + _FUTILE

    def _best(self, b: int, margin: float = _MARGIN) -> int:
        """The draft length of the best estimated rate at ``b``, plain's counted ``margin`` up."""
        return max(self.lengths, key=lambda k: self._rate(b, k) * (1.0 if k else 1.0 + margin))

    def _retime_gap(self, b: int) -> int:
        """Speculative steps between re-timings of plain at ``b``: each costs ``_RETIME`` plain
        steps' lead and the drafter's catch-up, at most the budget's share of the time."""
        lead = self._rate(b, self.max_len) / self._rate(b, 0) - 1.0
        catch_up = self._catch_up_steps(b) if b in self._catch_up else _RETIME_CATCH_UP
        cost = _RETIME * max(lead, 0.0) + catch_up
        return max(_MIN_GAP, math.ceil(cost / (_BUDGET * self._ratio(b))))

    def _undecided(self, b: int, missed: int = 0) -> bool:
        """Too few drafted rows to tell (fewer than ``_SURE_ROWS`` since the last probe began):
        speculation leads plain by less than the margin, or trails it by less than two of its
        estimate's standard errors (run 89, top-p, seven steps measured 1.71 tokens a step,
        plain was chosen, drafting steps averaged 2.49). ``missed``: as if one more step of
        so many rows landed nothing (the verdict whatever the step now running lands)."""
        rows, tokens = self._rows_after(missed), self.expected_tokens(self.max_len, missed)
        if rows >= _SURE_ROWS or self._futile(rows, tokens):
            return False
        spec = tokens / self._cost(b, self.max_len)
        return spec * (1 + 2 * self._noise(rows)) >= self._rate(b, 0)

    def _noise(self, rows: float | None = None) -> float:
        """The acceptance estimate's relative standard error: a row's accepted count varies
        about half as much as the tokens a step commit (sampled runs, positions accepted
        ~0.6 each), so ``0.5 / sqrt(rows)``."""
        return 0.5 / math.sqrt(max(self._rows if rows is None else rows, 1.0))

    def _measured_below(self, b: int, judged: bool = False) -> int | None:
        """The nearest measured bucket below ``b``, if any; ``judged``: or one whose plain
        steps are timed and speculation has had its first ``_JUDGE`` timed steps."""
        return next(
            (c for c in (b >> i for i in range(1, b.bit_length())) if self._measured(c, judged)),
            None,
        )

    def _measured(self, b: int, judged: bool = False) -> bool:
        spec, plain = self._shape(b, self.max_len), self._shape(b, 0)
        return plain.ready and (spec.ready or (judged and len(spec.times) >= _JUDGE))

    def _ratio(self, b: int, k: int | None = None) -> float:
        """Cost of a ``k``-draft step (default the full length) over a plain one at ``b``, or
        where ``b`` is unmeasured the ratio of the nearest measured bucket below."""
        k = self.max_len if k is None else k
        while not self._measured(b, judged=True) and b > 1:
            b >>= 1
        if not self._measured(b, judged=True):
            return _UNTIMED_RATIO
        return self._cost(b, k) / self._shape(b, 0).seconds

    def _rate(self, b: int, k: int) -> float:
        """Estimated tokens per second per row of a step with ``k`` drafts."""
        return self.expected_tokens(k) / self._cost(b, k)

    def _cost(self, b: int, k: int) -> float:
        """Measured seconds of a step, or for an untried ``k`` the line between plain and the
        full draft length (it gets measured once it is chosen)."""
        shape = self._shape(b, k)
        if shape.ready:
            return shape.seconds
        plain, full = self._shape(b, 0).seconds, self._shape(b, self.max_len).seconds
        return plain + (full - plain) * k / self.max_len

    def _shape(self, b: int, k: int) -> _Shape:
        shape = self._shapes.get((b, k))
        if shape is None:  # (not setdefault: every step asks, and a new _Shape is a deque)
            shape = self._shapes[(b, k)] = _Shape()
        return shape

    def observed(self, batch: int, k: int, seconds: float) -> None:
        """Count the wall time of one step of ``batch`` rows with ``k`` drafts."""
        self._shape(bucket(batch), k).add(seconds)

    def caught_up(self, batch: int, seconds: float) -> None:
        """Count a speculative step after plain steps of the same rows: what each probe pays
        once (its drafter catches up on their positions: ~3-7 ms against ~1.5, run 67)."""
        b = bucket(batch)
        last = self._catch_up.get(b)
        self._catch_up[b] = seconds if last is None else 0.5 * (last + seconds)

    def _catch_up_steps(self, b: int) -> float:
        """Plain steps a probe's first step costs beyond a steady speculative step at ``b``."""
        seconds, plain = self._catch_up.get(b), self._shape(b, 0)
        if seconds is None or not plain.ready:
            return 0.0
        spec = self._shape(b, self.max_len)
        steady = spec.seconds if spec.ready else plain.seconds
        return max(seconds - steady, 0.0) / plain.seconds

    def accepted(self, asked: int, accepted: list[int]) -> None:
        """Count one speculative step: ``asked`` rows wanted drafts, each ``accepted`` so many."""
        self._rows = _DECAY * self._rows + asked
        self._accepted += [0.0] * (max(accepted, default=0) - len(self._accepted))
        for i in range(len(self._accepted)):
            hits = sum(1 for a in accepted if a > i)
            self._accepted[i] = _DECAY * self._accepted[i] + hits

    def step_seconds(self) -> dict[tuple[int, int], float]:
        """The step costs it judges on now, per (bucket, draft length): ready estimates only
        (read by the server's scrape in another thread: the dict is copied first, in one op)."""
        return {key: shape.seconds for key, shape in dict(self._shapes).items() if shape.ready}

    def describe(self) -> dict:
        """What it measured, per bucket (for benchmarks): step ms, cost ratio, ceiling, gap."""
        out = {}
        for b in sorted({b for b, _ in self._shapes}):
            ms = {k: round(1e3 * s.seconds, 3) for (c, k), s in self._shapes.items()
                  if c == b and s.ready}  # fmt: skip
            ceiling, probes = self.ceiling(b), self._probes.get(b) or _Probes()
            out[b] = {"step_ms": ms, "ceiling": None if ceiling is None else round(ceiling, 3),
                      "losing_probes": probes.losses}  # fmt: skip
        return out
