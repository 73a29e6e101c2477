"""Serving fixtures: free ports and the tiny real HTTP server (the engine's are in tests/)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # the machine is shared; one thread degrades least under load

TINY_SERVER = Path(__file__).with_name("tiny_server.py")


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def port() -> int:
    """A TCP port nothing listens on right now."""
    return free_port()


def tiny_argv(port: int, mode: str, delay: float = 0.0) -> list[str]:
    """The command starting tests/serving/tiny_server.py (a tiny real HTTP server)."""
    return [sys.executable, str(TINY_SERVER), str(port), mode, str(delay)]
