"""The /solve app behind a real uvicorn socket: oversized bodies, auth and logs on the wire."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message

import pytest
import uvicorn

from tests.agent.fakes import Turn
from tests.agent.test_api import app_for

KEY = "k3y-never-logged"
BIG = 20 * 1024 * 1024


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app, _ = app_for([Turn(["\\boxed{7}"]) for _ in range(8)], api_key=KEY)
    # log_config=None: uvicorn's loggers propagate, so caplog sees its access and error lines.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="debug", log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def post(url: str, body: bytes, token: str | None = None) -> tuple[int, Message, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/solve", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def test_20_mib_body_is_413_before_auth_and_not_a_reset(url):
    status, headers, body = post(url, b'{"problem": "' + b"x" * BIG + b'"}')
    assert status == 413 and "limit" in body["detail"]
    assert headers["connection"] == "close"


def test_a_body_dropped_mid_stream_leaves_the_api_serving(url):
    with socket.create_connection(url.removeprefix("http://").split(":")) as sock:
        sock.sendall(b"POST /solve HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n{")
    status, _, body = post(url, b'{"problem": "p", "tools": false}', KEY)
    assert status == 200 and body["answer"] == "7"


def test_auth_over_http_and_the_key_is_never_logged(url, caplog):
    caplog.set_level(logging.DEBUG)
    problem = b'{"problem": "p", "tools": false}'
    status, headers, _ = post(url, problem)
    assert status == 401 and headers["www-authenticate"] == 'Bearer realm="mathagent"'
    assert post(url, problem, "wrong")[0] == 403
    assert post(url, problem, KEY[:-1])[0] == 403
    status, _, body = post(url, problem, KEY)
    assert status == 200 and body["answer"] == "7"
    assert "POST /solve" in caplog.text  # the access log ran, and shows no credentials
    assert KEY not in caplog.text and KEY[:-1] not in caplog.text
