"""Sandbox speed: warm-call latency, throughput, new-session latency; prints one JSON object.

Reference measured in the same run: p50 of spawning ``python3 -c pass`` on the host (the cost of
the naive "one process per cell" sandbox). Goals: warm ``print(1)`` p50 <= 0.5x that spawn;
>= 50 executions/s at concurrency 8; new-session p50 <= 50 ms while warm containers exist.

    python benchmarks/sandbox_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from mathagent.config import SandboxSettings
from mathagent.sandbox import ContainerPool
from mathagent.sandbox.image import build_image

SYMPY_CELL = (
    "import sympy as sp\n"
    "x = sp.symbols('x')\n"
    "(sp.factor(x**{k} - 1), sp.solve(x**2 - {k}*x + 1, x),\n"
    " sp.integrate(x**3 * sp.exp({k}*x), x), sp.factorint(2**{k2} - 1))"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def host_spawn(n: int) -> tuple[str, list[float]]:
    """``python3 -c pass`` on the host: the system interpreter, not a pyenv shim script."""
    exe = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([exe, "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return exe, times


async def wait_warm(pool: ContainerPool, want: int, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while pool.stats()["warm"] < want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # let the last start's CPU settle


async def timed(pool: ContainerPool, code: str, session: str | None) -> float:
    start = time.perf_counter()
    result = await pool.execute(code, session_id=session, timeout=60)
    if result.status != "completed":
        raise RuntimeError(f"benchmark cell failed: {result}")
    return time.perf_counter() - start


async def throughput(pool: ContainerPool, concurrency: int, calls: int) -> float:
    sessions = [f"bench-c{concurrency}-{i}" for i in range(concurrency)]
    await asyncio.gather(*(pool.execute("1", session_id=s, timeout=120) for s in sessions))
    per = max(1, calls // concurrency)

    async def loop(session: str) -> None:
        for _ in range(per):
            await pool.execute("print(1)", session_id=session)

    start = time.perf_counter()
    await asyncio.gather(*(loop(s) for s in sessions))
    rate = per * concurrency / (time.perf_counter() - start)
    for s in sessions:
        await pool.close_session(s)
    return rate


async def bench(settings: SandboxSettings, quick: bool) -> dict:
    n = 100 if quick else 500
    async with ContainerPool(settings) as pool:
        await wait_warm(pool, settings.pool_size)
        for _ in range(20):
            await timed(pool, "print(1)", "bench-warm")
        print1 = [await timed(pool, "print(1)", "bench-warm") for _ in range(n)]
        sympy_runs = [
            await timed(pool, SYMPY_CELL.format(k=12 + i, k2=60 + i), "bench-warm")
            for i in range(5 if quick else 15)
        ]
        await pool.close_session("bench-warm")

        new_session = []
        for _ in range(5 if quick else 15):
            await wait_warm(pool, settings.pool_size)
            start = time.perf_counter()
            result = await pool.execute("print(1)")
            new_session.append(time.perf_counter() - start)
            await pool.close_session(result.session_id)

        rates = {}
        for concurrency in (1, 8, 32):
            await wait_warm(pool, settings.pool_size)
            rates[concurrency] = await throughput(pool, concurrency, 100 if quick else 400)
    return {
        "print1_p50_ms": ms(pct(print1, 0.5)),
        "print1_p99_ms": ms(pct(print1, 0.99)),
        "sympy_cell_p50_ms": ms(statistics.median(sympy_runs)),
        "exec_per_s": {f"c{c}": round(r, 1) for c, r in rates.items()},
        "new_session_p50_ms": ms(pct(new_session, 0.5)),
        "new_session_max_ms": ms(max(new_session)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    settings = SandboxSettings(pool_size=8)
    build_image(settings)
    exe, spawn = host_spawn(15 if args.quick else 40)
    results = asyncio.run(bench(settings, args.quick))
    spawn_p50 = pct(spawn, 0.5)
    out = {
        "host_spawn": {"cmd": f"{exe} -c pass", "p50_ms": ms(spawn_p50)},
        **results,
        "print1_over_spawn": round(results["print1_p50_ms"] / ms(spawn_p50), 4),
        "settings": settings.model_dump(
            include={"pool_size", "memory_mb", "pids_limit", "cpus", "preload"}
        ),
        "cpus_on_host": os.cpu_count(),
        "goals": {
            "print1_p50_le_half_spawn": results["print1_p50_ms"] <= 0.5 * ms(spawn_p50),
            "exec_per_s_c8_ge_50": results["exec_per_s"]["c8"] >= 50,
            "new_session_p50_le_50ms": results["new_session_p50_ms"] <= 50,
        },
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
