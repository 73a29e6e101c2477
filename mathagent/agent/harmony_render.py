"""Harmony (gpt-oss) text: the prompt, one message, and the parse of a message header.

Two renderers give the same bytes. :class:`PackageRenderer` drives the ``openai-harmony``
package; it needs the o200k vocabulary on disk (``TIKTOKEN_ENCODINGS_BASE``, or harmony's
download cache ``TIKTOKEN_RS_CACHE_DIR``, default ``$TMPDIR/tiktoken-rs-cache``), so it is used
only where the vocabulary is present (never a download). :class:`TextRenderer` writes the text
itself, following harmony's own rules (openai/harmony ec7606df, ``src/encoding.rs``:
``Render<Message>`` and ``parse_header_from_string``); tests check it against harmony's
renderings (tests/agent/fixtures/harmony) and, with the vocabulary fetched, against the package.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

Effort = Literal["low", "medium", "high"]

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
ROLES = ("user", "assistant", "system", "developer", "tool")

# The vocabulary harmony loads: its public URL keys harmony's download cache (sha1 of the URL).
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_FILE = "o200k_base.tiktoken"

# Harmony's system message parts (SystemContent defaults) and its builtin python tool
# (``ToolNamespaceConfig.python()``), as harmony renders them.
IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
CHANNELS = (
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
PYTHON_TOOL = (
    "Use this tool to execute Python code in your chain of thought. The code will not be shown "
    "to the user. This tool should be used for internal reasoning, but not for code that is "
    "intended to be visible to the user (e.g. when creating plots, tables, or files).\n\n"
    "When you send a message containing Python code to python, it will be executed in a "
    "stateful Jupyter notebook environment. python will respond with the output of the "
    "execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save "
    "and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster."
)


@dataclass(frozen=True)
class HarmonyMessage:
    """One harmony message; ``name`` is a tool's name (tools are authored by name)."""

    role: str
    content: str = ""
    name: str | None = None
    recipient: str | None = None
    channel: str | None = None
    content_type: str | None = None


class HarmonyRenderer(Protocol):
    def prompt(self, user: str, effort: Effort, date: str, tools: bool) -> str:
        """System (identity, date, effort, the python tool) + user, then ``<|start|>assistant``."""
        ...

    def message(self, msg: HarmonyMessage) -> str:
        """One message as harmony renders it, ``<|start|>`` to its end token."""
        ...

    def parse_header(self, header: str, role: str | None) -> HarmonyMessage | None:
        """The message a header (the text between ``<|start|>`` and ``<|message|>``) opens."""
        ...


class TextRenderer:
    """Harmony's rendering and header parsing, written out as text."""

    def prompt(self, user: str, effort: Effort, date: str, tools: bool) -> str:
        system = f"{IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\nCurrent date: {date}\n\n"
        system += f"Reasoning: {effort}\n\n"
        if tools:
            system += f"# Tools\n\n## python\n\n{PYTHON_TOOL}\n\n"
        system += CHANNELS
        parts = [HarmonyMessage("system", system), HarmonyMessage("user", user)]
        return "".join(self.message(m) for m in parts) + f"{START}assistant"

    def message(self, msg: HarmonyMessage) -> str:
        author = msg.name if msg.role == "tool" else msg.role + (f":{msg.name}" if msg.name else "")
        header = f"{START}{author}"
        if msg.recipient and msg.recipient != "all":
            header += f" to={msg.recipient}"
        if msg.channel:
            header += f"{CHANNEL}{msg.channel}"
        if msg.content_type:
            header += f" {msg.content_type}"
        end = CALL if msg.role == "assistant" and msg.recipient else END
        return f"{header}{MESSAGE}{msg.content}{end}"

    def parse_header(self, header: str, role: str | None) -> HarmonyMessage | None:
        channel = None
        at = header.find(CHANNEL)
        if at >= 0:
            rest = header[at + len(CHANNEL) :]
            stop = next((i for i, ch in enumerate(rest) if ch.isspace() or ch == "<"), len(rest))
            if stop == 0:
                return None  # a channel marker without a channel
            channel, header = rest[:stop], header[:at] + rest[stop:]
        header = header.strip().replace(CONSTRAIN, f" {CONSTRAIN}").strip()
        parts = header.split()
        name = None
        if role is None:
            if not parts:
                return None
            if parts[0] in ROLES:
                role = parts[0]
            elif len(parts) > 1 or parts[0].startswith("to="):
                role, name = "tool", parts.pop(0)  # an unknown role with a recipient: a tool
            else:
                return None
        if parts and parts[0] == role:
            parts.pop(0)
        recipient, content_type = _recipient_and_type(parts)
        return HarmonyMessage(role, "", name, recipient, channel, content_type)


