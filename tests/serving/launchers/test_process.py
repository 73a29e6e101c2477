"""ServerProcess lifecycle with real processes and a real HTTP server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from mathagent.serving.launchers.process import (
    ServeError,
    ServerProcess,
    explain_failure,
    port_in_use,
    serve_foreground,
)
from tests.serving.conftest import tiny_argv


def _server(argv: list[str], port: int, **kwargs) -> ServerProcess:
    kwargs.setdefault("startup_timeout_s", 30)
    return ServerProcess(
        argv, health_url=f"http://127.0.0.1:{port}/health", name="tiny", log=None, **kwargs
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_wait_healthy_serve_and_stop(port):
    server = _server(tiny_argv(port, "ok", 0.5), port)
    with server:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert models["data"][0]["id"] == "tiny"
        pid = server._proc.pid
        assert server.returncode is None
    assert server.returncode == -signal.SIGTERM
    assert not _alive(pid)
    assert "listening" in server.tail()
    assert not port_in_use("127.0.0.1", port)


def test_stubborn_server_is_killed_after_grace(port):
    server = _server(tiny_argv(port, "stubborn"), port, grace_s=0.5)
    server.start()
    server.wait_healthy()
    started = time.monotonic()
    assert server.stop() == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5


def test_missing_binary_is_one_clear_message(port):
    server = _server(["trtllm-serve-does-not-exist", "model"], port)
    with pytest.raises(ServeError, match="not found on PATH"):
        server.start()


def test_trtllm_serve_missing_suggests_docker(port):
    server = _server(["trtllm-serve", "m"], port, env={"PATH": "/nonexistent"})
    with pytest.raises(ServeError, match="--launcher docker"):
        server.start()


def test_port_in_use_is_reported_before_start(port):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        server = _server(tiny_argv(port, "ok"), port)
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.returncode is None  # nothing was started


def test_early_exit_reports_code_and_log_tail(port):
    server = _server(tiny_argv(port, "exit"), port)
    server.start()
    with pytest.raises(ServeError, match="exited with code 3") as info:
        server.wait_healthy()
    assert "tiny server: giving up" in str(info.value)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("oom", "CUDA out of memory"), ("gated", "gated on Hugging Face and HF_TOKEN is not set")],
)
def test_known_failures_in_the_log_become_one_message(port, mode, expected):
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    server = _server(tiny_argv(port, mode), port)
    server.env = env
    server.start()
    with pytest.raises(ServeError, match=expected):
        server.wait_healthy()


def test_never_healthy_times_out_and_stops(port):
    server = _server(tiny_argv(port, "never"), port, startup_timeout_s=1.0)
    server.start()
    with pytest.raises(ServeError, match="not healthy within 1 s"):
        server.wait_healthy()
    assert server.returncode is not None


@pytest.mark.parametrize(
    ("log", "env", "expected"),
    [
        ("RuntimeError: CUDA error: out of memory", {}, "CUDA out of memory"),
        ("OSError: [Errno 98] Address already in use", {}, "port is already in use"),
        (
            "GatedRepoError: Access to model meta-llama/x is restricted",
            {"HF_TOKEN": "t"},
            "no access",
        ),
        (
            "Unable to find image 'nvcr.io/nvidia/x:1' locally",
            {},
            "docker image nvcr.io/nvidia/x:1",
        ),
        ("all good", {}, None),
    ],
)
def test_explain_failure(log, env, expected):
    argv = ["docker", "run", "nvcr.io/nvidia/x:1"]
    found = explain_failure(log, argv, env)
    assert found == expected if expected is None else expected in found


def test_sigterm_to_the_launcher_stops_the_server_cleanly(port):
    # serve_foreground in its own process, as `mathagent serve` runs it; SIGTERM it once healthy.
    code = textwrap.dedent(f"""
        import sys
        from mathagent.serving.launchers.process import ServerProcess, serve_foreground
        server = ServerProcess({tiny_argv(port, "ok")!r},
                               health_url="http://127.0.0.1:{port}/health", name="tiny", log=None)
        code = serve_foreground(server, lambda line: print(line, flush=True))
        print("child", server._proc.pid, "rc", server.returncode, flush=True)
        sys.exit(code)
    """)
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert "is up" in launcher.stdout.readline()
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 0
    pid = int(out.split("child")[1].split()[0])
    assert not _alive(pid)
    assert not port_in_use("127.0.0.1", port)


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker client and daemon")
def test_missing_docker_image_is_one_clear_message(port):
    # The docker launcher's failure mode: the image is neither local nor pullable.
    argv = ["docker", "run", "--rm", "--network", "host", "mathagent-no-such-image:0.0", "true"]
    server = _server(argv, port)
    server.start()
    with pytest.raises(ServeError, match=r"docker image mathagent-no-such-image:0\.0 is missing"):
        server.wait_healthy()


def test_dying_while_serving_is_explained(port):
    lines: list[str] = []
    server = _server(tiny_argv(port, "crash", 1.0), port)
    with pytest.raises(ServeError, match="exited with code 1: CUDA out of memory"):
        serve_foreground(server, lines.append)
    assert any("is up" in line for line in lines)
