"""Evaluation across replicas, with faults, on real embedded servers and real `mathagent eval`.

Each server is a real `mathagent serve --engine embedded` process on the default model (one
thread each; the two replicas come from `mathagent serve --replicas 2`). Two replicas, one killed with SIGKILL mid-run: the eval finishes on the other
with every (problem, sample) written exactly once. One replica killed with SIGKILL and started
again on its port (issue 20's fault run): the eval waits for it, retries, and loses nothing.
Generations are short and tools off; each test takes 1.5-2 minutes on 2 shared cores, mostly
the model loads (three per test), slow because a fault run needs real servers to kill.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.model]
ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "MATHAGENT_ENGINE__THREADS": "1",
    "MATHAGENT_ENGINE__MAX_SEQ_LEN": "1024",
    "MATHAGENT_AGENT__MAX_TOKENS": "48",
    "MATHAGENT_AGENT__WALL_TIME_S": "300",
    "PYTHONPATH": str(ROOT),
}
LIMIT, SAMPLES = 6, 2


def _free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive ports nothing is bound to, drawn below the kernel's
    ephemeral range (32768 up): a port the kernel hands out could be taken by any client
    socket before a replica binds it (`--replicas 2` binds the port after this one too)."""
    for _ in range(500):
        first = random.randrange(20000, 32000 - count)
        socks = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(socks):
                sock.bind(("127.0.0.1", first + offset))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free ports below the ephemeral range")


class Server:
    """One `mathagent serve --engine embedded` process on a fixed port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        return self.launch().ready()

    def launch(self) -> Server:
        args = ["serve", "--engine", "embedded", "--port", str(self.port)]
        self.proc = subprocess.Popen([sys.executable, "-m", "mathagent", *args], env=ENV)
        return self

    def ready(self) -> Server:
        assert self.proc is not None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the embedded server exited while starting"
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"server on {self.port} not ready")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Servers a test started, stopped after it."""
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()


def _eval(out: Path, urls: list[str]) -> subprocess.Popen:
    args = ["eval", "--dataset", "sample", "--out", str(out), "--no-tools", "--json"]
    args += ["--limit", str(LIMIT), "--samples", str(SAMPLES), "--concurrency", "4"]
    for url in urls:
        args += ["--base-url", url]
    return subprocess.Popen(
        [sys.executable, "-m", "mathagent", *args], env=ENV, stdout=subprocess.PIPE, text=True
    )


def _rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_rows(out: Path, n: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while len(_rows(out)) < n:
        assert proc.poll() is None, "the eval ended before the fault"
        assert time.monotonic() < deadline, "the eval wrote no rows"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen) -> dict:
    stdout, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout
    return json.loads(stdout)


def _assert_all_once(out: Path) -> None:
    keys = Counter((r["id"], r["sample"]) for r in _rows(out))
    assert len(keys) == LIMIT * SAMPLES  # nothing lost
    assert set(keys.values()) == {1}  # nothing duplicated


def _start_replicas(port: int) -> tuple[subprocess.Popen, list[str], list[int]]:
    """`mathagent serve --engine embedded --replicas 2`: the URLs and pids it prints."""
    env = {**ENV, "MATHAGENT_ENGINE__THREADS": "2"}  # one thread each
    args = ["serve", "--engine", "embedded", "--replicas", "2", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mathagent", *args], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    urls, pids = [], []
    for line in proc.stdout:
        if line.startswith("replica "):
            urls.append(line.split()[2])
            pids.append(int(re.search(r"pid (\d+)", line).group(1)))
        if line.startswith("MATHAGENT_BASE_URL="):
            assert line.strip().split("=", 1)[1] == ",".join(urls)
            return proc, urls, pids
    raise AssertionError(f"the replicas did not start ({proc.wait()})")


def test_replica_killed_mid_run_loses_nothing(tmp_path: Path) -> None:
    supervisor, (a, b), (_, b_pid) = _start_replicas(_free_port(2))
    try:
        out = tmp_path / "run"
        proc = _eval(out, [a, b])
        _wait_rows(out, 2, proc)
        os.kill(b_pid, signal.SIGKILL)  # while its share of the 4 samples in flight runs
        summary = _finish(proc)
        _assert_all_once(out)
        assert summary["complete"] and summary["num_failed"] == 0
        by_url = {row["url"]: row for row in summary["replicas"]}
        assert by_url[b]["failures"] >= 1 and not by_url[b]["healthy"]
        assert by_url[a]["failures"] == 0 and by_url[a]["requests"] > 0
        assert sum(row["completion_tokens"] for row in summary["replicas"]) > 0
        # Resume with the dead replica still listed first: nothing redone, nothing added.
        again = _finish(_eval(out, [b, a]))
        _assert_all_once(out)
        assert again["complete"] and all(row["requests"] == 0 for row in again["replicas"])
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=60)
    with pytest.raises(httpx.HTTPError):  # SIGTERM stopped the surviving replica too
        httpx.get(f"{a}/models", timeout=2)


def test_single_server_killed_and_restarted(tmp_path: Path, servers: list[Server]) -> None:
    a = Server(_free_port())
    servers.append(a.start())
    out = tmp_path / "run"
    proc = _eval(out, [a.url])
    _wait_rows(out, 2, proc)
    a.kill()
    time.sleep(1.0)  # the eval sees the server gone (its requests fail, it probes)
    a.start()
    summary = _finish(proc)
    _assert_all_once(out)
    assert summary["complete"] and summary["num_failed"] == 0
    (row,) = summary["replicas"]
    assert row["failures"] >= 1 and row["taken_out"] >= 1 and row["healthy"]
