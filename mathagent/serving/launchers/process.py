"""One server process class for every engine: embedded, trtllm-serve, vLLM, SGLang, docker.

It starts a command in its own process group, streams its log lines, waits for
``GET /health`` with a timeout, notices an early exit, and stops cleanly (SIGTERM to the group,
a grace period, then SIGKILL). Common failures become one clear message each.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO
from urllib.parse import urlsplit

import httpx

TAIL_LINES = 200


class ServeError(RuntimeError):
    """A server could not be started or stopped; the message says why and what to do."""


def explain_failure(log_tail: str, argv: list[str], env: dict[str, str]) -> str | None:
    """One clear sentence for a failure recognised in a server's log, else ``None``."""
    text = log_tail.lower()
    if "out of memory" in text or "outofmemoryerror" in text or "cuda_error_out_of_memory" in text:
        return (
            "CUDA out of memory: lower the KV-cache memory fraction or the batch size, "
            "or use more GPUs (--tp-size)"
        )
    if "address already in use" in text:
        return "the port is already in use: stop the other server or pass another --port"
    gated = ("gatedrepoerror", "gated repo", "is restricted", "401 client error", "access to model")
    if any(marker in text for marker in gated):
        if not env.get("HF_TOKEN"):
            return "the model is gated on Hugging Face and HF_TOKEN is not set: export HF_TOKEN"
        return "the model is gated on Hugging Face and HF_TOKEN has no access to it"
    if "unable to find image" in text or "pull access denied" in text or "manifest unknown" in text:
        named = re.search(r"unable to find image '([^']+)'", log_tail, re.IGNORECASE)
        image = named[1] if named else next((a for a in argv if "/" in a and ":" in a), "")
        return f"docker image {image or '(see log)'} is missing and could not be pulled"
    if "could not select device driver" in text:
        return "docker cannot reach the GPUs: install the NVIDIA container toolkit"
    return None


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on ``host:port`` (or it cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class ServerProcess:
    """A long-running HTTP server child process with a health endpoint."""

    def __init__(
        self,
        argv: list[str],
        *,
        health_url: str,
        env: dict[str, str] | None = None,
        name: str = "server",
        startup_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        log: TextIO | Callable[[str], None] | None = sys.stderr,
        cleanup: list[str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.health_url = health_url
        self.env = {**os.environ, **(env or {})}
        self.name = name
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self._log = log
        self._cleanup = cleanup
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the command; fail at once if its binary is missing or its port is taken."""
        if shutil.which(self.argv[0], path=self.env.get("PATH")) is None:
            raise ServeError(f"{self.argv[0]} not found on PATH: {install_hint(self.argv[0])}")
        url = urlsplit(self.health_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        if port_in_use(host, port):
            raise ServeError(f"port {port} on {host} is already in use: stop that server first")
        self._proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # its own group: one signal reaches MPI ranks and workers
        )
        self._reader = threading.Thread(target=self._pump, name=f"{self.name}-log", daemon=True)
        self._reader.start()

    def wait_healthy(self) -> None:
        """Poll ``GET /health`` until 200; raise with the log's tail on exit or timeout."""
        proc = self._require()
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    self._drain()
                    raise ServeError(
                        self.explain(f"{self.name} exited with code {proc.returncode}")
                    )
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.2)
        self.stop()
        raise ServeError(
            self.explain(f"{self.name} was not healthy within {self.startup_timeout_s:.0f} s")
        )

    def wait(self) -> int:
        """Block until the process exits; return its exit code."""
        code = self._require().wait()
        self._drain()
        return code

    def stop(self) -> int | None:
        """SIGTERM the process group, wait ``grace_s``, then SIGKILL; run the cleanup command."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._cleanup:
            subprocess.run(self._cleanup, capture_output=True, env=self.env)
        self._drain()
        return proc.returncode

    @property
    def returncode(self) -> int | None:
        """Exit code, or ``None`` while running (or before start)."""
        return None if self._proc is None else self._proc.poll()

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` log lines."""
        return "\n".join(list(self._tail)[-lines:])

    def explain(self, headline: str) -> str:
        """``headline`` plus the recognised cause and the log's tail."""
        tail = self.tail()
        reason = explain_failure(tail, self.argv, self.env)
        message = f"{headline}: {reason}" if reason else headline
        return f"{message}\n--- last log lines ---\n{tail}" if tail else message

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------
    def _require(self) -> subprocess.Popen[str]:
        if self._proc is None:
            raise ServeError(f"{self.name} was not started")
        return self._proc

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            line = line.rstrip("\n")
            self._tail.append(line)
            if callable(self._log):
                self._log(line)
            elif self._log is not None:
                self._log.write(f"[{self.name}] {line}\n")
                self._log.flush()

    def _drain(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)


def serve_foreground(server: ServerProcess, echo: Callable[[str], None]) -> int:
    """Start ``server``, wait for health, then serve until it exits or Ctrl-C/SIGTERM stops it."""

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server.start()
        server.wait_healthy()
        echo(f"[mathagent] {server.name} is up: {server.health_url.removesuffix('/health')}")
        code = server.wait()
        if code != 0:  # it died while serving: say why, as at startup
            raise ServeError(server.explain(f"{server.name} exited with code {code}"))
        return code
    except KeyboardInterrupt:
        echo(f"[mathagent] stopping {server.name} (grace {server.grace_s:.0f} s)")
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def install_hint(binary: str) -> str:
    """What to do when ``binary`` is not on PATH."""
    hints = {
        "trtllm-serve": "install TensorRT-LLM (pip install tensorrt_llm) or use --launcher docker",
        "mpirun": "install Open MPI (it comes with the TensorRT-LLM NGC image)",
        "docker": "install Docker, or use --launcher native with the engine installed",
        "vllm": "install vLLM (pip install vllm)",
        "python3": "install Python 3 with SGLang (pip install sglang)",
    }
    return hints.get(binary, "install it or put it on PATH")


def embedded_server(
    port: int, *, host: str = "127.0.0.1", model: str | None = None, **kwargs: object
) -> ServerProcess:
    """The embedded OpenAI server (``python -m mathagent serve --engine embedded``) as a child."""
    argv = [sys.executable, "-m", "mathagent", "serve", "--engine", "embedded"]
    argv += ["--port", str(port), "--host", host]
    if model is not None:
        argv += ["--model", model]
    return ServerProcess(
        argv,
        health_url=f"http://{host}:{port}/health",
        name="embedded",
        **kwargs,  # type: ignore[arg-type]
    )
