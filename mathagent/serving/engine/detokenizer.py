"""Incremental detokenisation with stop strings matched across token boundaries.

Text is released only when it is final: never a dangling partial UTF-8 character, and never a
tail that could still grow into a stop string, so a streamed response never shows stop text.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    """Turns one sequence's generated ids into text deltas, watching for stop strings."""

    def __init__(
        self,
        tokenizer: Any | None,
        stop: list[str],
        include_stop: bool,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special = skip_special_tokens
        self.text = ""  # all decoded text so far (may include a held-back tail)
        self.emitted = 0  # characters of ``text`` already released
        self._prefix = 0  # token offsets for incremental decoding (as in vLLM)
        self._read = 0
        self.stopped_by: str | None = None

    def add(self, ids: list[int], final: bool = False) -> str:
        """Account for the sequence's ids so far; return newly released text.

        After this returns, ``stopped_by`` is set when a stop string appeared (the text is cut
        there). ``final`` releases any held-back tail.
        """
        if self.tokenizer is not None and self.stopped_by is None:
            self._decode_new(ids)
            self._check_stop()
        if self.stopped_by is not None or final:
            release = len(self.text)
        else:
            release = len(self.text) - self._holdback()
        delta = self.text[self.emitted : release]
        self.emitted = max(self.emitted, release)
        return delta

    def _decode_new(self, ids: list[int]) -> None:
        tok = self.tokenizer
        skip = self.skip_special
        prefix_text = tok.decode(ids[self._prefix : self._read], skip_special_tokens=skip)
        full_text = tok.decode(ids[self._prefix :], skip_special_tokens=skip)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.text += full_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(ids)

    def _check_stop(self) -> None:
        if not self.stop:
            return
        longest = max(len(s) for s in self.stop)
        start = max(0, self.emitted - longest)
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            self.text = self.text[: i + len(s) if self.include_stop else i]
            self.stopped_by = s

    def _holdback(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        return hold