def _recipient_and_type(parts: list[str]) -> tuple[str | None, str | None]:
    """Harmony's reading of the header words left after role and channel."""
    if not parts:
        return None, None
    last = parts.pop()
    if last.startswith("to="):
        return last[3:], None
    if not parts:
        return last, None  # one word that is not to=...: harmony takes it as the recipient
    raw = parts.pop()
    return raw.removeprefix("to="), last


class PackageRenderer:
    """The same through ``openai-harmony`` (its Rust renderer and parser)."""

    def __init__(self) -> None:
        import openai_harmony as oh

        self._oh = oh
        self._enc = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)

    def prompt(self, user: str, effort: Effort, date: str, tools: bool) -> str:
        oh = self._oh
        system = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(effort.title()))
        system = system.with_conversation_start_date(date)
        if tools:
            system = system.with_tools(oh.ToolNamespaceConfig.python())
        conv = oh.Conversation.from_messages(
            [
                oh.Message.from_role_and_content(oh.Role.SYSTEM, system),
                oh.Message.from_role_and_content(oh.Role.USER, user),
            ]
        )
        tokens = self._enc.render_conversation_for_completion(conv, oh.Role.ASSISTANT)
        return self._enc.decode_utf8(tokens)

    def message(self, msg: HarmonyMessage) -> str:
        oh = self._oh
        author = oh.Author(role=oh.Role(msg.role), name=msg.name)
        m = oh.Message.from_author_and_content(author, msg.content)
        m.channel, m.recipient, m.content_type = msg.channel, msg.recipient, msg.content_type
        return self._enc.decode_utf8(self._enc.render(m))

    def parse_header(self, header: str, role: str | None) -> HarmonyMessage | None:
        oh = self._oh
        text = (START if role is None else "") + f"{header}{MESSAGE}{CALL}"
        tokens = self._enc.encode(text, allowed_special="all")
        try:
            parsed = self._enc.parse_messages_from_completion_tokens(
                tokens, None if role is None else oh.Role(role)
            )
        except Exception:  # harmony raises a bare Exception on a header it cannot read
            return None
        if len(parsed) != 1:
            return None
        m = parsed[0]
        return HarmonyMessage(
            m.author.role.value, "", m.author.name, m.recipient, m.channel, m.content_type
        )


def vocabulary_present() -> bool:
    """True when harmony can load its vocabulary without a download."""
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if base:
        return (Path(base) / O200K_FILE).is_file()
    cache = os.environ.get("TIKTOKEN_RS_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "tiktoken-rs-cache"
    )
    return (Path(cache) / hashlib.sha1(O200K_URL.encode()).hexdigest()).is_file()


def default_renderer() -> HarmonyRenderer:
    """The package where its vocabulary is on disk, else the text renderer."""
    if vocabulary_present():
        try:
            return PackageRenderer()
        except Exception:  # a corrupt or mismatched vocabulary: the text path renders the same
            return TextRenderer()
    return TextRenderer()


def final_message(generation: str) -> str | None:
    """The text of the last final-channel message of a generation; None when it has none."""
    marker, at = f"{CHANNEL}final", len(generation)
    while (at := generation.rfind(marker, 0, at)) >= 0:
        if generation[at + len(marker) : at + len(marker) + 1] in ("", " ", "<"):
            break  # "final" itself, not a channel whose name starts so
    if at < 0:
        return None
    body = generation.find(MESSAGE, at)
    if body < 0:
        return None
    body += len(MESSAGE)
    ends = [i for i in (generation.find(t, body) for t in (END, CALL, RETURN, START)) if i >= 0]
    return generation[body : min(ends, default=len(generation))]
