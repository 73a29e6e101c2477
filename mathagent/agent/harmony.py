"""gpt-oss' tool syntax: harmony messages addressed to the python tool.

A call is the last message of a turn when its header names a recipient, in either position
(``<|start|>assistant to=python<|channel|>analysis code<|message|>`` as harmony renders it, or
``<|channel|>analysis to=python code<|message|>`` as the model often writes it), also as the
model's first message (the prompt ends in ``<|start|>assistant``). ``<|call|>`` is a special
token: vLLM reports the stop as its id (200012) and drops its text, TensorRT-LLM as the string;
either way it is restored. The request context re-renders each call as harmony renders it and
the tool's answer is harmony's tool message, so the next prompt is what harmony itself renders
(openai/harmony ec7606df; gpt-oss 7b583341 answers on the call's channel).
"""

from __future__ import annotations

from dataclasses import replace

from mathagent.agent.formats import ToolSyntax, TurnEnd, remaining_notice
from mathagent.agent.harmony_render import (
    CALL,
    END,
    MESSAGE,
    RETURN,
    START,
    HarmonyMessage,
    HarmonyRenderer,
    default_renderer,
    final_message,
)
from mathagent.agent.request import NOT_REPORTED, Finish

CALL_TOKEN_ID = 200012  # <|call|> in o200k_harmony
PYTHON = "python"
ENDS = (END, CALL, RETURN)


class HarmonyFormat(ToolSyntax):
    """Tool calls and answers in harmony messages."""

    name = "harmony"
    stop = (CALL,)
    code_marker = f"to={PYTHON}"

    def __init__(self, renderer: HarmonyRenderer | None = None) -> None:
        self._renderer = renderer

    @property
    def renderer(self) -> HarmonyRenderer:
        # Chosen on first use: loading harmony's vocabulary is not free, and most runs are not
        # gpt-oss runs.
        if self._renderer is None:
            self._renderer = default_renderer()
        return self._renderer

    def prompt(self, user: str, effort: str, date: str, tools: bool) -> str:
        return self.renderer.prompt(user, effort, date, tools)  # type: ignore[arg-type]

    def end_turn(self, generation: str, finish: Finish) -> TurnEnd:
        chunk, role = _last_message(generation)
        reported = finish.finish_reason == "stop" and finish.stop_reason in (CALL, CALL_TOKEN_ID)
        if chunk.endswith(CALL):
            body, restored = chunk[: -len(CALL)], ""
        elif _open_content(chunk) and (reported or _may_be_call(finish)):
            body, restored = chunk, CALL
        elif reported:
            return TurnEnd(error=f"malformed harmony: <|call|> ended a header ({chunk[:80]!r})")
        else:
            return TurnEnd()  # the final answer, or the model's end of turn
        header, _, content = body.partition(MESSAGE)
        msg = self.renderer.parse_header(header, role)
        if msg is None or msg.role != "assistant":
            return TurnEnd(error=f"malformed harmony: cannot read the header {header[:80]!r}")
        if msg.recipient is None:
            if restored and not reported:
                return TurnEnd()  # an unterminated message that calls nothing: EOS
            return TurnEnd(error="malformed harmony: <|call|> ended a message to no recipient")
        if msg.recipient != PYTHON:
            note = f"Error: there is no tool named {msg.recipient!r}; the only tool is {PYTHON}."
            reply = self.renderer.message(
                HarmonyMessage("tool", note, msg.recipient, "assistant", msg.channel)
            )
            reply += f"{START}assistant"
            return TurnEnd(restored, code=content, reply=reply, channel=msg.channel)
        return TurnEnd(restored, code=content, channel=msg.channel)

    def is_open(self, text: str) -> bool:
        chunk, role = _last_message(text)
        if not _open_content(chunk):
            return False
        msg = self.renderer.parse_header(chunk.partition(MESSAGE)[0], role)
        return msg is not None and msg.recipient is not None

    def output_block(
        self, output: str, remaining: int | None = None, call: TurnEnd | None = None
    ) -> str:
        # Notices (off for gpt-oss by default) go inside the tool's message, never into headers.
        channel = call.channel if call and call.channel else "analysis"
        msg = HarmonyMessage(
            "tool", output + remaining_notice(remaining), PYTHON, "assistant", channel
        )
        return self.renderer.message(msg) + f"{START}assistant"

    def context(self, generation: str) -> str:
        """The generation with every call message rendered as harmony renders it."""
        out, pos = [], 0
        while (at := generation.find(CALL, pos)) >= 0:
            start = generation.rfind(START, pos, at)
            begin, role = (start + len(START), None) if start >= 0 else (pos, "assistant")
            canonical = self._canonical(generation[begin:at], role)
            out.append(generation[pos:begin] + (canonical or generation[begin : at + len(CALL)]))
            pos = at + len(CALL)
        return "".join(out) + generation[pos:]

    def _canonical(self, chunk: str, role: str | None) -> str | None:
        header, sep, content = chunk.partition(MESSAGE)
        msg = self.renderer.parse_header(header, role) if sep else None
        if msg is None or msg.role != "assistant" or msg.recipient is None:
            return None
        text = self.renderer.message(replace(msg, content=content))
        # Without <|start|>: the caller keeps the start marker (and the prompt holds the first
        # message's "<|start|>assistant").
        drop = f"{START}assistant" if role else START
        return text[len(drop) :]

    def check_turn(self, turn: str) -> str | None:
        if len(turn.strip()) >= 16 and "<|" not in turn:
            return (
                "the server returned gpt-oss text without its harmony markers (<|channel|>, "
                "<|message|>, <|call|>): it ignores skip_special_tokens=false, so no tool call "
                "can be read; serve the model with special tokens kept in the output"
            )
        return None

    def answer_region(self, generation: str) -> str | None:
        """The last final-channel message's text; None when the model wrote none."""
        return final_message(generation)


def _last_message(text: str) -> tuple[str, str | None]:
    """The last message's text after ``<|start|>``, and its role when the prompt gave it."""
    start = text.rfind(START)
    if start < 0:
        return text, "assistant"
    return text[start + len(START) :], None


def _open_content(chunk: str) -> bool:
    """The message's content has begun and no end token closed it."""
    at = chunk.find(MESSAGE)
    return at >= 0 and not any(t in chunk[at:] for t in ENDS)


def _may_be_call(finish: Finish) -> bool:
    # A server that does not report its stop: a message with a recipient can only end with
    # <|call|> (checked by the caller through the header).
    return finish.finish_reason == "stop" and finish.stop_reason is NOT_REPORTED
