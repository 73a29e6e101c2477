"""Fault runs across parts, each returning one row of the soak JSON (tests assert on the rows).

- ``kill_sandbox_during_eval``: a real ``mathagent eval`` (a scripted tool-calling OpenAI
  server, the real agent, the real sandbox service) while the service is killed with SIGKILL
  and started again on the same port.
- ``docker_restart_during_session``: the Docker daemon restarts between two calls of a session.
- ``disk_full_during_eval``: the results folder is a small tmpfs that fills mid-run.

Loopback only; every run is bounded in time and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import docker
import httpx

from mathagent.agent.result import SampleResult
from mathagent.evals.datasets import Problem
from mathagent.evals.results import RESULTS_FILE, ResultsError
from mathagent.evals.runner import EvalConfig, run_eval
from mathagent.sandbox.container import OWNER_LABEL, owner_id

ROOT = Path(__file__).resolve().parents[1]
SERVICE_ENV = {
    "MATHAGENT_SANDBOX__POOL_SIZE": "2",
    "MATHAGENT_SANDBOX__PRELOAD": "",
    "MATHAGENT_SANDBOX__MEMORY_MB": "256",
    "PYTHONPATH": str(ROOT),
}
# The cell each scripted tool call runs: slow enough that calls are in flight at the kill.
TOOL_CELL = "import time\ntime.sleep(0.3)\nprint({i} + {i})"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(port: int, **env: str) -> subprocess.Popen:
    """``mathagent sandbox serve`` on ``port`` (loopback), healthy when this returns."""
    argv = [sys.executable, "-m", "mathagent", "sandbox", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **SERVICE_ENV, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandbox serve exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("sandbox serve did not become healthy within 120 s")


def stop_service(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def owned_containers(owner: str) -> int:
    """Containers (running or not) labelled as owned by ``owner`` (``owner_id(pid)``)."""
    api = docker.from_env().api
    return len(api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"}))


def exactly_once(records: list[dict], expected: set[tuple[str, int]]) -> dict[str, int]:
    """Counts of expected samples lost, and of samples recorded more than once."""
    keys = Counter((str(r["id"]), int(r["sample"])) for r in records)
    return {
        "samples_expected": len(expected),
        "samples_recorded": sum(keys.values()),
        "lost": len(expected - set(keys)),
        "duplicated": sum(n - 1 for n in keys.values() if n > 1),
    }


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _dataset(work: Path, count: int) -> Path:
    path = work / "problems.jsonl"
    rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def kill_sandbox_during_eval(work: Path, problems: int = 24, concurrency: int = 4) -> dict:
    """SIGKILL the sandbox service mid-eval, start it again; the same eval run finishes.

    The agent retries sandbox calls with backoff (``MATHAGENT_AGENT__RETRIES=8``: up to about
    two minutes), so the run outlives the outage; the restarted service's pool start removes
    the containers the dead process owned.
    """
    from tests.evals.fake_openai import serve as fake_openai

    started = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    port, out = free_port(), work / "eval"
    dataset = _dataset(work, problems)
    service = start_service(port)
    dead_owner = owner_id(service.pid)
    with fake_openai(tool_cell=TOOL_CELL) as llm_url:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MATHAGENT_AGENT__RETRIES": "8",
               "MATHAGENT_SANDBOX_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
        argv = [sys.executable, "-m", "mathagent", "eval", "--dataset", str(dataset),
                "--out", str(out), "--base-url", llm_url, "--concurrency", str(concurrency),
                "--json"]  # fmt: skip
        run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        results = out / RESULTS_FILE
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            if results.exists() and len(read_records(results)) >= problems // 4:
                break
            time.sleep(0.05)
        done_at_kill = len(read_records(results)) if results.exists() else 0
        service.kill()
        service.wait(10)
        left_by_dead = owned_containers(dead_owner)
        time.sleep(1.0)  # the outage: calls in flight fail, new ones are refused
        service = start_service(port)
        dead_left_after_restart = owned_containers(dead_owner)
        try:
            stdout, stderr = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
            new_owner = owner_id(service.pid)
            stop_service(service)
    summary = json.loads(stdout) if run.returncode == 0 else {}
    expected = {(f"p{i}", 0) for i in range(problems)}
    return {
        "fault": "kill -9 the sandbox service during an eval",
        "eval_exit_code": run.returncode,
        "eval_error": stderr.decode(errors="replace")[-500:] if run.returncode else None,
        "records_at_kill": done_at_kill,
        "dead_service_containers_at_kill": left_by_dead,
        "dead_service_containers_after_restart": dead_left_after_restart,
        "restarted_service_containers_after_stop": owned_containers(new_owner),
        "complete": bool(summary.get("complete")),
        "correct": summary.get("pass@1"),
        **exactly_once(read_records(out / RESULTS_FILE), expected),
        "seconds": round(time.monotonic() - started, 1),
    }


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (its parent, PID 1 here, may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def restart_docker(timeout_s: float = 90) -> float:
    """Stop dockerd (SIGTERM, as a service manager does) and start it again; seconds down."""
    pid = int(Path("/var/run/docker.pid").read_text())
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while _running(pid):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError("dockerd did not stop")
        time.sleep(0.2)
    with open("/var/log/mathagent-dockerd.log", "ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    while True:
        try:
            docker.from_env().ping()
            return time.monotonic() - started
        except docker.errors.DockerException:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError("dockerd did not come back") from None
            time.sleep(0.5)


def docker_restart_during_session(work: Path) -> dict:
    """A session's container dies with its daemon: the next call says ``state_lost`` and runs."""
    started = time.monotonic()
    port = free_port()
    service = start_service(port)
    owner = owner_id(service.pid)
    url = f"http://127.0.0.1:{port}/execute"
    try:
        with httpx.Client(timeout=120) as http:
            before = http.post(url, json={"code": "x = 41", "session_id": "restart"}).json()
            down_s = restart_docker()
            after = http.post(url, json={"code": "print('back')", "session_id": "restart"})
            again = http.post(url, json={"code": "y = 2\ny", "session_id": "restart"}).json()
    finally:
        stop_service(service)
    body = after.json()
    return {
        "fault": "restart the Docker daemon during a session",
        "docker_down_s": round(down_s, 1),
        "before": before["status"],
        "next_call_http": after.status_code,
        "next_call_status": body.get("status"),
        "next_call_stdout": body.get("stdout"),
        "next_call_state_lost": body.get("state_lost"),
        "then_status": again["status"],
        "then_state_lost": again["state_lost"],
        "service_containers_after_stop": owned_containers(owner),
        "seconds": round(time.monotonic() - started, 1),
    }


