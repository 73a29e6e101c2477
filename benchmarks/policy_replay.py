"""Replay the draft-length policy on synthetic batch-1 steps: a probe of its decisions, not a speed.

Each scenario gives the chance that draft position i lands once position i - 1 did (drawn
again per request with some jitter, as sampled texts vary), a speculative and a plain step's
cost, and requests x tokens; the policy chooses every step and is told what it cost and landed,
as the engine tells it. Printed per scenario: the mean and worst speedup over plain across
seeds, and what drafting every step would give. Step costs and acceptance are taken from
device runs (run 112: T 0.6 top-p 0.95, T 0.7, greedy), so a change to the policy can be
judged before the device re-runs it.

    python benchmarks/policy_replay.py --seeds 24                # the policy of this tree
    git show REV:mathagent/serving/engine/spec_decode/policy.py > /tmp/old_policy.py
    python benchmarks/policy_replay.py --policy-file /tmp/old_policy.py   # another one
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType

# name: (per-position conditional acceptance, or one list per block of five requests when two
# are given, or one per request; per-request jitter; speculative ms; plain ms; requests; tokens)
SCENARIOS: dict[str, tuple] = {
    "h200_t06_top_p095": ([0.60, 0.667, 0.65, 0.69], 0.12, 1.392, 0.754, 20, 86),
    "h200_t07": ([0.58, 0.62, 0.64, 0.65], 0.12, 1.191, 0.648, 20, 86),
    "h200_greedy": ([0.83, 0.81, 0.82, 0.82], 0.08, 1.05, 0.60, 20, 200),
    "near_tie": ([0.50, 0.55, 0.55, 0.55], 0.12, 1.30, 0.70, 20, 150),
    "losing": ([0.40, 0.50, 0.50, 0.50], 0.10, 1.90, 0.70, 20, 150),
    "trailing": ([0.50, 0.30, 0.20, 0.10], 0.05, 1.40, 0.70, 20, 150),
    "phases": (([0.8] * 4, [0.25, 0.3, 0.3, 0.3]), 0.05, 1.30, 0.70, 20, 150),
    "drop": (([0.7] * 4,) * 10 + ([0.2, 0.3, 0.3, 0.3],) * 10, 0.05, 1.30, 0.70, 20, 150),
}


def load_policy(path: Path | None) -> ModuleType:
    """The policy module of this tree, or the one in ``path`` (another revision's file)."""
    if path is None:
        from mathagent.serving.engine.spec_decode import policy

        return policy
    spec = importlib.util.spec_from_file_location("replayed_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rates(scenario: tuple, request: int) -> list[float]:
    rates = scenario[0]
    if not isinstance(rates[0], (list, tuple)):
        return list(rates)
    return list(rates[(request // 5) % 2] if len(rates) == 2 else rates[request])


def replay(policy: ModuleType, scenario: tuple, seed: int) -> float:
    """Speedup over plain decoding of one seeded run under ``policy``."""
    _, jitter, spec_ms, plain_ms, requests, tokens = scenario
    rng = random.Random(seed)
    chooser = policy.DraftPolicy(4)
    made, seconds = 0, 0.0
    for request in range(requests):
        rates = [min(0.97, max(0.0, q + rng.gauss(0, jitter))) for q in _rates(scenario, request)]
        left = tokens
        while left > 0:
            k = chooser.choose(1)
            ms = (spec_ms if k else plain_ms) * (1 + 0.03 * rng.random())
            chooser.observed(1, k, ms / 1e3)
            landed = 0
            if k:
                while landed < len(rates) and rng.random() < rates[landed]:
                    landed += 1
                chooser.accepted(1, [landed])
            made, left, seconds = made + 1 + landed, left - 1 - landed, seconds + ms
    return made / seconds * plain_ms


def drafting_every_step(scenario: tuple) -> float:
    """Speedup of drafting every step at the scenario's mean acceptance (no jitter)."""
    speedups = []
    for request in range(scenario[4]):
        tokens, reach = 1.0, 1.0
        for q in _rates(scenario, request):
            reach *= q
            tokens += reach
        speedups.append(tokens * scenario[3] / scenario[2])
    return statistics.mean(speedups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--policy-file", type=Path, help="another revision's policy.py")
    args = parser.parse_args()
    policy = load_policy(args.policy_file)
    out = {"policy": str(args.policy_file or "this tree"), "seeds": args.seeds, "scenarios": {}}
    for name, scenario in SCENARIOS.items():
        runs = [replay(policy, scenario, seed) for seed in range(args.seeds)]
        out["scenarios"][name] = {
            "mean_speedup": round(statistics.mean(runs), 3),
            "worst_speedup": round(min(runs), 3),
            "drafting_every_step": round(drafting_every_step(scenario), 3),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
