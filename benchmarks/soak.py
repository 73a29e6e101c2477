"""Soak and fault runs over the real services on loopback; prints one JSON object.

- ``sandbox``: EXECUTIONS cells over SESSIONS concurrent sessions of ``mathagent sandbox serve``
  (short cells with timeouts, memory errors, crashes, out-of-memory kills and output floods
  mixed in): executions/s, p50/p99 latency, 5xx, this service's containers (by its owner
  label) and its memory before and after.
- ``solve_api`` / ``openai_server``: HOSTILE malformed or hostile requests each against
  ``mathagent api`` and ``mathagent serve`` (embedded engine, default model): 5xx, every
  oversized body answered 413 before it is read whole, health and a normal request's time
  before and after.
- ``faults``: rows of :mod:`benchmarks.faults` (kill -9 the sandbox service during an eval,
  restart the Docker daemon during a session, results disk full).

Every part is bounded (counts, per-request timeouts, ``--time-limit`` for the whole run) and
stops by itself. Timings: run under ``flock /tmp/mathagent-bench.lock``.

    python benchmarks/soak.py [--executions 10000 --sessions 64 --hostile 1000]
                              [--parts sandbox,solve_api,openai_server,faults]
                              [--faults kill_sandbox,docker_restart,disk_full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.*, tests.* helpers

from benchmarks import faults
from benchmarks.hostile import Target, storm
from mathagent.sandbox.container import owner_id

# (share, cell, timeout s): the mix every session draws from.
MIX = [
    (0.897, "x = {k}\nx * 2 + 1", 10.0),
    (0.03, "print('flood ' * 100000)", 10.0),
    (0.02, "while True:\n    pass", 0.5),
    (0.02, "b = bytearray(4 * 1024**3)", 10.0),
    (0.02, "raise ValueError('soak {k}')", 10.0),
    (0.01, "import os\nos._exit(3)", 10.0),
    (0.003, "chunks = []\nwhile True:\n    chunks.append(b'x' * 2**24)", 20.0),
]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _drive(url: str, executions: int, sessions: int, seed: int) -> dict:
    rng = random.Random(seed)
    plan = rng.choices(range(len(MIX)), weights=[m[0] for m in MIX], k=executions)
    latencies, statuses, http_codes = [], {}, {}
    queue = list(enumerate(plan))

    async def session(http: httpx.AsyncClient, sid: str) -> None:
        while queue:
            k, which = queue.pop()
            _, cell, timeout = MIX[which]
            body = {"code": cell.format(k=k), "session_id": sid, "timeout": timeout}
            t0 = time.perf_counter()
            try:
                r = await http.post(f"{url}/execute", json=body, timeout=timeout + 60)
                code = r.status_code
                status = r.json().get("status", "?") if code == 200 else f"http {code}"
            except httpx.HTTPError as exc:
                code, status = 0, f"client {type(exc).__name__}"
            latencies.append(time.perf_counter() - t0)
            http_codes[code] = http_codes.get(code, 0) + 1
            statuses[status] = statuses.get(status, 0) + 1

    started = time.perf_counter()
    limits = httpx.Limits(max_connections=sessions + 8)
    async with httpx.AsyncClient(limits=limits) as http:
        await asyncio.gather(*(session(http, f"soak-{i}") for i in range(sessions)))
        await asyncio.gather(*(http.delete(f"{url}/sessions/soak-{i}") for i in range(sessions)))
    wall = time.perf_counter() - started
    return {
        "executions": executions,
        "sessions": sessions,
        "seconds": round(wall, 1),
        "executions_per_s": round(executions / wall, 1),
        "latency_p50_ms": round(pct(latencies, 0.5) * 1000, 1),
        "latency_p99_ms": round(pct(latencies, 0.99) * 1000, 1),
        "5xx": sum(n for c, n in http_codes.items() if c >= 500),
        "http": {str(c): n for c, n in sorted(http_codes.items())},
        "results": dict(sorted(statuses.items())),
    }


def sandbox_soak(executions: int, sessions: int, seed: int) -> dict:
    """The load on one ``mathagent sandbox serve``; containers counted by its owner label."""
    port = faults.free_port()
    service = faults.start_service(port, MATHAGENT_SANDBOX__MAX_SESSIONS=str(sessions))
    owner = owner_id(service.pid)
    try:
        time.sleep(3)  # the warm pool fills
        before = {"containers": faults.owned_containers(owner), "rss_mb": rss_mb(service.pid)}
        row = asyncio.run(_drive(f"http://127.0.0.1:{port}", executions, sessions, seed))
        time.sleep(2)  # closed sessions' containers are removed in the background
        after = {"containers": faults.owned_containers(owner), "rss_mb": rss_mb(service.pid)}
    finally:
        faults.stop_service(service)
    stopped = faults.owned_containers(owner)
    return {**row, "before": before, "after_load": after, "containers_after_stop": stopped}


def _start(argv: list[str], env: dict[str, str], health: str, log: Path, timeout_s: float = 300):
    """``mathagent ARGV`` once healthy; its stderr goes to ``log`` (a 5xx row quotes it)."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mathagent", *argv],
            env={**os.environ, "PYTHONPATH": str(faults.ROOT), **env},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mathagent {argv[0]} exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(health, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mathagent {argv[0]} was not healthy within {timeout_s:g} s")


def _normal_s(url: str, body: dict, headers: dict) -> float:
    """Median seconds of three normal requests (each must answer 200)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = httpx.post(url, json=body, headers=headers, timeout=120)
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def hostile_row(
    target: Target, proc, log: Path, count: int, normal: tuple[str, dict, dict], seed: int
) -> dict:
    """Normal request time, the storm, then health and the normal request again; with any 5xx,
    the last lines of the server's stderr (its traceback)."""
    url, body, headers = normal
    before_s, rss_before = _normal_s(url, body, headers), rss_mb(proc.pid)
    row = asyncio.run(storm(target, count, seed=seed))
    health = httpx.get(f"http://127.0.0.1:{target.port}/health", timeout=10).status_code
    after_s = _normal_s(url, body, headers)
    tail = log.read_text(errors="replace").splitlines()[-40:] if row["5xx"] else []
    return {
        **row,
        **({"server_log_tail": tail} if tail else {}),
        "healthy_after": health == 200 and proc.poll() is None,
        "normal_request_before_s": round(before_s, 3),
        "normal_request_after_s": round(after_s, 3),
        "normal_within_usual_time": after_s <= 2 * before_s + 0.5,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_mb(proc.pid),
    }


def services_rows(count: int, seed: int, parts: set[str]) -> dict:
    """The embedded server and a /solve API over it, each stormed with ``count`` requests."""
    from mathagent.serving.openai_server import body_limit

    rows: dict = {}
    llm_port, api_port, key = faults.free_port(), faults.free_port(), "soak-key"
    env = {"MATHAGENT_ENGINE__THREADS": "1", "MATHAGENT_SANDBOX__POOL_SIZE": "1",
           "MATHAGENT_SANDBOX__PRELOAD": ""}  # fmt: skip
    logs = Path(tempfile.mkdtemp(prefix="mathagent-soak-"))
    llm_log, api_log = logs / "serve.log", logs / "api.log"
    llm_health = f"http://127.0.0.1:{llm_port}/health"
    llm = _start(["serve", "--port", str(llm_port)], env, llm_health, llm_log)
    try:
        if "openai_server" in parts:
            valid = {"prompt": "1 + 1 =", "max_tokens": 4, "temperature": 0}
            target = Target("openai_server", llm_port, ["/v1/completions", "/v1/chat/completions"],
                            valid, body_limit(4096), None, {**valid, "stream": True,
                            "max_tokens": 64})  # fmt: skip
            normal = (f"http://127.0.0.1:{llm_port}/v1/completions", valid, {})
            rows["openai_server"] = hostile_row(target, llm, llm_log, count, normal, seed)
        if "solve_api" in parts:
            api_env = {**env, "MATHAGENT_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
                       "MATHAGENT_API_KEY": key}  # fmt: skip
            health = f"http://127.0.0.1:{api_port}/health"
            api = _start(["api", "--port", str(api_port)], api_env, health, api_log)
            try:
                valid = {"problem": "What is 2 + 3?", "tools": False, "max_tokens": 16}
                limit = 4 * 20_000 + 64 * 1024
                target = Target("solve_api", api_port, ["/solve", "/solve/stream"], valid,
                                limit, key, valid)  # fmt: skip
                auth = {"Authorization": f"Bearer {key}"}
                normal = (f"http://127.0.0.1:{api_port}/solve", valid, auth)
                rows["solve_api"] = hostile_row(target, api, api_log, count, normal, seed + 1)
            finally:
                api.send_signal(signal.SIGTERM)
                api.wait(60)
    finally:
        llm.send_signal(signal.SIGTERM)
        llm.wait(60)
        shutil.rmtree(logs, ignore_errors=True)
    return rows


FAULTS = {
    "kill_sandbox": faults.kill_sandbox_during_eval,
    "docker_restart": faults.docker_restart_during_session,
    "disk_full": faults.disk_full_during_eval,
}


def _progress(part: str, row: dict) -> dict:
    """Each part's row on stderr as it ends, so a run stopped later keeps what it measured."""
    print(json.dumps({part: row}), file=sys.stderr, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executions", type=int, default=10_000)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--hostile", type=int, default=1000)
    ap.add_argument("--parts", default="sandbox,solve_api,openai_server,faults")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=3600, help="seconds for the whole run")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, lambda *_: sys.exit("soak: over --time-limit, stopped"))
    signal.alarm(int(args.time_limit))
    parts, started = set(args.parts.split(",")), time.monotonic()
    out: dict = {"command": " ".join(sys.argv), "cpus": os.cpu_count()}
    # Faults first: the shortest part, and the one whose rows CI's tests assert on.
    if "faults" in parts:
        with tempfile.TemporaryDirectory(prefix="mathagent-soak-") as work:
            out["faults"] = [
                _progress(name, FAULTS[name](Path(work) / name))
                for name in args.faults.split(",")
                if name
            ]
    if "sandbox" in parts:
        out["sandbox"] = _progress(
            "sandbox", sandbox_soak(args.executions, args.sessions, args.seed)
        )
    if parts & {"solve_api", "openai_server"}:
        out.update(_progress("services", services_rows(args.hostile, args.seed, parts)))
    out["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
