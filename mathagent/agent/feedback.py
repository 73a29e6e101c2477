"""What the model reads after its code ran, in the wording of the sandbox it was trained with.

The reference is NeMo-Skills' sandbox of the OpenMathReasoning release (commit 0f7bd733,
``nemo_skills/code_execution/sandbox.py`` and ``local_sandbox/local_sandbox_server.py``), whose
outputs OpenMath-Nemotron was trained on and evaluated against: each stream stripped, cut at
the character limit with ``<output cut>``, ended with one newline, stdout before stderr; a cell
that ran out of time reads ``Timed out`` and nothing else. Tracebacks are the worker's (the
same IPython layout). Fixtures: tests/agent/fixtures/sandbox/nemo_skills_release.json.
"""

from __future__ import annotations

from mathagent.sandbox.base import ExecResult, ExecStatus

OUTPUT_CUT = "<output cut>"
TIMED_OUT = "Timed out\n"


def cut(text: str, limit: int) -> str:
    """Keep the first ``limit`` characters and mark the cut, as NeMo-Skills' sandbox does."""
    # The sandbox may have cut already; cutting again must not stack a second marker.
    body = text.removesuffix(OUTPUT_CUT)
    if len(body) <= limit:
        return text
    return body[:limit] + OUTPUT_CUT


def stream_text(text: str, limit: int, truncated: bool = False) -> str:
    """One stream as the reference fed it back: stripped, cut at ``limit``, one final newline."""
    was_cut = text.endswith(OUTPUT_CUT) or (truncated and len(text) >= limit)
    body = text.removesuffix(OUTPUT_CUT)
    # A text the sandbox cut lost its tail, so only its head can be stripped.
    body = body.lstrip()[:limit] + OUTPUT_CUT if was_cut else cut(body.strip(), limit)
    return body + "\n" if body else ""


def feedback_text(res: ExecResult, max_chars: int) -> str:
    """The text between a format's output tags for one execution result."""
    if res.status == ExecStatus.timeout:
        return TIMED_OUT
    return stream_text(res.stdout, max_chars, res.truncated) + stream_text(
        res.stderr, max_chars, res.truncated
    )
