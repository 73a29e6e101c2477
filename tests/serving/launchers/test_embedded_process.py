"""The embedded OpenAI server launched through the same ServerProcess class as external engines."""

from __future__ import annotations

import os
import signal
import socket
import time

import httpx
import pytest

from mathagent.serving.launchers.process import ServeError, embedded_server, port_in_use


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def engine_env(monkeypatch):
    # Two cores shared by the team: keep the child's torch small.
    monkeypatch.setenv("MATHAGENT_ENGINE__THREADS", "2")
    monkeypatch.setenv("MATHAGENT_ENGINE__DEVICE", "cpu")
    return os.environ


@pytest.mark.model
def test_embedded_server_start_health_models_and_clean_stop(engine_env):
    port = _free_port()
    server = embedded_server(port, startup_timeout_s=600, log=None)
    server.start()
    try:
        server.wait_healthy()
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert models["data"], models
        # the default model on a CPU speculates by default with its shipped drafter
        body = {"model": models["data"][0]["id"], "prompt": "1, 2, 3, 4,", "max_tokens": 12}
        done = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
        assert done.json()["speculative"]["target_forwards"] >= 1, done.json()
        assert server.returncode is None
    finally:
        started = time.monotonic()
        code = server.stop()
    assert time.monotonic() - started < server.grace_s  # it shut down, it was not killed
    # uvicorn re-raises SIGTERM after its graceful shutdown; a kill after the grace would be -9.
    assert code in (0, -signal.SIGTERM), server.tail()
    assert not port_in_use("127.0.0.1", port)


def test_embedded_server_on_a_taken_port_fails_before_starting(engine_env):
    port = _free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        server = embedded_server(port, log=None)
        with pytest.raises(ServeError, match="already in use"):
            server.start()


@pytest.mark.model
def test_embedded_server_with_a_missing_model_exits_with_its_log(engine_env, tmp_path):
    port = _free_port()
    server = embedded_server(port, model=str(tmp_path / "no-such-model"), log=None)
    server.start()
    with pytest.raises(ServeError, match="exited with code 1") as info:
        server.wait_healthy()
    assert "no-such-model" in str(info.value)  # the log tail names the culprit
