"""Code-tag formats and prompts as data: exact strings, block detection, chunk splitting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mathagent.agent.families import BY_NAME, family_for
from mathagent.agent.feedback import cut
from mathagent.agent.formats import OPENMATH, QWEN, ChunkSplitter
from mathagent.agent.request import Finish

FIXTURES = Path(__file__).parent / "fixtures"


def test_tags_match_nemo_skills():
    tags = json.loads((FIXTURES / "nemo_skills/prompt_configs.json").read_text())["code_tags"]
    for fmt in (OPENMATH, QWEN):
        ref = tags[fmt.name]
        assert (fmt.code_begin, fmt.code_end) == (ref["code_begin"], ref["code_end"])
        assert (fmt.output_begin, fmt.output_end) == (
            ref["code_output_begin"],
            ref["code_output_end"],
        )
        assert fmt.stop == (ref["code_end"],)


@pytest.mark.parametrize(
    ("finish", "restored", "code"),
    [
        (Finish("stop", "</tool_call>"), "</tool_call>", "print(1)"),  # vLLM: the string
        (Finish("stop"), "</tool_call>", "print(1)"),  # not reported: a block is open
        (Finish("stop", None), "", None),  # the model's EOS inside the block
        (Finish("length"), "", None),
    ],
)
def test_a_dropped_end_tag_is_restored_only_for_the_stop(finish, restored, code):
    end = OPENMATH.end_turn("x <tool_call>print(1)", finish)
    assert (end.restored, end.code) == (restored, code)
    assert (end.error is None) == (code is not None)


def test_remaining_executions_notice_follows_the_output():
    text = OPENMATH.output_block("4\n", remaining=2)
    assert text.startswith("\n```output\n4\n```\n```system\nRemaining code executions: 2. ")
    last = OPENMATH.output_block("4\n", remaining=0)
    assert "You have run out of code executions!" in last
    assert OPENMATH.output_block("4\n") == "\n```output\n4\n```\n"


@pytest.mark.parametrize(
    ("text", "is_open", "ends"),
    [
        ("<tool_call>x", True, False),
        ("<tool_call>x</tool_call>", False, True),
        ("a<tool_call>x</tool_call>\n```output\n1\n```\n", False, False),
        ("<tool_call>x</tool_call>b<tool_call>y</tool_call>", False, True),
        ("no code", False, False),
    ],
)
def test_block_detection(text, is_open, ends):
    assert OPENMATH.is_open(text) is is_open
    assert OPENMATH.ends_with_block(text) is ends


def test_last_code_is_the_last_block():
    assert OPENMATH.last_code("<tool_call>a</tool_call> <tool_call>b</tool_call>") == "b"
    assert QWEN.last_code("```python\nprint(1)\n```\n") == "print(1)\n"


def test_cut_marks_and_is_idempotent():
    assert cut("abcdef", 3) == "abc<output cut>"
    assert cut("abc<output cut>", 3) == "abc<output cut>"
    assert cut("abc", 3) == "abc"


def test_chunk_splitter_separates_prose_and_code_across_chunk_borders():
    s = ChunkSplitter(OPENMATH)
    pieces = []
    for chunk in ["Compute: <to", "ol_", "call>print(1", ")"]:
        pieces += s.feed(chunk)
    pieces += s.flush()
    assert pieces == [("Compute: ", False), ("<tool_call>print(1", True), (")", True)]
    s = ChunkSplitter(OPENMATH)
    assert s.feed("a <") == [("a ", False)]
    assert s.feed("b") == [("<b", False)]
    assert ChunkSplitter(None).feed("<tool_call>") == [("<tool_call>", False)]


def test_every_openmath_variant_maps_as_nemo_skills_maps_it():
    fixture = json.loads((FIXTURES / "nemo_skills/openmath_variants.json").read_text())
    for model, ref in fixture["variants"].items():
        family = family_for("auto", model)
        assert family.notices is ref["add_remaining_code_executions"], model
        assert family.prompt.name == ref["code_prompt_config"], model
        assert family.syntax.name == ref["code_tags"], model
        assert family.max_tool_calls == ref["max_code_executions"], model
    assert family_for("auto", "OpenMath-Nemotron-14B-kaggle-fp8-redrafter-trtllm").name == (
        "openmath-kaggle"
    )


def test_template_selection():
    assert family_for("auto", "SmolLM2-135M-Instruct").name == "fewshot"
    assert family_for("auto", "Qwen/Qwen2.5-Math-7B-Instruct").name == "qwen"
    assert family_for("auto", "Qwen/Qwen3-8B").name == "qwen3"
    assert family_for("auto", "openai/gpt-oss-20b").name == "gpt-oss"
    assert family_for("auto", "nvidia/OpenMath2-Llama3.1-8B").name == "fewshot"  # not TIR
    assert family_for("qwen", "nvidia/OpenMath-Nemotron-7B").name == "qwen"
    with pytest.raises(ValueError, match="unknown prompt format"):
        family_for("nope", "x")


def test_openmath_prompt_states_the_budget():
    system, user = BY_NAME["openmath"].prompt.messages("2+2?", 6)
    assert system == {"role": "system", "content": ""}
    assert user["content"] == (
        "Solve the following math problem, integrating natural language reasoning with Python "
        "code executions.\nYou may perform up to 6 Python code calls to assist your reasoning.\n"
        "Make sure to put the answer (and only answer) inside \\boxed{}.\n\n2+2?"
    )


def test_fewshot_examples_use_the_format_bytes():
    messages = BY_NAME["fewshot"].prompt.messages("What is 17 * 23 + 5?", 8)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[2]["content"] == (
        "<tool_call>print(12 * 9 - 4)</tool_call>\n```output\n104\n```\nThe final answer is \\boxed{104}."
    )
    assert messages[-1]["content"] == "What is 17 * 23 + 5?"
