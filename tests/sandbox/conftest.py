"""Fixtures for the sandbox tests: the real image (built by the project's own code when missing)
and small, fast settings. Every test here runs against the real Docker daemon."""

from __future__ import annotations

import docker
import pytest

from mathagent.config import SandboxSettings
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