async def _scripted(problem: Problem, sample: int) -> SampleResult:
    await asyncio.sleep(0.01 * (sample + 1))  # workers in flight when the disk fills
    # ~2.3 KiB per record: a 64 KiB disk fills after about 25 records.
    return SampleResult(answer=problem.answer, generation="x" * 2000, num_generated_tokens=3)


def disk_full_during_eval(work: Path, problems: int = 30, samples: int = 2) -> dict:
    """Results on a 64 KiB tmpfs (needs root): fails clearly, twice, then resumes at 4 MiB."""
    disk = work / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    started = time.monotonic()
    items = [Problem(f"p{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(problems)]
    config = EvalConfig(disk / "run", samples=samples, concurrency=4, progress=False)
    results = disk / "run" / RESULTS_FILE
    errors, whole = [], []
    try:
        for _ in range(2):
            try:
                asyncio.run(run_eval(items, _scripted, config))
            except ResultsError as exc:
                errors.append(str(exc))
            whole.append(results.read_bytes().endswith(b"\n"))
        kept = len(read_records(results))
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        summary = asyncio.run(run_eval(items, _scripted, config))
        records = read_records(results)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    expected = {(p.id, s) for p in items for s in range(samples)}
    return {
        "fault": "results disk full (64 KiB tmpfs), then space",
        "errors": errors,
        "no_torn_line": all(whole),
        "records_when_full": kept,
        "complete_after_space": bool(summary["complete"]),
        **exactly_once(records, expected),
        "seconds": round(time.monotonic() - started, 1),
    }
