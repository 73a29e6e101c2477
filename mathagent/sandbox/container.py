"""One locked-down sandbox container and the framed JSON channel to its worker.

The channel is the attach stream of the container's main process (the worker): requests go to
its stdin, replies come back on its stdout, multiplexed by Docker with 8-byte headers. One
connection per container, opened before start and kept for the container's life, so a call
costs two socket writes and reads instead of a ``docker exec``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.types import LogConfig

from mathagent.config import SandboxSettings
from mathagent.sandbox.image import SANDBOX_UID, WORKER_PATH

LABEL = "mathagent.sandbox"
OWNER_LABEL = "mathagent.sandbox.owner"
POOL_LABEL = "mathagent.sandbox.pool"
MAX_REPLY_BYTES = 16 * 1024 * 1024
DIAGNOSTIC_BYTES = 4096
T = TypeVar("T")
log = logging.getLogger(__name__)


class WorkerDied(Exception):
    """The worker process ended (crash, ``os._exit``, out of memory, killed)."""

    def __init__(self, oom_killed: bool, exit_code: int | None, diagnostics: str) -> None:
        self.oom_killed, self.exit_code, self.diagnostics = oom_killed, exit_code, diagnostics
        super().__init__(describe_exit(oom_killed, exit_code))


class WorkerTimeout(Exception):
    """The worker did not answer before the host-side deadline."""


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to create a container: the image and the lock-down settings."""

    image: str
    settings: SandboxSettings
    labels: dict[str, str]

    def create_kwargs(self, api: docker.APIClient) -> dict[str, Any]:
        s = self.settings
        tmpfs_opts = f"rw,noexec,nosuid,nodev,size={s.tmpfs_mb}m,mode=1777"
        host_config = api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": tmpfs_opts},
            shm_size=s.tmpfs_mb * 1024 * 1024,
            mem_limit=s.memory_mb * 1024 * 1024,
            memswap_limit=s.memory_mb * 1024 * 1024,
            pids_limit=s.pids_limit,
            nano_cpus=int(s.cpus * 1e9),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            init=True,
            ipc_mode="private",
            # Replies travel on stdout: the json-file log would copy every one of them to disk.
            log_config=LogConfig(type=LogConfig.types.NONE),
        )
        command = ["python3", "-I", "-u", WORKER_PATH, "--reap", "--preload", s.preload or ""]
        return {
            "image": self.image,
            "command": command,
            "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
            "working_dir": "/tmp",
            "hostname": "sandbox",
            "environment": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HOME": "/tmp"},
            "labels": self.labels,
            # detach=False + stdin_open: Docker closes stdin when our attach ends (StdinOnce),
            # so a worker whose host died reads EOF and exits instead of idling forever.
            "detach": False,
            "stdin_open": True,
            "host_config": host_config,
            "use_config_proxy": False,
        }


