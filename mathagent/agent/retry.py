"""The one backoff rule of the agent's retries (model endpoint and sandbox alike)."""

from __future__ import annotations

import asyncio


async def wait_to_retry(attempt: int, base_s: float, deadline: float) -> bool:
    """Sleep before retry number ``attempt`` (1, 2, ...): ``base_s`` doubling each time.

    Returns False at once, without sleeping, when the wait would end past ``deadline``
    (event-loop time): the caller gives up instead.
    """
    delay = base_s * 2 ** (attempt - 1)
    if asyncio.get_running_loop().time() + delay >= deadline:
        return False
    await asyncio.sleep(delay)
    return True
