"""Locked-down Docker sandbox: image, warm pool, in-container worker, HTTP service, client.

``open_sandbox(settings)`` is the one entry point: a :class:`SandboxClient` when
``settings.sandbox_url`` is set, else an in-process :class:`ContainerPool`. Both implement
:class:`Sandbox`::

    async with open_sandbox(Settings()) as sandbox:
        result = await sandbox.execute("x = 6 * 7\\nx", session_id="problem-1")
"""

from __future__ import annotations

from mathagent.config import Settings
from mathagent.sandbox.base import ExecRequest, ExecResult, ExecStatus, Sandbox
from mathagent.sandbox.client import SandboxClient
from mathagent.sandbox.pool import ContainerPool, SandboxBusy, SandboxError

__all__ = [
    "ContainerPool",
    "ExecRequest",
    "ExecResult",
    "ExecStatus",
    "Sandbox",
    "SandboxBusy",
    "SandboxClient",
    "SandboxError",
    "open_sandbox",
]


def open_sandbox(settings: Settings) -> Sandbox:
    """The configured backend: the service at ``sandbox_url``, else a local container pool."""
    if settings.sandbox_url:
        return SandboxClient(settings.sandbox_url)
    return ContainerPool(settings.sandbox)
