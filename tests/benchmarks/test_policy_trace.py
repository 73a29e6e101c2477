"""``gpu_default_model.py --policy-trace``: the auto policy's calls recorded in order, with
what they were told and answered, while the policy decides exactly as it would untraced."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_default_model import trace_policy

from mathagent.serving.engine.spec_decode.policy import DraftPolicy


def _drive(policy: DraftPolicy, steps: int = 40) -> list[int]:
    chosen = []
    for i in range(steps):
        k = policy.choose(1)
        chosen.append(k)
        if k:
            policy.accepted(1, [i % 3])
        policy.observed(1, k, 0.002 + 0.001 * k)
    return chosen


def test_the_trace_lists_each_call_and_changes_no_choice() -> None:
    traced = DraftPolicy(4)
    events = trace_policy(traced, lambda: 7)
    chosen = _drive(traced)
    assert chosen == _drive(DraftPolicy(4))
    names = [e[0] for e in events]
    assert names.count("choose") == 40 and names.count("observed") == 40
    assert names.count("accepted") == sum(1 for k in chosen if k)
    assert [e[2] for e in events if e[0] == "choose"] == chosen  # its answers, in order
    assert events[0][1] == 1 and events[0][-1] == 7  # the batch; the claimed count
    observed = next(e for e in events if e[0] == "observed")
    assert observed[3] == round(1e3 * (0.002 + 0.001 * observed[2]), 4)  # seconds kept in ms
