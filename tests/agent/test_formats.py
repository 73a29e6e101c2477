"""Code-tag formats and prompts as data: exact strings, block detection, chunk splitting."""

from __future__ import annotations

import pytest

from mathagent.agent.formats import FORMATS, GPT_OSS, OPENMATH, QWEN, ChunkSplitter, cut
from mathagent.agent.prompts import TEMPLATES, select_template


def test_tags_match_nemo_skills_and_harmony():
    assert (OPENMATH.code_begin, OPENMATH.code_end) == ("<tool_call>", "</tool_call>")
    assert (OPENMATH.output_begin, OPENMATH.output_end) == ("\n```output\n", "```\n")
    assert (QWEN.code_begin, QWEN.code_end) == ("```python\n", "```\n")
    assert (QWEN.output_begin, QWEN.output_end) == ("```output\n", "```\n")
    assert GPT_OSS.code_end == "<|call|>"
    assert set(FORMATS) == {"openmath", "qwen", "gpt-oss"}


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
    assert OPENMATH.is_block_open(text) is is_open
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


def test_template_selection():
    assert select_template("auto", "SmolLM2-135M-Instruct", True).name == "fewshot"
    assert select_template("auto", "SmolLM2-135M-Instruct", False).name == "fewshot-math"
    assert select_template("auto", "nvidia/OpenMath-Nemotron-1.5B", True).name == "openmath"
    assert select_template("auto", "Qwen2.5-Math-7B-Instruct", True).name == "qwen"
    assert select_template("auto", "openai/gpt-oss-20b", True).name == "gpt-oss"
    assert select_template("openmath", "x", False).name == "math"
    with pytest.raises(ValueError, match="unknown prompt format"):
        select_template("nope", "x", True)


def test_openmath_prompt_states_the_budget():
    (user,) = TEMPLATES["openmath"].messages("2+2?", 6)
    assert user["content"] == (
        "Solve the following math problem, integrating natural language reasoning with Python "
        "code executions. You may perform up to 6 Python code calls to assist your reasoning. "
        "Make sure to put the answer (and only answer) inside \\boxed{}.\n2+2?"
    )


def test_fewshot_examples_use_the_format_bytes():
    messages = TEMPLATES["fewshot"].messages("What is 17 * 23 + 5?", 8)
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
