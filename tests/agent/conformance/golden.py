"""Shared pieces of the conformance tests: fixtures, chat templates, scripted model turns, and
an agent wired to a fake server the way the runtime wires it to a real one."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from mathagent.agent.llm import open_llm
from mathagent.agent.model_card import model_card
from mathagent.agent.plan import plan_for
from mathagent.agent.prompts import ChatTemplate
from mathagent.agent.solver import Solver
from mathagent.config import AgentSettings
from mathagent.sandbox.base import Sandbox
from tests.agent.conformance.fake_servers import HARMONY, FakeServer, Token

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROBLEM = "What is $12 \\cdot 9 - 4$?"
DATE = "2025-11-14"  # the fixtures' conversation date


def load(rel: str) -> dict[str, Any]:
    return json.loads((FIXTURES / rel).read_text())


class JinjaTokenizer:
    """A tokenizer stand-in that renders a fixture's chat template as transformers does."""

    def __init__(self, template_file: str) -> None:
        self.chat_template = (FIXTURES / "templates" / template_file).read_text()

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw):
        rendered, _ = render_jinja_template(
            conversations=[messages],
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            **kw,
        )
        return rendered[0]


_MARKERS = re.compile("|".join(re.escape(m) for m in HARMONY))


def scripted(text: str, count: int | None, end: Token | None, base: int = 5000) -> list[Token]:
    """``text`` as tokens (harmony markers as their special tokens, one per other character, or
    merged to ``count`` tokens), then ``end``.

    ``count`` includes ``end``, so a server reports the fixture's completion tokens.
    """
    parts: list[Token] = []
    pos = 0
    for m in _MARKERS.finditer(text):
        parts += _plain(text[pos : m.start()], base + pos)
        parts.append(HARMONY[m.group()])
        pos = m.end()
    parts += _plain(text[pos:], base + pos)
    want = len(parts) if count is None else count - (end is not None)
    while len(parts) > want:  # merge neighbouring plain tokens
        i = next(i for i in range(len(parts) - 1) if not (parts[i].special or parts[i + 1].special))
        parts[i : i + 2] = [Token(parts[i].text + parts[i + 1].text, parts[i].id)]
    assert len(parts) == want, (len(parts), want)
    return [*parts, end] if end is not None else parts


def _plain(text: str, base: int) -> list[Token]:
    return [Token(ch, base + i) for i, ch in enumerate(text)]


async def agent_at(
    server: FakeServer,
    sandbox: Sandbox | None,
    template_file: str | None,
    **settings: Any,
) -> Solver:
    """The agent over ``server``: its /v1/models card, the fixture's chat template."""
    agent = AgentSettings(seed=0, conversation_date=DATE, retries=0, **settings)
    card = await model_card(server.base_url, model=server.model.name)
    family = plan_for(agent, card.id).family
    template = ChatTemplate(JinjaTokenizer(template_file)) if template_file else None
    llm = open_llm(
        server.base_url,
        card.id,
        agent,
        chat_template=template,
        context_len=card.max_model_len,
        renders_itself=family.harmony is not None,
    )
    return Solver(llm, sandbox, agent)
