"""SandboxClient against the real service, and the backend factory."""

from __future__ import annotations

import asyncio

import pytest

from mathagent.config import Settings
from mathagent.sandbox import (
    ContainerPool,
    ExecStatus,
    SandboxClient,
    SandboxError,
    open_sandbox,
)


@pytest.mark.docker
async def test_client_runs_sessions_through_the_service(sandbox_service):
    async with SandboxClient(sandbox_service) as sandbox:
        first = await sandbox.execute("n = 3\nn ** 2", session_id="cl-1")
        assert (first.status, first.stdout) == (ExecStatus.completed, "9\n")
        again = await sandbox.execute("n + 1", session_id="cl-1")
        assert again.stdout == "4\n"
        await sandbox.close_session("cl-1")
        after = await sandbox.execute("'n' in globals()", session_id="cl-1")
        assert after.stdout == "False\n"
        assert (await sandbox.health())["status"] == "ok"


@pytest.mark.docker
async def test_client_sessions_run_concurrently_and_stay_apart(sandbox_service):
    async with SandboxClient(sandbox_service) as sandbox:

        async def one(i: int) -> str:
            await sandbox.execute(f"v = {i}", session_id=f"cl-par-{i}", timeout=60)
            result = await sandbox.execute("v", session_id=f"cl-par-{i}")
            await sandbox.close_session(f"cl-par-{i}")
            return result.stdout

        assert await asyncio.gather(*(one(i) for i in range(4))) == [f"{i}\n" for i in range(4)]


@pytest.mark.docker
async def test_client_reports_bad_arguments_as_value_errors(sandbox_service):
    async with SandboxClient(sandbox_service) as sandbox:
        with pytest.raises(ValueError):
            await sandbox.execute("1", timeout=0)
        with pytest.raises(ValueError, match="422"):
            await sandbox.execute("1", timeout=10_000)  # past the service's max_timeout_s


async def test_client_reports_an_unreachable_service():
    async with SandboxClient("http://127.0.0.1:9") as sandbox:
        with pytest.raises(SandboxError, match="unreachable"):
            await sandbox.execute("1")


async def test_open_sandbox_picks_the_backend(clean_env):
    remote = open_sandbox(Settings(sandbox_url="http://127.0.0.1:6000"))
    assert isinstance(remote, SandboxClient)
    await remote.aclose()
    local = open_sandbox(Settings())
    assert isinstance(local, ContainerPool)
    await local.aclose()
