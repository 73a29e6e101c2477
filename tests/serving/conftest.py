"""Fixtures for serving tests: free ports and the tiny real HTTP server's command line."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TINY_SERVER = Path(__file__).with_name("tiny_server.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def port() -> int:
    """A TCP port nothing listens on right now."""
    return _free_port()


@pytest.fixture
def tiny_argv() -> Callable[..., list[str]]:
    """``tiny_argv(port, mode, delay=0)``: the command starting tests/serving/tiny_server.py."""

    def make(port: int, mode: str, delay: float = 0.0) -> list[str]:
        return [sys.executable, str(TINY_SERVER), str(port), mode, str(delay)]

    return make
