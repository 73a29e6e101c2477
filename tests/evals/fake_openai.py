"""A real HTTP server speaking the OpenAI streaming chat API with scripted replies (tests only).

For "What is i + i?" it streams "Adding gives \\boxed{2i}" when i is even, else \\boxed{0}; or,
with a tool cell, first a ``<tool_call>`` of that cell and then its output boxed;
/metrics reports speculative-decoding counters (Prometheus text, or TensorRT-LLM's JSON).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse


def _tool_turn(messages: list[dict], cell: str) -> list[str]:
    """A first turn that calls the tool; once its output is in the context, that output boxed."""
    text = "".join(str(m.get("content", "")) for m in messages)
    own = text[text.rindex("What is ") :]  # past the few-shot examples and their outputs
    outputs = re.findall(r"```output\n(.*?)```", own, re.S)
    if not outputs:
        return ["Let me compute. ", "<tool_call>", cell]
    return ["So ", "\\boxed{", outputs[-1].strip(), "}"]


def make_app(trtllm: bool = False, tool_cell: str | None = None) -> FastAPI:
    """``tool_cell`` (a format string over the problem's ``i``): answer by running it first."""
    app = FastAPI()
    state: dict = {"accepted": 0, "drafts": 0, "pending": []}

    @app.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "scripted"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        users = "".join(m["content"] for m in body["messages"] if m["role"] == "user")
        i = int(re.findall(r"What is (\d+) \+", users)[-1])
        answer = 2 * i if i % 2 == 0 else 0
        pieces = ["Adding ", "gives ", "\\boxed{", str(answer), "}"]
        if tool_cell:
            pieces = _tool_turn(body["messages"], tool_cell.format(i=i))
        state["accepted"] += 6
        state["drafts"] += 4
        stats = {"numAcceptedTokens": 6, "numRequestsWithDraftTokens": 4, "numDraftTokens": 8}
        state["pending"].append({"specDecodingStats": stats})

        async def events() -> AsyncIterator[str]:
            for piece in pieces:
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': piece}}]})}\n\n"
            done = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield f"data: {json.dumps({'choices': [done]})}\n\n"
            usage = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/metrics")
    def metrics():
        if trtllm:
            drained, state["pending"] = state["pending"], []
            return drained
        return PlainTextResponse(
            "# TYPE mathagent:spec_decode_num_accepted_tokens_total counter\n"
            f"mathagent:spec_decode_num_accepted_tokens_total {state['accepted']}\n"
            f'mathagent:spec_decode_num_drafts_total{{model="x"}} {state["drafts"]}\n'
        )

    return app


@contextmanager
def serve(trtllm: bool = False, tool_cell: str | None = None) -> Iterator[str]:
    """Run the app on a free loopback port in a thread; yields its base URL."""
    app = make_app(trtllm, tool_cell)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
