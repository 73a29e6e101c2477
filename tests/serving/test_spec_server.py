"""Per-request speculation over HTTP: the extra request field, the response field, /metrics."""

from __future__ import annotations

import httpx
import openai
import pytest

from mathagent.evals.acceptance import AcceptanceMeter, parse_policy_steps, policy_steps_between
from mathagent.serving.embedded import EmbeddedServer

PROMPT = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"


@pytest.fixture(scope="module")
def base_url(engine):
    with EmbeddedServer(engine) as server:
        yield server.base_url.removesuffix("/v1")


def test_request_field_selects_the_method_and_reports_acceptance(base_url, engine) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0)
    plain = client.completions.create(
        model=engine.model_name, prompt=PROMPT, max_tokens=12, temperature=0
    )
    spec = client.completions.create(
        model=engine.model_name,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"speculative": "ngram"},
    )
    assert spec.choices[0].text == plain.choices[0].text
    stats = spec.model_extra["speculative"]
    assert stats["drafted_tokens"] >= stats["accepted_tokens"] > 0
    assert stats["acceptance_length"] > 1.0
    assert 1 <= len(stats["per_position_acceptance"]) <= engine.config.draft_len
    assert "speculative" not in (plain.model_extra or {})
    metrics = httpx.get(f"{base_url}/metrics").text
    drafted = next(
        line
        for line in metrics.splitlines()
        if line.startswith("mathagent_spec_draft_tokens_total")
    )
    assert float(drafted.split()[-1]) >= stats["drafted_tokens"]
    assert 'mathagent_spec_position_acceptance{model_name="' in metrics
    # the policy's choices: the speculative request's steps at batch 1, drafting or plain
    steps = {
        line.split("{")[1].split("}")[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("mathagent_spec_policy_steps_total{")
    }
    assert sum(n for labels, n in steps.items() if 'batch_bucket="1"' in labels) >= stats["steps"]
    assert any('draft_len="0"' not in labels for labels in steps)


async def test_the_bench_meter_reads_the_policy_steps_of_its_run(base_url, engine) -> None:
    """``mathagent bench``'s meter: this run's choices, none from the requests before it."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0)
    await client.completions.create(
        model=engine.model_name, prompt=PROMPT, max_tokens=6, temperature=0,
        extra_body={"speculative": "ngram"},
    )  # fmt: skip
    before = parse_policy_steps(httpx.get(f"{base_url}/metrics").text)
    async with AcceptanceMeter(base_url) as meter:
        spec = await client.completions.create(
            model=engine.model_name, prompt=PROMPT, max_tokens=12, temperature=0,
            extra_body={"speculative": "ngram"},
        )  # fmt: skip
    after = parse_policy_steps(httpx.get(f"{base_url}/metrics").text)
    assert meter.policy_steps == policy_steps_between(before, after)
    steps = spec.model_extra["speculative"]["steps"]
    assert sum(meter.policy_steps["1"].values()) >= steps
    assert set(meter.policy_steps) == {"1"} and isinstance(meter.policy_step_ms, dict)


def test_unknown_method_is_400(base_url) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "speculative": "medusa"}
    resp = httpx.post(f"{base_url}/v1/completions", json=body)
    assert resp.status_code == 400
    assert "ngram" in resp.text


def test_a_drafter_that_cannot_load_is_400(base_url) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "speculative": "redrafter:/nonexistent/drafter"}
    resp = httpx.post(f"{base_url}/v1/completions", json=body)
    assert resp.status_code == 400
    assert "ReDrafter" in resp.text
