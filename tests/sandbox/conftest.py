"""Fixtures for the sandbox tests: the real image (built by the project's own code when missing)
and small, fast settings. Every test here runs against the real Docker daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import docker
import httpx
import pytest
import pytest_asyncio

from mathagent.config import SandboxSettings
from mathagent.sandbox import ContainerPool, ExecResult
from mathagent.sandbox.container import OWNER_LABEL, owner_id
from mathagent.sandbox.image import build_image


def small_settings(**overrides: object) -> SandboxSettings:
    """Limits small enough that the faults trip quickly; no preloading so containers start fast."""
    values: dict = {
        "pool_size": 2,
        "max_sessions": 128,
        "memory_mb": 256,
        "pids_limit": 64,
        "tmpfs_mb": 16,
        "kill_grace_s": 1.0,
        "preload": "",
    }
    values.update(overrides)
    return SandboxSettings(**values)


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    client = docker.from_env()
    client.ping()
    return client


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    """The sandbox image, built the way `mathagent sandbox build` builds it (a no-op when current)."""
    return build_image(SandboxSettings(), client=docker_client).image


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(sandbox_image: str):
    """One small pool per test module (its tests run on the module's event loop)."""
    async with ContainerPool(small_settings()) as pool:
        yield pool


async def run(pool: ContainerPool, code: str, session: str | None = None, **kw) -> ExecResult:
    return await pool.execute(code, session_id=session, **kw)


SERVICE_ENV = {
    "MATHAGENT_SANDBOX__POOL_SIZE": "1",
    "MATHAGENT_SANDBOX__PRELOAD": "",
    "MATHAGENT_SANDBOX__MAX_REQUEST_BYTES": "65536",
    "MATHAGENT_SANDBOX__MAX_TIMEOUT_S": "60",
}


@pytest.fixture(scope="session")
def sandbox_service(sandbox_image: str, docker_client: docker.DockerClient) -> Iterator[str]:
    """A real `mathagent sandbox serve` process on a free port; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, **SERVICE_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mathagent", "sandbox", "serve", "--port", str(port)], env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        owner = owner_id(proc.pid)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    left = docker_client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})
    assert left == [], "the service left containers behind"


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandbox serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("sandbox serve did not become healthy within 60 s")
