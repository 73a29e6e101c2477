"""``mathagent serve --engine embedded --replicas N``: N embedded servers, one per GPU.

Each replica is its own ``mathagent serve --engine embedded`` process on a consecutive port: on
CUDA with ``CUDA_VISIBLE_DEVICES`` naming one visible GPU each; on CPU with the torch threads
split between them (``MATHAGENT_ENGINE__THREADS``). The URLs are printed once every replica
answers ``GET /v1/models``, with a ``MATHAGENT_BASE_URL`` line to paste; Ctrl-C or SIGTERM
stops them all. A replica that exits is reported and the others go on serving.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

READY_POLL_S = 0.5


class ReplicaError(RuntimeError):
    """The replicas cannot be started as asked."""


@dataclass
class ReplicaPlan:
    """What to start: one command line and environment per replica."""

    host: str
    first_port: int
    replicas: int
    device: str  # "cuda" or "cpu"
    gpus: list[str] = field(default_factory=list)  # visible GPU ids, one per replica (CUDA)
    threads: int = 1  # torch threads per replica (CPU)
    extra_args: list[str] = field(default_factory=list)  # --model / --speculative passed on

    def urls(self) -> list[str]:
        """Each replica's OpenAI root."""
        return [f"http://{self.host}:{self.first_port + i}/v1" for i in range(self.replicas)]

    def command(self, i: int) -> list[str]:
        port = str(self.first_port + i)
        args = ["serve", "--engine", "embedded", "--host", self.host, "--port", port]
        return [sys.executable, "-m", "mathagent", *args, *self.extra_args]

    def own_env(self, i: int) -> dict[str, str]:
        """What replica ``i`` gets on top of this process's environment."""
        if self.device == "cuda":
            return {"CUDA_VISIBLE_DEVICES": self.gpus[i]}
        return {"MATHAGENT_ENGINE__THREADS": str(self.threads)}

    def shown(self, i: int) -> str:
        """Replica ``i``'s command line as a shell would take it."""
        own = " ".join(f"{k}={v}" for k, v in self.own_env(i).items())
        return f"{own} {shlex.join(self.command(i))}"


def plan_replicas(
    replicas: int,
    host: str,
    first_port: int,
    device: str,
    threads: int | None,
    extra_args: list[str],
    gpus: list[str] | None = None,
) -> ReplicaPlan:
    """One replica per visible GPU (CUDA) or an equal share of the CPU threads each.

    ``device`` is the engine setting (``auto``, ``cpu``, ``cuda[:N]``); ``threads`` the user's
    thread setting (unset: every core); ``gpus`` the GPU ids to hand out (unset: the visible
    ones).
    """
    if replicas < 1:
        raise ReplicaError("--replicas wants at least 1")
    if device == "cpu":
        gpus = []
    elif gpus is None:
        gpus = _visible_gpus()
    if device.startswith("cuda") and not gpus:
        raise ReplicaError("no CUDA GPU is visible")
    if gpus:
        if replicas > len(gpus):
            raise ReplicaError(f"{replicas} replicas but {len(gpus)} visible GPUs ({gpus})")
        return ReplicaPlan(host, first_port, replicas, "cuda", gpus[:replicas], 1, extra_args)
    share = max(1, (threads or os.cpu_count() or 1) // replicas)
    return ReplicaPlan(host, first_port, replicas, "cpu", [], share, extra_args)


def _visible_gpus() -> list[str]:
    """The GPU ids this process may hand out: those ``CUDA_VISIBLE_DEVICES`` names, else 0..N-1."""
    import torch

    if not torch.cuda.is_available():
        return []
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:  # ids as the user named them (indices or UUIDs)
        return [g.strip() for g in named.split(",") if g.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def run_replicas(plan: ReplicaPlan, echo: Callable[[str], None], timeout_s: float = 600) -> int:
    """Start every replica, print their URLs when ready, wait; stop all on a signal.

    Returns the exit status: 0 after a signal, 1 when the replicas failed to start or all died.
    """
    procs = [
        subprocess.Popen(plan.command(i), env={**os.environ, **plan.own_env(i)})
        for i in range(plan.replicas)
    ]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not _wait_ready(plan, procs, timeout_s, lambda: stopping):
            return 0 if stopping else 1
        for i, url in enumerate(plan.urls()):
            where = (
                f"GPU {plan.gpus[i]}" if plan.device == "cuda" else f"CPU, {plan.threads} thread(s)"
            )
            echo(f"replica {i}: {url} ({where}, pid {procs[i].pid})")
        echo(f"MATHAGENT_BASE_URL={','.join(plan.urls())}")
        return _supervise(procs, lambda: stopping, echo)
    finally:
        _stop_all(procs)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_ready(
    plan: ReplicaPlan, procs: list[subprocess.Popen], timeout_s: float, stopped: Callable
) -> bool:
    deadline = time.monotonic() + timeout_s
    pending = set(range(plan.replicas))
    while pending and not stopped():
        for i in list(pending):
            if procs[i].poll() is not None:
                raise ReplicaError(f"replica {i} exited with status {procs[i].returncode}")
            try:
                if httpx.get(f"{plan.urls()[i]}/models", timeout=2).status_code == 200:
                    pending.discard(i)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise ReplicaError(f"replicas {sorted(pending)} not ready after {timeout_s:g} s")
        if pending:
            time.sleep(READY_POLL_S)
    return not pending


def _supervise(procs: list[subprocess.Popen], stopped: Callable, echo: Callable) -> int:
    reported: set[int] = set()
    while not stopped():
        for i, proc in enumerate(procs):
            if proc.poll() is not None and i not in reported:
                reported.add(i)
                echo(f"replica {i} exited with status {proc.returncode}")
        if len(reported) == len(procs):
            return 1
        time.sleep(READY_POLL_S)
    return 0


def _stop_all(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
