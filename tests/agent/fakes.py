"""Scripted fakes for unit tests: an OpenAI-compatible endpoint and a sandbox.

The endpoint fake sits under the real ``openai`` client as an httpx transport, so the agent's
HTTP, streaming and retry code runs unchanged; each request consumes the next scripted turn.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from mathagent.agent.llm import LLM
from mathagent.agent.prompts import ChatTemplate
from mathagent.sandbox.base import ExecResult, ExecStatus, Sandbox


@dataclass
class Turn:
    """One scripted response: streamed chunks and how it ends, or a failure."""

    chunks: list[str] = field(default_factory=list)
    finish_reason: str | None = "stop"
    stop_reason: Any = "absent"
    status: int = 200
    hang: bool = False
    break_after: int | None = None  # drop the connection after this many chunks


class FakeTokenizer:
    """Renders chat messages in a fixed, readable layout (stands in for a real template)."""

    chat_template = "fake"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw):
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


class FakeEndpoint:
    """Scripted OpenAI-compatible completions/chat endpoint."""

    def __init__(self, turns: list[Turn] | dict[int, list[Turn]]) -> None:
        # A dict scripts each sample separately, keyed by the request's seed (seed + sample).
        self.turns = (
            {k: list(v) for k, v in turns.items()} if isinstance(turns, dict) else list(turns)
        )
        self.requests: list[dict] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the model list: how a failed endpoint is probed back in
            return httpx.Response(200, json={"object": "list", "data": [{"id": "fake-model"}]})
        body = json.loads(request.content)
        self.requests.append(body)
        script = self.turns[body.get("seed")] if isinstance(self.turns, dict) else self.turns
        turn = script.pop(0) if script else Turn(status=500)
        if turn.hang:
            await asyncio.sleep(3600)
        if turn.status != 200:
            return httpx.Response(turn.status, json={"error": {"message": "scripted failure"}})
        chat = request.url.path.endswith("/chat/completions")
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=self._sse(turn, chat)
        )

    async def _sse(self, turn: Turn, chat: bool):
        for i, text in enumerate(turn.chunks):
            if turn.break_after is not None and i >= turn.break_after:
                raise httpx.ReadError("connection dropped")
            yield _event(_chunk(text, None, chat, turn.stop_reason))
            await asyncio.sleep(0)
        if turn.break_after is not None:
            raise httpx.ReadError("connection dropped")
        yield _event(_chunk("", turn.finish_reason, chat, turn.stop_reason))
        usage = {"prompt_tokens": 10, "completion_tokens": len(turn.chunks), "total_tokens": 0}
        yield _event(
            {
                "id": "x",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": usage,
            }
        )
        yield b"data: [DONE]\n\n"


def _chunk(text: str, finish: str | None, chat: bool, stop_reason: Any) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    if finish is not None and stop_reason != "absent":
        choice["stop_reason"] = stop_reason
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": "x", "object": obj, "created": 0, "model": "m", "choices": [choice]}


def _event(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def make_llm(endpoint: FakeEndpoint, mode: str = "completions", **kw: Any) -> LLM:
    client = openai.AsyncOpenAI(
        base_url="http://fake/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=endpoint.transport()),
    )
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("request_timeout_s", 5.0)
    template = ChatTemplate(FakeTokenizer()) if mode == "completions" else None
    kw.setdefault("chat_template", template)
    return LLM(client, kw.pop("model", "fake-model"), mode=mode, **kw)


class FakeSandbox(Sandbox):
    """Returns scripted results (or runs ``print(<expr>)`` with eval) and records calls."""

    def __init__(self, results: list[ExecResult | Exception] | None = None, hang: bool = False):
        self.results = list(results or [])
        self.calls: list[dict] = []
        self.closed: list[str] = []
        self.hang = hang

    async def execute_request(self, req):
        self.calls.append(req.model_dump())
        if self.hang:
            await asyncio.sleep(3600)
        sid = req.session_id or f"s{len(self.calls)}"
        if self.results:
            res = self.results.pop(0)
            if isinstance(res, Exception):
                raise res
            return res.model_copy(update={"session_id": sid})
        out = _eval_print(req.code)
        return ExecResult(status=ExecStatus.completed, stdout=out, session_id=sid)

    async def close_session(self, session_id):
        self.closed.append(session_id)

    async def aclose(self):
        pass


def _eval_print(code: str) -> str:
    code = code.strip()
    if code.startswith("print(") and code.endswith(")"):
        return f"{eval(code[6:-1], {})}\n"
    return ""
