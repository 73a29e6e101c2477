"""``benchmarks/greedy_tokens.py --compare``: the verdict that a kernel change kept the tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from greedy_tokens import compare  # noqa: E402


def test_compare_names_each_prompts_first_different_token():
    a = {"8b:fp8": [[1, 2, 3], [4, 5, 6], [7, 8]], "only-a": [[1]]}
    b = {"8b:fp8": [[1, 2, 3], [4, 9, 6], [7, 8, 0]]}
    res = compare(a, b)
    assert list(res) == ["8b:fp8"]  # runs in both only
    assert res["8b:fp8"] == {"identical": False, "first_difference": [None, 1, 2]}
    assert compare(a, a)["8b:fp8"]["identical"]


def test_compare_exits_nonzero_when_tokens_moved(tmp_path):
    same, moved = tmp_path / "a.json", tmp_path / "b.json"
    same.write_text(json.dumps({"r": [[1, 2]]}))
    moved.write_text(json.dumps({"r": [[1, 3]]}))
    script = str(BENCH / "greedy_tokens.py")
    run = [sys.executable, script, "--compare"]
    assert subprocess.run([*run, str(same), str(same)], capture_output=True).returncode == 0
    assert subprocess.run([*run, str(same), str(moved)], capture_output=True).returncode == 1