class Container:
    """A running sandbox container with its worker's channel open."""

    def __init__(self, api: docker.APIClient, container_id: str) -> None:
        self.api, self.id = api, container_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._keep: object = None
        self._stdout = bytearray()
        self._diagnostics = bytearray()
        self._next_id = 0
        self.dead = False

    @classmethod
    async def start(cls, api: docker.APIClient, spec: ContainerSpec, ready_s: float) -> Container:
        """Create, attach, start, and wait for the worker's ready frame."""
        created = await _thread(lambda: api.create_container(**spec.create_kwargs(api)))
        self = cls(api, created["Id"])
        try:
            await self._attach()
            await _thread(lambda: api.start(self.id))
            hello = await asyncio.wait_for(self._read_message(), ready_s)
            if not hello.get("ready"):
                raise RuntimeError(f"worker sent {hello!r} instead of its ready frame")
        except BaseException:
            await self.destroy()
            raise
        return self

    @property
    def alive(self) -> bool:
        """False once the worker's channel has closed: the container died between calls (its
        Docker daemon restarted, say), so a call sent now could not run."""
        reader = self._reader
        # at_eof() stays False while unread bytes (last words on stderr) wait before the EOF.
        return not self.dead and reader is not None and not getattr(reader, "_eof", False)

    async def _attach(self) -> None:
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        sock = await _thread(lambda: self.api.attach_socket(self.id, params=params))
        raw = getattr(sock, "_sock", sock)
        raw.setblocking(False)
        self._keep = sock  # the SDK's wrapper owns the response; keep it alive with the socket
        self._reader, self._writer = await asyncio.open_connection(sock=raw, limit=2**20)

    async def call(self, request: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply; kill the container past ``deadline_s``."""
        if self.dead or self._writer is None:
            raise await self._died()
        self._next_id += 1
        request = {**request, "id": self._next_id}
        body = json.dumps(request, ensure_ascii=True).encode()
        try:
            self._writer.write(b"%d\n" % len(body) + body)
            reply = await asyncio.wait_for(self._read_message(), deadline_s)
        except TimeoutError:
            await self.destroy()
            raise WorkerTimeout(f"no answer within {deadline_s:g} s") from None
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            raise await self._died() from None
        if reply.get("id") != self._next_id:
            raise await self._died()
        return reply

    async def _read_message(self) -> dict[str, Any]:
        """Next ``<length>\\n<json>`` frame from the worker's stdout."""
        while True:
            newline = self._stdout.find(b"\n")
            if newline > 0:
                size = int(self._stdout[:newline])
                if not 0 < size <= MAX_REPLY_BYTES:
                    raise ValueError(f"bad frame size {size}")
                end = newline + 1 + size
                if len(self._stdout) >= end:
                    body = bytes(self._stdout[newline + 1 : end])
                    del self._stdout[:end]
                    return json.loads(body)
            await self._read_chunk()

    async def _read_chunk(self) -> None:
        assert self._reader is not None
        header = await self._reader.readexactly(8)
        stream, size = struct.unpack(">BxxxL", header)
        payload = await self._reader.readexactly(size)
        if stream == 1:
            self._stdout += payload
        else:  # the worker's own stderr: faulthandler dumps, interpreter errors
            self._diagnostics = (self._diagnostics + payload)[-DIAGNOSTIC_BYTES:]

    async def _died(self) -> WorkerDied:
        """Collect the exit state (OOM kill, exit code) of a worker that stopped answering."""
        self.dead = True
        if self._reader is not None:  # the dying worker's last words on stderr
            try:
                while True:
                    await asyncio.wait_for(self._read_chunk(), 0.2)
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                pass
        try:
            code = (await _thread(lambda: self.api.wait(self.id, timeout=10)))["StatusCode"]
            state = (await _thread(lambda: self.api.inspect_container(self.id)))["State"]
            oom = bool(state.get("OOMKilled"))
        except Exception:
            code, oom = None, False
        return WorkerDied(oom, code, self._diagnostics.decode("utf-8", "replace"))

    async def destroy(self) -> None:
        """Kill and remove the container (idempotent, never raises)."""
        self.dead = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        try:
            await _thread(lambda: _remove(self.api, self.id))
        except Exception as exc:  # left for the orphan sweep of the next pool start
            log.warning("could not remove sandbox container %s: %s", self.id[:12], exc)


def describe_exit(oom_killed: bool, exit_code: int | None) -> str:
    """A one-line reason for a worker's death, for the cell's stderr."""
    if oom_killed:
        return f"the sandbox ran out of memory and was killed (exit code {exit_code})"
    if exit_code is not None and exit_code > 128:
        return f"the sandbox process was killed by signal {exit_code - 128}"
    return f"the sandbox process exited with code {exit_code}"


async def _thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


def owner_id(pid: int) -> str:
    """``host:pid:start-time`` of a process: names the owner of a container across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        start = stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{socket.gethostname()}:{pid}:{start}"


def _remove(api: docker.APIClient, container_id: str) -> None:
    """Force-remove; a container already gone or already being removed counts as removed."""
    try:
        api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise


def remove_labelled(client: docker.DockerClient, key: str, value: str) -> None:
    """Remove every container labelled ``key=value``."""
    for info in client.api.containers(all=True, filters={"label": f"{key}={value}"}):
        _remove(client.api, info["Id"])


def remove_orphans(client: docker.DockerClient) -> int:
    """Remove sandbox containers whose owning process on this host is gone; returns the count."""
    host = socket.gethostname()
    removed = 0
    for info in client.api.containers(all=True, filters={"label": LABEL}):
        owner = info.get("Labels", {}).get(OWNER_LABEL, "")
        owner_host, _, pid = owner.partition(":")
        pid = pid.split(":")[0]
        if owner_host != host or not pid.isdigit() or owner_id(int(pid)) == owner:
            continue
        _remove(client.api, info["Id"])
        removed += 1
    return removed
