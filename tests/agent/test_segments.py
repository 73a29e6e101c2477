"""The sample's segments tile its generation: text, code and output runs, each call's own."""

from __future__ import annotations

from itertools import pairwise

import pytest

from tests.agent.fakes import Turn
from tests.agent.test_loop import run

TURNS = {
    "openmath": [
        Turn(["Let me compute.\n", "<tool_", "call>print(17 * 23", " + 5)"]),
        Turn(["Check: ", "<tool_call>print(2 ** 3)"]),
        Turn(["So the answer is \\boxed{396}."]),
    ],
    "qwen": [
        Turn(["Compute.\n```python\nprint(17 * 23 + 5)\n"]),
        Turn(["Again.\n```python\nprint(8)\n"]),
        Turn(["\\boxed{396}"]),
    ],
}


def _kinds(result) -> list[tuple[str, int | None]]:
    return [(s.kind, s.call) for s in result.segments]


@pytest.mark.parametrize("template", sorted(TURNS))
async def test_segments_tile_the_generation_and_name_their_calls(template):
    _, result, _, _ = await run(TURNS[template], template=template)
    generation, segments = result.generation, result.segments
    assert segments[0].start == 0 and segments[-1].end == len(generation)
    assert all(a.end == b.start for a, b in pairwise(segments))
    expected = [("text", None), ("code", 0), ("output", 0)]
    expected += [("text", None), ("code", 1), ("output", 1), ("text", None)]
    assert _kinds(result) == expected
    for s in segments:
        piece = generation[s.start : s.end]
        if s.kind == "code":
            assert result.tool_calls[s.call].code in piece
        if s.kind == "output":
            assert result.tool_calls[s.call].stdout.strip() in piece


async def test_a_sample_without_tools_is_one_text_segment():
    _, result, _, _ = await run([Turn(["The answer is \\boxed{3}."])], tools=False)
    assert _kinds(result) == [("text", None)]
    assert result.segments[0].end == len(result.generation)


async def test_harmony_segments_follow_the_calls_too():
    begin = "<|start|>assistant<|channel|>analysis to=python code<|message|>"
    turns = [
        Turn(["<|channel|>analysis<|message|>Compute.<|end|>", begin, "print(3 * 3)"]),
        Turn(["<|channel|>final<|message|>\\boxed{9}"]),
    ]
    _, result, _, _ = await run(turns, template="gpt-oss")
    assert _kinds(result) == [("text", None), ("code", 0), ("output", 0), ("text", None)]
    code = result.segments[1]
    assert result.generation[code.start : code.end].endswith("print(3 * 3)<|call|>")
    assert result.segments[-1].end == len(result.generation)
