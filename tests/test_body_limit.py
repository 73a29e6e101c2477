"""BodyLimit over a real uvicorn socket: 413 before the body is read whole, and no reset.

A raw socket shows what clients see on the wire: a client that sends only the headers and a
first slice of an oversized body reads the whole 413 at once (so it was answered before the
body was read), and a ``Connection: close`` client (urllib) that writes its whole 20 MiB body
reads the 413 instead of "connection reset".
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request

from mathagent.body_limit import BodyLimit

LIMIT = 64 * 1024
BIG = 20 * 1024 * 1024


def make_app(calls: list[int]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        body = await request.body()
        calls.append(len(body))
        return {"size": len(body)}

    app.add_middleware(BodyLimit, max_bytes=LIMIT, timeout_s=1.0)
    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[int]]]:
    calls: list[int] = []
    config = uvicorn.Config(make_app(calls), host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.01)
    yield srv.servers[0].sockets[0].getsockname()[1], calls
    srv.should_exit = True
    thread.join(10)


def head(size: int | None, *extra: str) -> bytes:
    lines = ["POST /echo HTTP/1.1", "Host: t", "Content-Type: application/json", *extra]
    lines.append(f"Content-Length: {size}" if size is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_declared_oversize_is_answered_before_the_body_is_sent(server):
    port, calls = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head(BIG) + b"x" * 1024)  # 1 KiB of a 20 MiB body
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:80]
    assert b"connection: close" in reply.lower() and b"limit" in reply
    assert LIMIT + 1 not in calls


def test_chunked_body_past_the_limit_is_413(server):
    port, calls = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head(None))
        piece = b"y" * 16384
        sent = 0
        while sent <= LIMIT:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:80]
    assert all(size <= LIMIT for size in calls)


@pytest.mark.parametrize("close", [True, False], ids=["connection-close", "keep-alive"])
def test_client_writing_its_whole_body_reads_413_not_a_reset(server, close):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head(BIG, *(["Connection: close"] if close else [])))
        sock.sendall(b"z" * BIG)  # raises ConnectionResetError/BrokenPipeError without the drain
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 413")


def test_urllib_20_mib_post_gets_413(server):
    port, _ = server
    request = urllib.request.Request(f"http://127.0.0.1:{port}/echo", data=b"{" * BIG)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413


def test_expect_100_continue_gets_413_and_no_100(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head(BIG, "Expect: 100-continue"))
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 413") and b"100 Continue" not in reply


def test_bodies_within_the_limit_reach_the_app_whole(server):
    port, calls = server
    for size in (0, 1, LIMIT):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/echo", data=b"a" * size)
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.read() == b'{"size":%d}' % size
    assert calls[-3:] == [0, 1, LIMIT]


def test_slow_body_gets_408_and_a_dropped_one_never_reaches_the_app(server):
    port, calls = server
    before = len(calls)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head(100) + b"a" * 10)
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 408")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head(100) + b"a" * 10)
    time.sleep(0.3)
    assert len(calls) == before
