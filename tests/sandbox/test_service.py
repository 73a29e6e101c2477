"""`mathagent sandbox serve` over real HTTP: the contract, and a 4xx for every malformed request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from http.client import HTTPConnection

import httpx
import pytest

pytestmark = pytest.mark.docker

CONTRACT_FIELDS = {"status", "stdout", "stderr", "session_id", "state_lost", "duration_s"}


@pytest.fixture
def http(sandbox_service: str):
    with httpx.Client(base_url=sandbox_service, timeout=60) as client:
        yield client


def test_health(http):
    body = http.get("/health").json()
    assert body["status"] == "ok" and {"warm", "sessions"} <= set(body)


def test_execute_keeps_state_and_follows_the_contract(http):
    first = http.post("/execute", json={"code": "x = 20\nx + 1"})
    assert first.status_code == 200
    body = first.json()
    assert set(body) >= CONTRACT_FIELDS
    assert body["status"] == "completed" and body["stdout"] == "21\n" and not body["state_lost"]
    sid = body["session_id"]
    second = http.post(
        "/execute", json={"code": "x * 2", "session_id": sid, "timeout": 5, "max_output_chars": 10}
    ).json()
    assert second["stdout"] == "40\n" and second["session_id"] == sid


def test_timeout_and_output_cap_over_http(http):
    body = http.post(
        "/execute", json={"code": "print('a' * 5000)\nwhile True: pass", "timeout": 1.0,
                          "max_output_chars": 50}
    ).json()  # fmt: skip
    assert body["status"] == "timeout" and body["stdout"] == "a" * 50 + "<output cut>"
    assert body["truncated"]


def test_delete_session_ends_it(http):
    http.post("/execute", json={"code": "gone = 1", "session_id": "svc-del"})
    assert http.delete("/sessions/svc-del").status_code == 200
    assert http.delete("/sessions/never-existed").status_code == 200
    body = http.post("/execute", json={"code": "'gone' in globals()", "session_id": "svc-del"})
    assert body.json()["stdout"] == "False\n"


def test_request_over_the_size_limit_is_413(http):
    response = http.post("/execute", json={"code": "#" * 70_000})
    assert response.status_code == 413 and "limit" in response.json()["detail"]
    chunked = http.post("/execute", content=(b"x" * 8192 for _ in range(10)))
    assert chunked.status_code == 413


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"", 400),
        (b"{not json", 400),
        (b"\xff\xfe{}", 400),
        (b"[" * 30_000 + b"]" * 30_000, 400),
        (b"[]", 422),
        (b'"code"', 422),
        (b"{}", 422),
        (b'{"code": 1}', 422),
        (b'{"code": null}', 422),
        (b'{"code": "1", "timeout": 0}', 422),
        (b'{"code": "1", "timeout": -2}', 422),
        (b'{"code": "1", "timeout": "5"}', 422),
        (b'{"code": "1", "timeout": true}', 422),
        (b'{"code": "1", "timeout": NaN}', 422),
        (b'{"code": "1", "timeout": Infinity}', 422),
        (b'{"code": "1", "timeout": 1e9}', 422),
        (b'{"code": "1", "max_output_chars": 0}', 422),
        (b'{"code": "1", "max_output_chars": 1.5}', 422),
        (b'{"code": "1", "max_output_chars": "10"}', 422),
        (b'{"code": "1", "session_id": 5}', 422),
        (b'{"code": "1", "session_id": ""}', 422),
        (b'{"code": "1", "session_id": "../etc"}', 422),
        (b'{"code": "1", "language": "python"}', 422),
        (b'{"code": "\\udcff"}', 422),
        (b'{"code": "1", "\\udcff": 1}', 422),
        (b'{"code": "1", "\xed\xa0\x80": 1}', 422),
        (b'{"code": "1", "timeout": "\\ud800"}', 422),
    ],
)
def test_malformed_requests_get_a_clear_4xx(http, body, status):
    response = http.post("/execute", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert response.json()["detail"]


def test_wrong_routes_and_methods_are_4xx(http):
    assert http.get("/execute").status_code == 405
    assert http.get("/nope").status_code == 404
    assert http.delete("/sessions/bad id!").status_code == 422


def test_code_that_cannot_compile_is_a_result_not_an_http_error(http):
    for body in (b'{"code": "\\u0000"}', b'{"code": "def ("}'):
        response = http.post("/execute", content=body)
        assert response.status_code == 200 and response.json()["status"] == "error", body


def test_20_mib_body_is_413_even_for_clients_that_write_it_whole(sandbox_service):
    """urllib and http.client send the whole body before reading: they must read the 413, not
    a connection reset (the failure the held-out attack suite found)."""
    big = b'{"code": "' + b"#" * (20 * 1024 * 1024) + b'"}'
    request = urllib.request.Request(
        f"{sandbox_service}/execute", data=big, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 413 and b"limit" in caught.value.read()
    host, port = sandbox_service.removeprefix("http://").split(":")
    conn = HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/execute", body=big, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 413 and json.loads(reply.read())["detail"]
    conn.close()
    assert httpx.post(f"{sandbox_service}/execute", json={"code": "1"}).status_code == 200
