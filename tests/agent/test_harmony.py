"""Harmony (gpt-oss): the text renderer reproduces harmony's own renderings byte for byte, and
agrees with the ``openai-harmony`` package itself when its vocabulary is present.

Golden bytes: tests/agent/fixtures/harmony/gpt_oss_harmony.json (openai-harmony 0.0.8 =
openai/harmony ec7606df, run with the real vocabulary). The package test fetches that vocabulary
the way the fixtures did: from the PyPI wheel ``litellm==1.110.2`` into harmony's cache.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from mathagent.agent.harmony import HarmonyFormat
from mathagent.agent.harmony_render import (
    O200K_URL,
    HarmonyMessage,
    PackageRenderer,
    TextRenderer,
    vocabulary_present,
)
from mathagent.agent.request import Finish

FIXTURE = json.loads((Path(__file__).parent / "fixtures/harmony/gpt_oss_harmony.json").read_text())
USER = FIXTURE["inputs"]["user"]
DATE = "2025-11-14"
ANALYSIS = "<|channel|>analysis<|message|>Compute it with python.<|end|>"
CODE = "print(12 * 9 - 4)\n"
VOCAB_SHA256 = FIXTURE["vocabulary"]["sha256"]
VOCAB_MEMBER = (
    "litellm/litellm_core_utils/tokenizers/" + hashlib.sha1(O200K_URL.encode()).hexdigest()
)


def fmt(renderer=None) -> HarmonyFormat:
    return HarmonyFormat(renderer or TextRenderer())


def test_first_prompt_is_harmonys():
    text = TextRenderer()
    assert text.prompt(USER, "high", DATE, tools=True) == FIXTURE["first_prompt"]["builtin_python"]
    assert text.prompt(USER, "high", DATE, tools=False) == FIXTURE["first_prompt"]["no_tools"]
    assert "Reasoning: low\n" in text.prompt(USER, "low", DATE, tools=True)


def test_messages_render_as_harmony_renders_them():
    text, ref = TextRenderer(), FIXTURE["rendered_messages"]
    call = HarmonyMessage("assistant", CODE, None, "python", "analysis", "code")
    analysis = HarmonyMessage("assistant", "Compute it with python.", channel="analysis")
    response = HarmonyMessage("tool", "104\n", "python", "assistant", "analysis")
    assert text.message(call) == ref["call"]
    assert text.message(analysis) == ref["analysis"]
    assert text.message(response) == ref["tool_response"]


@pytest.mark.parametrize("name", list(FIXTURE["parsed_completions"]))
def test_calls_are_found_where_harmony_parses_them(name):
    case = FIXTURE["parsed_completions"][name]
    # The prompt ends in "<|start|>assistant": a completion continues that message.
    completion = case["completion"].removeprefix("<|start|>assistant")
    call = case["messages"][-1]
    # vLLM drops <|call|> and reports its id; TensorRT-LLM reports the string.
    for finish in (Finish("stop", 200012), Finish("stop", "<|call|>")):
        end = fmt().end_turn(completion.removesuffix("<|call|>"), finish)
        assert (end.restored, end.code) == ("<|call|>", call["content"][0]["text"])
        assert end.channel == call["channel"] and end.reply is None


@pytest.mark.parametrize(
    "turn",
    [
        ANALYSIS + "<|start|>assistant<|channel|>analysis to=python code<|message|>" + CODE,
        ANALYSIS + "<|start|>assistant to=python<|channel|>analysis code<|message|>" + CODE,
    ],
    ids=["recipient-after-channel", "recipient-before-channel"],
)
def test_second_prompt_is_harmonys_whatever_header_the_model_wrote(turn):
    f = fmt()
    end = f.end_turn(turn, Finish("stop", 200012))
    generation = turn + end.restored + f.output_block("104\n", None, end)
    prompt = TextRenderer().prompt(USER, "high", DATE, tools=True)
    assert prompt + f.context(generation) == FIXTURE["second_prompt"]["builtin_python"]


def test_a_first_message_call_is_run_and_rendered_canonically():
    f = fmt()
    turn = "<|channel|>analysis to=python code<|message|>" + CODE
    end = f.end_turn(turn, Finish("stop", 200012))
    assert end.code == CODE
    expected = " to=python<|channel|>analysis code<|message|>" + CODE + "<|call|>"
    assert f.context(turn + end.restored) == expected


def test_an_unknown_recipient_gets_a_harmony_message_it_can_read():
    turn = "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{}"
    end = fmt().end_turn(turn, Finish("stop", 200012))
    assert end.reply == (
        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>Error: there is "
        "no tool named 'functions.lookup'; the only tool is python.<|end|><|start|>assistant"
    )


@pytest.mark.parametrize(
    ("turn", "finish", "error"),
    [
        ("<|channel|>analysis to=python code", Finish("stop", 200012), "ended a header"),
        ("<|channel|><|message|>x", Finish("stop", "<|call|>"), "cannot read the header"),
        ("<|channel|>analysis<|message|>think", Finish("stop", 200012), "to no recipient"),
    ],
)
def test_malformed_harmony_is_a_clear_error(turn, finish, error):
    end = fmt().end_turn(turn, finish)
    assert end.code is None and error in end.error


def test_the_end_of_a_final_message_is_no_call():
    for finish in (Finish("stop", None), Finish("stop"), Finish("length")):
        end = fmt().end_turn("<|channel|>final<|message|>\\boxed{104}", finish)
        assert end == type(end)()


def test_stripped_markers_are_detected():
    assert "skip_special_tokens" in fmt().check_turn("analysisCompute it with python.assistant")
    assert fmt().check_turn(ANALYSIS) is None


def test_the_answer_is_read_from_the_final_channel_only():
    f = fmt()
    text = "<|channel|>analysis<|message|>maybe \\boxed{1}<|end|><|start|>assistant"
    assert f.answer_region(text) is None
    final = text + "<|channel|>final<|message|>It is \\boxed{2}.<|return|>"
    assert f.answer_region(final) == "It is \\boxed{2}."


@pytest.fixture(scope="session")
def vocabulary_cache() -> Path:
    """Harmony's download cache holding o200k, taken from the PyPI wheel the fixtures used."""
    cache = Path(tempfile.gettempdir()) / "mathagent-test-tiktoken-cache"
    target = cache / VOCAB_MEMBER.rsplit("/", 1)[1]
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == VOCAB_SHA256:
        return cache
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        done = subprocess.run(
            [*pip, "-d", tmp, "litellm==1.110.2"], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            pytest.skip(f"PyPI unreachable, no harmony vocabulary: {done.stderr[-300:]}")
        (wheel,) = Path(tmp).glob("litellm-*.whl")
        data = zipfile.ZipFile(wheel).read(VOCAB_MEMBER)
    assert hashlib.sha256(data).hexdigest() == VOCAB_SHA256
    cache.mkdir(exist_ok=True)
    target.write_bytes(data)
    return cache


@pytest.fixture
def package(vocabulary_cache: Path, monkeypatch: pytest.MonkeyPatch) -> PackageRenderer:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("TIKTOKEN_RS_CACHE_DIR", str(vocabulary_cache))
    assert vocabulary_present()
    return PackageRenderer()


HEADERS = [
    ("<|channel|>analysis to=python code", "assistant"),
    (" to=python<|channel|>analysis code", "assistant"),
    ("assistant to=python<|channel|>analysis code", None),
    ("assistant<|channel|>analysis to=python", None),
    ("assistant<|channel|>commentary to=functions.f <|constrain|>json", None),
    ("assistant to=functions.f<|constrain|>json", None),
    ("python to=assistant<|channel|>analysis", None),
    ("assistant<|channel|>analysis code", None),
    ("assistant<|channel|>final", None),
    ("<|channel|>final", "assistant"),
    ("weird", None),
]


def test_the_package_renders_and_parses_as_the_text_path(package: PackageRenderer):
    text = TextRenderer()
    for effort in ("low", "medium", "high"):
        for tools in (True, False):
            assert package.prompt(USER, effort, DATE, tools) == text.prompt(
                USER, effort, DATE, tools
            )
    assert package.prompt(USER, "high", DATE, True) == FIXTURE["first_prompt"]["builtin_python"]
    for header, role in HEADERS:
        parsed = text.parse_header(header, role)
        assert package.parse_header(header, role) == parsed, header
        if parsed is not None:
            msg = HarmonyMessage(**{**parsed.__dict__, "content": "x = 1\n"})
            assert package.message(msg) == text.message(msg), header


def test_the_format_over_the_package_gives_harmonys_second_prompt(package: PackageRenderer):
    f = HarmonyFormat(package)
    turn = ANALYSIS + "<|start|>assistant<|channel|>analysis to=python code<|message|>" + CODE
    end = f.end_turn(turn, Finish("stop", 200012))
    generation = turn + end.restored + f.output_block("104\n", None, end)
    prompt = f.prompt(USER, "high", DATE, tools=True)
    assert prompt + f.context(generation) == FIXTURE["second_prompt"]["builtin_python"]


def test_notices_stay_inside_the_tool_message_never_in_a_header():
    block = fmt().output_block("104\n", 3)
    header = "<|start|>python to=assistant<|channel|>analysis<|message|>104\n```system\n"
    assert block.startswith(header) and "Remaining code executions: 3." in block
    assert block.endswith("```\n<|end|><|start|>assistant")
