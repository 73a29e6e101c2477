"""The one backoff rule of the agent's retries (model endpoint, replica probes and sandbox)."""

from __future__ import annotations

import asyncio
import math


async def wait_to_retry(
    attempt: int, base_s: float, deadline: float, max_s: float = math.inf
) -> bool:
    """Sleep before retry number ``attempt`` (1, 2, ...): ``base_s`` doubling each time, at
    most ``max_s``.

    Returns False at once, without sleeping, when the wait would end past ``deadline``
    (event-loop time): the caller gives up instead.
    """
    delay = min(base_s * 2 ** (attempt - 1), max_s)
    if asyncio.get_running_loop().time() + delay >= deadline:
        return False
    await asyncio.sleep(delay)
    return True
