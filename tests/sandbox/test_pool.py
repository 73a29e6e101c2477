"""The in-process container pool against real Docker: sessions, display, scale, cleanup."""

from __future__ import annotations

import asyncio
import os

import pytest

from mathagent.sandbox import ContainerPool, ExecStatus
from mathagent.sandbox.container import LABEL, OWNER_LABEL, POOL_LABEL, owner_id, remove_orphans

from .conftest import run, small_settings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.docker]


# --- sessions and display ---------------------------------------------------------------


async def test_state_persists_and_last_expression_is_displayed(pool):
    first = await run(pool, "x = 6 * 7\nprint('side')\nx", "s-state")
    assert first.status == ExecStatus.completed
    assert first.stdout == "side\n42\n"
    assert not first.state_lost
    second = await run(pool, "x + 1", "s-state")
    assert second.stdout == "43\n" and second.session_id == "s-state"
    assert (await run(pool, "y = 1", "s-state")).stdout == ""
    assert (await run(pool, "None", "s-state")).stdout == ""
    assert (await run(pool, "print(1)", "s-state")).stdout == "1\n"


async def test_new_session_gets_an_id_and_a_clean_namespace(pool):
    result = await run(pool, "'x' in globals()")
    assert result.session_id and result.stdout == "False\n"


async def test_stdout_and_stderr_are_separate(pool):
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)"
    result = await run(pool, code)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


async def test_exception_is_an_error_with_a_clean_traceback(pool):
    result = await run(pool, "def f():\n    return 1 / 0\nf()", "s-err")
    assert result.status == ExecStatus.error
    assert "ZeroDivisionError" in result.stderr and "return 1 / 0" in result.stderr
    assert "worker.py" not in result.stderr
    syntax = await run(pool, "def f(:", "s-err")
    assert syntax.status == ExecStatus.error and "SyntaxError" in syntax.stderr


async def test_descriptor_level_and_subprocess_output_is_captured(pool):
    code = (
        "import os, subprocess\n"
        "os.write(1, b'fd1\\n')\n"
        "os.write(2, b'fd2\\n')\n"
        "subprocess.run(['echo', 'child'])"
    )
    result = await run(pool, code)
    assert result.status == ExecStatus.completed
    assert "fd1" in result.stdout and "child" in result.stdout and "fd2" in result.stderr


async def test_sympy_numpy_scipy_mpmath_are_installed(pool):
    code = (
        "import sympy, numpy, scipy, mpmath\n"
        "x = sympy.symbols('x')\n"
        "sympy.factor(x**2 - 1), int(numpy.arange(5).sum())"
    )
    result = await run(pool, code, timeout=60)
    assert result.stdout == "((x - 1)*(x + 1), 10)\n", result.stderr


# --- scale and cleanup ----------------------------------------------------------------


async def test_32_concurrent_sessions_are_isolated(pool):
    async def one(i: int) -> None:
        sid = f"s-many-{i}"
        await run(pool, f"mine = {i}\nopen('/tmp/who', 'w').write(str({i}))", sid, timeout=60)
        result = await run(pool, "mine, open('/tmp/who').read()", sid, timeout=60)
        assert result.stdout == f"({i}, '{i}')\n", result
        await pool.close_session(sid)

    await asyncio.gather(*(one(i) for i in range(32)))


async def test_timeout_argument_is_validated(pool):
    for kwargs in ({"timeout": 0}, {"timeout": -1}, {"timeout": 10**6}, {"max_output_chars": 0}):
        with pytest.raises(ValueError):
            await run(pool, "1", **kwargs)
    with pytest.raises(ValueError):
        await run(pool, "1", "bad id with spaces")


async def test_idle_sessions_are_closed_and_say_so(sandbox_image):
    async with ContainerPool(small_settings(pool_size=0, idle_timeout_s=1.0)) as pool:
        await run(pool, "x = 1", "s-idle")
        await asyncio.sleep(2.5)
        assert "s-idle" not in pool._sessions
        after = await run(pool, "'x' in globals()", "s-idle")
        assert after.state_lost and after.stdout == "False\n"


async def test_a_session_from_a_restarted_pool_says_its_state_is_lost(sandbox_image):
    # The service restarted: the new pool never held the id the old one minted.
    async with ContainerPool(small_settings(pool_size=0)) as old:
        first = await run(old, "x = 1")
    async with ContainerPool(small_settings(pool_size=0)) as new:
        again = await run(new, "'x' in globals()", first.session_id)
        assert again.state_lost and again.stdout == "False\n"
        # A client's own id is a new session, not a lost one.
        own = await run(new, "1", "client-chosen-id")
        assert not own.state_lost


async def test_orphans_are_removed_and_nothing_is_left_behind(sandbox_image, docker_client):
    orphan = docker_client.api.create_container(
        sandbox_image, labels={LABEL: "1", OWNER_LABEL: f"{os.uname().nodename}:999999:0"}
    )
    assert remove_orphans(docker_client) >= 1
    ids = {c["Id"] for c in docker_client.api.containers(all=True)}
    assert orphan["Id"] not in ids

    async with ContainerPool(small_settings()) as pool:
        mine = {"label": f"{POOL_LABEL}={pool.labels[POOL_LABEL]}"}
        assert pool.labels[OWNER_LABEL] == owner_id(os.getpid())
        await asyncio.gather(*(run(pool, "1", f"s-left-{i}") for i in range(3)))
        closing = pool._sessions["s-left-0"].container.id
        await pool.close_session("s-left-0")
        for _ in range(100):  # removal runs in the background
            ids = {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)}
            if closing not in ids:
                break
            await asyncio.sleep(0.1)
        assert closing not in ids and ids
    assert docker_client.api.containers(all=True, filters=mine) == []
