"""Session ids minted by a pool, so a restarted service can tell a lost session from a new one.

A client may name its own session id, and then an unknown id is simply a new session. An id the
service minted itself carries the minting pool's instance tag: when such an id arrives at a pool
with another tag, the service that held it has restarted since, its variables are gone, and the
call must say ``state_lost`` (the agent then restores the session by replay) instead of
pretending the session is fresh.
"""

from __future__ import annotations

import re
import uuid

_MINTED = re.compile(r"^([0-9a-f]{12})\.[0-9a-f]{32}$")


class SessionIds:
    """Mints ids tagged with this instance and recognises ids minted by another instance."""

    def __init__(self) -> None:
        self.instance = uuid.uuid4().hex[:12]

    def mint(self) -> str:
        return f"{self.instance}.{uuid.uuid4().hex}"

    def minted_elsewhere(self, session_id: str) -> bool:
        match = _MINTED.match(session_id)
        return match is not None and match.group(1) != self.instance
