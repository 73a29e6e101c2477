"""Every fault of the issue against real Docker: time, processes, memory, output, crashes,
and the lock-down (filesystem, network, environment, user, capabilities)."""

from __future__ import annotations

import time

import pytest

from mathagent.sandbox import ExecStatus
from mathagent.sandbox.container import POOL_LABEL

from .conftest import run

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.docker]


# --- time -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", ["while True:\n    pass", "import time\ntime.sleep(100)"], ids=["loop", "sleep"]
)
async def test_infinite_loop_and_sleep_time_out_and_keep_state(pool, code):
    session = f"s-time-{len(code)}"
    await run(pool, "kept = 1", session)
    start = time.monotonic()
    result = await run(pool, code, session, timeout=1.0)
    assert time.monotonic() - start < 1.0 + 3
    assert result.status == ExecStatus.timeout and "TimeoutError" in result.stderr
    after = await run(pool, "kept", session)
    assert after.stdout == "1\n" and not after.state_lost


async def test_cell_swallowing_the_timeout_is_killed_from_outside(pool):
    code = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass"
    await run(pool, "kept = 1", "s-stubborn")
    start = time.monotonic()
    result = await run(pool, code, "s-stubborn", timeout=1.0)
    assert time.monotonic() - start < 1.0 + 3
    assert result.status == ExecStatus.timeout and result.state_lost
    after = await run(pool, "'kept' in globals()", "s-stubborn")
    assert after.state_lost and after.stdout == "False\n"


# --- processes and memory -------------------------------------------------------------


async def test_fork_bomb_is_capped_by_the_pids_limit(pool):
    code = "import os\nwhile True:\n    os.fork()"
    result = await run(pool, code, "s-fork", timeout=5.0)
    assert result.status in (ExecStatus.error, ExecStatus.timeout)
    after = await run(pool, "import os\nsum(p.isdigit() for p in os.listdir('/proc'))", "s-fork")
    assert after.status == ExecStatus.completed
    assert int(after.stdout) <= 3  # init and the worker: the bomb's children are gone
    child = await run(
        pool, "import os\nif os.fork() == 0:\n    print('child')\nelse:\n    os.wait()", "s-fork"
    )
    assert child.stdout == "child\n"


async def test_memory_bomb_is_reported_as_memory_limit(pool):
    result = await run(pool, "x = bytearray(2 * 1024**3)", "s-oom", timeout=20)
    assert result.status == ExecStatus.memory_limit, result
    touched = await run(pool, "b = bytearray(1024**2)\nb[::4096] = b'1' * 256", "s-oom")
    assert touched.status == ExecStatus.completed


async def test_out_of_memory_kill_is_memory_limit_and_loses_state(pool):
    code = "chunks = []\nwhile True:\n    chunks.append(b'x' * 2**24)"
    result = await run(pool, code, "s-oomkill", timeout=30)
    assert result.status == ExecStatus.memory_limit and result.state_lost
    after = await run(pool, "1", "s-oomkill")
    assert after.status == ExecStatus.completed and after.state_lost


# --- output ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "print('x' * 10**7)",
        "while True:\n    print('y' * 1000)",
        "import sys\nwhile True:\n    sys.stderr.write('z' * 1000)",
        "import os\nwhile True:\n    os.write(1, b'w' * 65536)",
        "import os\nwhile True:\n    os.write(2, b'v' * 65536)",
    ],
    ids=["huge", "endless-print", "endless-stderr", "endless-fd1", "endless-fd2"],
)
async def test_huge_and_endless_output_is_capped(pool, code):
    result = await run(pool, code, timeout=1.0, max_output_chars=100)
    marker = "<output cut>"
    assert len(result.stdout) <= 100 + len(marker) and len(result.stderr) <= 2 * (100 + len(marker))
    assert result.truncated and marker in result.stdout + result.stderr
    assert len(result.model_dump_json()) < 2000


async def test_invalid_utf8_output_is_replaced(pool):
    code = "import os, sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')\n_ = os.write(2, b'\\xc3(')"
    result = await run(pool, code)
    assert result.status == ExecStatus.completed
    assert result.stdout == "a\ufffd\ufffdb\n" and "\ufffd" in result.stderr


