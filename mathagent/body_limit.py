"""The one request-body rule of every mathagent HTTP service: a size limit answered 413 early.

Used by the sandbox service, the /solve API and the embedded OpenAI server alike. The body is
read here, before the app sees it, so a body over the limit is answered ``413`` as soon as its
``Content-Length`` (or, for a chunked body, its first byte past the limit) arrives: never read
whole, never buffered past the limit. A body not complete within ``timeout_s`` gets ``408``
(a slow sender cannot hold a connection forever); a client that goes away mid-body never
reaches the app.

Why the drain after a refusal: a server that answers early and then closes the socket while
the client is still sending makes the kernel reset the connection, and a client that writes its
whole body before reading (urllib, any HTTP/1.0 or ``Connection: close`` request under uvicorn)
then sees "connection reset" instead of the 413. So the refusal goes out whole first, then up
to ``LINGER_BYTES`` / ``LINGER_S`` of the rest is read and thrown away (nginx's and Apache's
"lingering close"), then the connection closes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# The JSON body of a refusal, from its status and message (each service keeps its error shape).
Render = Callable[[int, str], dict[str, Any]]

LINGER_BYTES = 64 * 1024 * 1024
LINGER_S = 5.0
BODY_TIMEOUT_S = 60.0


def detail_body(status: int, message: str) -> dict[str, Any]:
    """FastAPI's error shape, ``{"detail": message}``."""
    return {"detail": message}


class BodyLimit:
    """ASGI middleware: the request body, at most ``max_bytes``, read before the app runs."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        render: Render = detail_body,
        timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app, self.max_bytes, self.render, self.timeout_s = app, max_bytes, render, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, receive, 413, self._too_large(), headers)
            return
        try:
            body = await self._read(receive)
        except _Refused as exc:
            await self._refuse(send, receive, exc.status, exc.message, headers)
            return
        if body is None:  # the client went away mid-body: nobody to answer
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> str:
        return f"request body is over the {self.max_bytes}-byte limit"

    async def _read(self, receive: Receive) -> bytes | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._read_all(receive)
        except TimeoutError:
            raise _Refused(408, f"the request body took over {self.timeout_s:g} s") from None

    async def _read_all(self, receive: Receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _Refused(413, self._too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(
        self, send: Send, receive: Receive, status: int, message: str, headers: dict
    ) -> None:
        """Send the whole refusal, drain what the client still sends (bounded), then close."""
        body = json.dumps(self.render(status, message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        # The response is complete on the wire (its length is declared) before the drain.
        await send({"type": "http.response.body", "body": body, "more_body": True})
        # A client waiting for "100 Continue" sends no body; reading would make the server
        # send the 100 after this final answer.
        if headers.get(b"expect", b"").lower() != b"100-continue":
            await _drain(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message


async def _drain(receive: Receive) -> None:
    deadline, left = time.monotonic() + LINGER_S, LINGER_BYTES
    while left > 0:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            return
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return
        left -= len(message.get("body", b""))


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's ``receive``: the body once, then the server's own (disconnect notices)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
