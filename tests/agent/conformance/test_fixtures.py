"""The golden fixtures are whole and agree with each other (they come from the reference runs in
``scripts/reference_fixtures.py``; these tests only guard them against accidental edits)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REQUESTS = sorted((FIXTURES / "requests").glob("*.json"))


def load(rel: str) -> dict:
    return json.loads((FIXTURES / rel).read_text())


def test_every_fixture_names_its_reference_and_commit():
    files = sorted(FIXTURES.rglob("*.json"))
    assert len(files) >= 15
    for path in files:
        if path.parent.name == "templates":
            continue
        data = json.loads(path.read_text())
        assert data["reference"], path
        assert re.fullmatch(r"[0-9a-f]{40}", data["commit"]), path


@pytest.mark.parametrize("path", REQUESTS, ids=[p.stem for p in REQUESTS])
def test_second_request_extends_the_first(path: Path):
    data = json.loads(path.read_text())
    if "requests" in data:  # newest: recorded HTTP bodies
        bodies = [r["body"] for r in data["requests"]]
        if "prompt" in bodies[0]:
            assert bodies[0]["prompt"] == data["first_prompt"]
            for later in bodies[1:]:
                assert later["prompt"].startswith(data["first_prompt"])
        else:
            assert bodies[0]["messages"] == data["first_prompt"]
    else:  # release: the wrapper's model calls
        prompts = [r["prompt"] for r in data["model_requests"]]
        assert prompts[0] == data["first_prompt"]
        assert (
            prompts[1]
            == data["first_prompt"] + data["generation"][: len(prompts[1]) - len(prompts[0])]
        )


def test_openmath_newest_empty_system_equals_the_release_bytes():
    newest = load("requests/openmath_tir_empty_system.json")
    release = load("requests/openmath_tir_release.json")
    assert newest["first_prompt"] == release["first_prompt"]
    assert newest["requests"][1]["body"]["prompt"] == release["model_requests"][1]["prompt"]


def test_gpt_oss_template_renders_as_harmony():
    request = load("requests/gpt_oss_tir.json")
    harmony = load("harmony/gpt_oss_harmony.json")
    assert request["first_prompt"] == harmony["first_prompt"]["builtin_python"]
    assert request["requests"][0]["body"]["skip_special_tokens"] is False


def test_templates_match_the_recorded_hashes():
    for path in REQUESTS:
        data = json.loads(path.read_text())
        name = data.get("chat_template")
        if name:
            digest = hashlib.sha256((FIXTURES / "templates" / name).read_bytes()).hexdigest()
            assert digest == data["chat_template_sha256"], path


def test_timeout_wording_of_each_era():
    release = {c["name"]: c for c in load("sandbox/nemo_skills_release.json")["cells"]}
    newest = {c["name"]: c for c in load("sandbox/nemo_skills_newest.json")["cells"]}
    assert release["timeout"]["fed_back"]["openmath"] == "```output\nTimed out\n```\n"
    assert newest["timeout"]["fed_back"]["openmath"] == (
        "\n```output\nExecution timed out after 10.0 seconds\n```\n"
    )
