"""The HTTP backend: a client of ``mathagent sandbox serve`` implementing :class:`Sandbox`."""

from __future__ import annotations

import httpx

from mathagent.sandbox.base import ExecRequest, ExecResult, Sandbox
from mathagent.sandbox.pool import SandboxBusy, SandboxError

# Slack over the cell's own time limit: the service adds its kill grace and container restarts.
HTTP_SLACK_S = 30.0


class SandboxClient(Sandbox):
    """Runs cells through a sandbox service at ``base_url`` (e.g. ``http://127.0.0.1:6000``)."""

    def __init__(self, base_url: str, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            transport=transport,
            timeout=httpx.Timeout(HTTP_SLACK_S),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def execute_request(self, req: ExecRequest) -> ExecResult:
        try:
            response = await self._http.post(
                "/execute",
                json=req.model_dump(mode="json"),
                timeout=float(req.timeout) + HTTP_SLACK_S,
            )
        except httpx.HTTPError as exc:
            raise SandboxError(f"sandbox service unreachable: {exc!r}") from exc
        _raise_for_status(response)
        return ExecResult.model_validate(response.json())

    async def close_session(self, session_id: str) -> None:
        try:
            response = await self._http.delete(f"/sessions/{session_id}")
        except httpx.HTTPError as exc:
            raise SandboxError(f"sandbox service unreachable: {exc!r}") from exc
        _raise_for_status(response)

    async def health(self) -> dict:
        """The service's ``GET /health`` answer."""
        response = await self._http.get("/health")
        _raise_for_status(response)
        return response.json()

    async def aclose(self) -> None:
        await self._http.aclose()


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    message = f"sandbox service answered {response.status_code}: {detail}"
    if response.status_code == 429:
        raise SandboxBusy(message)
    if response.status_code < 500:
        raise ValueError(message)
    raise SandboxError(message)
