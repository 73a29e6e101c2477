"""One sample of a results.jsonl row as HTML, the way the terminal shows a solve.

Model text plain, code highlighted (pygments, on the server side: the page loads nothing),
each execution's output in a box titled like the terminal's panel (status, seconds), green when
it completed and red otherwise. The row's ``segments`` say which runs of ``generation`` are
text, code and output; rows written before segments existed show the generation as text and
their calls after it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from mathagent.agent.result import Segment, ToolCall
from mathagent.agent.transcript import output_body, output_title

_FORMATTER = HtmlFormatter(nowrap=True)
_LEXER = PythonLexer()


def answer_html(record: Mapping[str, Any]) -> str:
    """The sample's answer, or a marked "no answer" (never the word None)."""
    answer = record.get("predicted_answer")
    if answer is None or not str(answer).strip():
        return "<span class='answer noans'>no answer</span>"
    kind = "ok" if record.get("is_correct") else "bad"
    return f"<span class='answer {kind}'>{html.escape(str(answer))}</span>"


def sample_html(record: Mapping[str, Any], where: str) -> str:
    """A collapsible sample: a one-line header, then its transcript."""
    kind = "ok" if record.get("is_correct") else "bad"
    calls = record.get("tool_calls") or []
    facts = [
        "correct" if record.get("is_correct") else "wrong",
        f"{record.get('finish_reason') or 'finished'}",
        f"{record.get('num_generated_tokens', 0)} tokens",
        f"{len(calls)} tool calls",
        f"{float(record.get('latency_s') or 0):.1f} s",
    ]
    error = record.get("error")
    if error:
        facts.append(f"error: {error}")
    head = f"sample {int(record['sample'])} · answer {answer_html(record)} · " + html.escape(
        " · ".join(facts)
    )
    body = transcript_html(record)
    return (
        f"<details class='sample {kind}' data-where='{html.escape(where)}'>"
        f"<summary>{head}</summary><div class=transcript>{body}</div></details>"
    )


def transcript_html(record: Mapping[str, Any]) -> str:
    """The generation cut into text, code and output runs."""
    generation = str(record.get("generation") or "")
    calls = [ToolCall.model_validate(c) for c in record.get("tool_calls") or []]
    segments = _segments(record.get("segments"), len(generation))
    if segments is None:  # a row from before segments: text, then every call with its output
        parts = [_text(generation)] if generation else []
        for i, call in enumerate(calls):
            parts += [_code(call.code, call, i), _output(call, i)]
        return "".join(parts)
    parts = []
    for seg in segments:
        piece = generation[seg.start : seg.end]
        call = calls[seg.call] if seg.call is not None and 0 <= seg.call < len(calls) else None
        if seg.kind == "code":
            parts.append(_code(piece, call, seg.call))
        elif seg.kind == "output" and call is not None:
            parts.append(_output(call, seg.call))
        else:
            parts.append(_text(piece))
    return "".join(parts) or "<p class=noans>(empty generation)</p>"


def _segments(raw: Any, length: int) -> list[Segment] | None:
    """Validated segments that tile ``generation``; a tail they miss becomes text."""
    if not raw:
        return None
    try:
        segments = [Segment.model_validate(s) for s in raw]
    except ValueError:
        return None
    at = 0
    for seg in segments:
        if seg.start != at or seg.end < seg.start or seg.end > length:
            return None
        at = seg.end
    if at < length:  # text still held back when the sample was cancelled
        segments.append(Segment(kind="text", start=at, end=length))
    return segments


def _text(text: str) -> str:
    return f"<div class=text>{html.escape(text)}</div>"


def _code(piece: str, call: ToolCall | None, index: int | None) -> str:
    """Highlighted code; the format's tags around it dimmed."""
    at = piece.find(call.code) if call is not None and call.code else -1
    if at < 0:
        before, code, after = "", piece, ""
    else:
        before, code, after = piece[:at], call.code, piece[at + len(call.code) :]  # type: ignore[union-attr]
    tags = [f"<span class=tag>{html.escape(t)}</span>" if t else "" for t in (before, after)]
    lit = highlight(code, _LEXER, _FORMATTER).rstrip("\n")
    data = f" data-call='{index}'" if call is not None else ""
    return f"<pre class='code hl'{data}>{tags[0]}{lit}{tags[1]}</pre>"


def _output(call: ToolCall, index: int | None) -> str:
    kind = "" if call.status == "completed" else " bad"
    return (
        f"<div class='out{kind}' data-call='{index}'>"
        f"<div class=title>{html.escape(output_title(call))}</div>"
        f"<pre>{html.escape(output_body(call))}</pre></div>"
    )
