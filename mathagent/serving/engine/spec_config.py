"""The ``--speculative`` grammar and its one parser; torch-free, so the launchers use it too.

``none | ngram | draft:PATH | redrafter:PATH | eagle3:PATH``: the same value names a method for
``mathagent serve`` (every engine), ``mathagent generate``, ``MATHAGENT_ENGINE__SPECULATIVE`` and
a completion request's ``speculative`` field. The embedded engine and the external engines
(TensorRT-LLM, vLLM, SGLang) run them all (``eagle3:PATH`` is a head in the published EAGLE-3
layout).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["none", "ngram", "draft", "redrafter", "eagle3"]
KINDS: tuple[Kind, ...] = ("none", "ngram", "draft", "redrafter", "eagle3")
EMBEDDED_KINDS: tuple[Kind, ...] = KINDS
_WITH_PATH = frozenset({"draft", "redrafter", "eagle3"})


def spelling(kinds: Iterable[str]) -> str:
    """How help texts and errors spell the methods ``kinds``: ``none | ngram | draft:PATH``."""
    return " | ".join(f"{k}:PATH" if k in _WITH_PATH else k for k in kinds)


METHODS = spelling(KINDS)
EMBEDDED_METHODS = spelling(EMBEDDED_KINDS)


class SpecMethodError(ValueError):
    """A speculative method string that names no method (or a drafter that cannot load)."""


@dataclass(frozen=True)
class SpecMethod:
    """A parsed ``--speculative`` value."""

    kind: Kind
    path: str | None = None

    @classmethod
    def parse(cls, spec: str, kinds: tuple[Kind, ...] = KINDS) -> SpecMethod:
        """Parse ``spec``; a method outside ``kinds`` (what the caller runs) is refused."""
        spec = spec.strip()
        kind, sep, path = spec.partition(":")
        if kind not in KINDS or (sep and kind not in _WITH_PATH):
            raise SpecMethodError(f"unknown speculative method {spec!r}; use {spelling(kinds)}")
        if kind in _WITH_PATH and not path:
            raise SpecMethodError(f"speculative method {kind} needs a path: {kind}:PATH")
        if kind not in kinds:
            raise SpecMethodError(
                f"speculative method {kind} runs on the external engines only (mathagent serve "
                f"--engine trtllm|vllm|sglang); the embedded engine takes {spelling(kinds)}"
            )
        return cls(kind, path or None)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def embedded_method(spec: str) -> SpecMethod:
    """Parse ``spec`` as a method the embedded engine runs."""
    return SpecMethod.parse(spec, EMBEDDED_KINDS)