# --- crashes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("import ctypes\nctypes.string_at(0)", "signal 11"),
        ("import os\nos._exit(3)", "code 3"),
        ("import os, signal\nos.kill(1, signal.SIGTERM)\nimport time\ntime.sleep(5)", ""),
    ],
    ids=["segfault", "os._exit", "kill-pid-1"],
)
async def test_worker_death_gives_a_clean_result_and_a_fresh_container(pool, code, why):
    session = f"s-crash-{abs(hash(code))}"
    await run(pool, "kept = 1", session)
    result = await run(pool, code, session, timeout=10)
    assert result.status == ExecStatus.error and result.state_lost
    assert why in result.stderr
    after = await run(pool, "'kept' in globals()", session)
    assert after.status == ExecStatus.completed and after.state_lost
    assert after.stdout == "False\n"


async def test_sigkill_to_pid_1_is_ignored_by_the_kernel(pool):
    result = await run(pool, "import os, signal\nos.kill(1, signal.SIGKILL)\n'alive'")
    assert result.status == ExecStatus.completed and result.stdout == "'alive'\n"


async def test_input_raises_eof(pool):
    result = await run(pool, "input('name? ')", "s-input")
    assert result.status == ExecStatus.error and "EOFError" in result.stderr
    assert not (await run(pool, "1", "s-input")).state_lost


# --- lock-down ------------------------------------------------------------------------


async def test_writes_outside_tmp_are_refused(pool):
    for path in ("/etc/passwd", "/evil", "/opt/mathagent/worker.py", "/usr/lib/x"):
        result = await run(pool, f"open({path!r}, 'a').write('x')")
        assert result.status == ExecStatus.error
        assert "Read-only file system" in result.stderr or "Permission" in result.stderr
    ok = await run(pool, "open('/tmp/ok', 'w').write('fine')")
    assert ok.status == ExecStatus.completed and ok.stdout == "4\n"


@pytest.mark.parametrize("folder", ["/tmp", "/dev/shm"])
async def test_tmpfs_filling_is_capped(pool, folder):
    code = f"f = open('{folder}/fill', 'wb')\nwhile True:\n    f.write(b'0' * 2**20)"
    session = f"s-fill{folder.replace('/', '-')}"
    result = await run(pool, code, session, timeout=10)
    assert result.status == ExecStatus.error and "No space left" in result.stderr
    size = await run(pool, f"import os\nos.path.getsize('{folder}/fill') // 2**20", session)
    assert int(size.stdout) <= 16


async def test_no_network_but_loopback(pool):
    code = (
        "import socket\n"
        "names = [n for _, n in socket.if_nameindex()]\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    reached = True\n"
        "except OSError:\n"
        "    reached = False\n"
        "names, reached"
    )
    result = await run(pool, code)
    assert result.stdout == "(['lo'], False)\n", result.stderr


async def test_no_host_env_no_docker_socket_no_root_no_capabilities(pool, monkeypatch):
    monkeypatch.setenv("MATHAGENT_SECRET_PROBE", "leak")
    code = (
        "import os\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "(os.getuid(), os.getgid(), status['CapEff'], status['CapBnd'], status['NoNewPrivs'],\n"
        " any(os.path.exists(p) for p in ('/var/run/docker.sock', '/run/docker.sock')),\n"
        " sorted(k for k in os.environ if k not in ('PATH', 'HOSTNAME', 'HOME', 'LANG',\n"
        "   'OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'PYTHONDONTWRITEBYTECODE')))"
    )
    result = await run(pool, code)
    zero = "0000000000000000"
    assert result.stdout == f"(1000, 1000, '{zero}', '{zero}', '1', False, [])\n", result.stderr


async def test_container_settings_are_locked_down(pool, docker_client):
    await run(pool, "1", "s-inspect")
    mine = {"label": f"{POOL_LABEL}={pool.labels[POOL_LABEL]}"}
    for info in docker_client.api.containers(filters=mine):
        attrs = docker_client.api.inspect_container(info["Id"])
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["Init"]
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
        assert host["Memory"] == host["MemorySwap"] == 256 * 2**20
        assert host["PidsLimit"] == 64 and host["NanoCpus"] == 10**9
        assert host["Binds"] in (None, []) and attrs["Mounts"] == []
        assert attrs["Config"]["User"] == "1000:1000"
        assert not any(e.startswith("MATHAGENT_") for e in attrs["Config"]["Env"])


async def test_closing_the_standard_streams_harms_only_that_cell(pool):
    await run(pool, "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(0)", "s-close")
    after = await run(pool, "import os\nprint('back')\n_ = os.write(1, b'fd\\n')", "s-close")
    assert after.stdout == "back\nfd\n" and not after.state_lost
