"""Error responses that can carry any client input without failing to encode (a 500).

A hostile body may hold what JSON text allows but UTF-8 and strict JSON do not: a lone
surrogate (``"\\ud800"``, or the bytes ``ED A0 80``, which Python's ``json.loads`` accepts) or
``NaN`` / ``Infinity``. Echoed back in an error, either makes Starlette's ``JSONResponse`` raise
while rendering, and the client gets a 500 for bad input. Every service renders its errors
with :class:`SafeJSONResponse`; validation errors leave the input out altogether.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped (lone surrogates included) and non-finite floats as text."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(_finite(content), ensure_ascii=True, allow_nan=False, default=str)
        return text.encode("ascii")


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic's errors without the offending input (never echoed) or its context."""
    return [{"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")}
            for e in errors]  # fmt: skip
