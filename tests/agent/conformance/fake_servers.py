"""Fake OpenAI-compatible servers that behave as vLLM and TensorRT-LLM (``trtllm-serve``) do.

A real HTTP server (FastAPI under uvicorn, in a thread, on a loopback port chosen by the OS), so
the agent's real ``openai`` client talks to it unchanged. A scripted "model" emits tokens, each
with its text, id and whether it is a special token; the server turns them into responses the
way the real server's engine does. Every request body is recorded (``server.requests``).

What each mode reproduces, and where it comes from (vLLM read at the commits named; TensorRT-LLM
likewise; citations are file @ commit):

``vllm``
  - Request defaults, ``vllm/entrypoints/openai/protocol.py`` @ ec3b890c (CompletionRequest):
    ``max_tokens=16`` on /v1/completions, ``skip_special_tokens=True``,
    ``spaces_between_special_tokens=True``, ``include_stop_str_in_output=False``,
    ``stop_token_ids=[]``; ``stream_options`` without ``stream`` is a 400. Chat requests have no
    ``max_tokens`` default: the rest of the context (``max_model_len - prompt``).
  - A ``max_tokens`` past the context is refused, not cut:
    ``vllm/entrypoints/openai/serving_engine.py`` @ 7ded96b3 OpenAIServing._validate_input
    (chat: ``max_completion_tokens or max_tokens``; prompt + it > ``max_model_len`` -> a 400,
    "This model's maximum context length is ...").
  - Extra ``eos_token_id`` values of the model's ``generation_config.json`` (all but the
    tokenizer's own EOS) become ``stop_token_ids`` unless ``ignore_eos``:
    ``vllm/sampling_params.py`` @ db573835 SamplingParams.update_from_generation_config. For gpt-oss
    (eos ``[200002, 199999, 200012]``, tokenizer EOS ``<|return|>`` 200002) this makes
    ``<|call|>`` (200012) a stop token.
  - Stop tokens, ``vllm/v1/core/sched/utils.py`` @ 018d5dc7 check_stop: the tokenizer's EOS
    ends with ``finish_reason="stop"`` and ``stop_reason=None``; a ``stop_token_ids`` member
    ends with ``stop_reason=<its int id>``; ``max_tokens`` reached ends with ``"length"``.
  - Text, ``vllm/v1/engine/detokenizer.py`` @ e372329d: a stop-terminating token is not
    detokenized unless ``include_stop_str_in_output`` (its text is dropped, special or not);
    special tokens decode to nothing when ``skip_special_tokens``; stop strings are searched in
    the detokenized text (``StopChecker.check_stop_strings``, the search starting
    ``len(stop) + new chars`` from the end) and the text is cut before the stop string (after it
    with ``include_stop_str_in_output``), ``stop_reason=<the stop string>``; while streaming,
    ``max(len(stop)) - 1`` characters are held back until the request finishes, so a stop string
    never leaks in a delta.
  - Responses, ``protocol.py`` @ ec3b890c: every choice carries ``stop_reason`` (int | str |
    None); with ``stream_options.include_usage`` a last chunk has ``choices: []`` and the usage.
    ``/v1/models`` lists the model with ``max_model_len``.

``trtllm``
  - Request defaults, ``tensorrt_llm/serve/openai_protocol.py`` @ 0076e939 (CompletionRequest):
    ``max_tokens=None`` (the rest of the context), ``skip_special_tokens=True``,
    ``spaces_between_special_tokens=True``, ``include_stop_str_in_output=False``,
    ``stop_token_ids=[]``; choices carry ``stop_reason`` (int | str | None).
  - Stop words, ``tensorrt_llm/sampling_params.py`` @ 000a01de SamplingParams._setup /
    _get_stop_reasons_and_words: ``end_id`` is the tokenizer's EOS; each ``stop`` string is
    tokenized on its own (``tokenizer.encode(s, add_special_tokens=False)``) and matched as a
    token-id sequence, each ``stop_token_ids`` member as a one-token sequence. No
    ``generation_config`` EOS list is folded in there, so gpt-oss' ``<|call|>`` stops only if the
    request asks for it.
  - ``tensorrt_llm/executor/result.py`` @ 005bc848 GenerationResultBase._handle_sequence:
    END_ID -> ``finish_reason="stop"``, ``stop_reason=None``; STOP_WORDS -> ``"stop"``,
    ``stop_reason=<the stop string or the int id>``, the stop word's tokens cut from the output
    unless ``include_stop_str_in_output``; LENGTH -> ``"length"``. The cut happens on the final
    response only: while streaming, the earlier tokens of a multi-token stop word have already
    been sent (the fake does the same); a one-token stop word is never sent.
  - ``tensorrt_llm/serve/postprocess_handlers.py`` @ 01bf1923: completion choices (whole and
    streamed) carry ``stop_reason=output.stop_reason``; ``completion_tokens`` is the output's
    token count after the stop word is cut; with ``include_usage`` a last chunk has
    ``choices: []``. Chat streams start with a
    ``role`` chunk written as ``data: {...} \\n\\n`` (a space before the blank line) and carry
    ``stop_reason`` on the finishing chunk.

``ignores-skip-special-tokens``
  vLLM's behaviour except that special tokens are always stripped, whatever the request says
  (a server or proxy that drops ``skip_special_tokens``), for the bad-input tests.

Sources (stored versions read through the search tool's code index; each file at its own
commit, not one release of each project):

- vLLM ``vllm/entrypoints/openai/protocol.py`` @ ec3b890c14b00f6670515d9df8d503b5270e95ca
- vLLM ``vllm/sampling_params.py`` @ db573835d3ef40643442e0817059e087355cf458
- vLLM ``vllm/v1/core/sched/utils.py`` @ 018d5dc78efa9af8a03457451b6f27d56bf3b9c2
- vLLM ``vllm/v1/engine/detokenizer.py`` @ e372329d90d7d12e3957ac21c4097fd9bb79192c
- vLLM ``vllm/engine/output_processor/stop_checker.py`` @ 0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f
- vLLM ``vllm/entrypoints/openai/serving_engine.py`` @ 7ded96b3c73f63400cdb048a73c34292ba862d99
- TensorRT-LLM ``tensorrt_llm/serve/openai_protocol.py`` @ 0076e9390e1ed11515f149eec356f5a03f4a00d8
- TensorRT-LLM ``tensorrt_llm/sampling_params.py`` @ 000a01de66f0eab4ab05640711f0253f50f5209c
- TensorRT-LLM ``tensorrt_llm/executor/result.py`` @ 005bc848893f575ec14b45d6b13139360d67c790
- TensorRT-LLM ``tensorrt_llm/serve/postprocess_handlers.py`` @ 01bf19231d29d8f0766e31c117d1cf39ed00d3d5

Not modelled: sampling (the script is the model), logprobs, ``n > 1``, tool/reasoning parsers
(TensorRT-LLM parses harmony itself on chat requests for gpt-oss), chunks with empty text
(both servers may send them mid-stream; the fakes send text-bearing chunks and the finishing one),
chat templates (a chat request's messages are recorded, not rendered), TensorRT-LLM's
refusal of a ``max_tokens`` past the context (it is cut there instead). Prompt token counts are
an estimate (``len(prompt) // 4``, at least 1), used for ``usage`` and the context limit.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODES = ("vllm", "trtllm", "ignores-skip-special-tokens")


@dataclass(frozen=True)
class Token:
    """One generated token: its text, id, and whether the tokenizer marks it special."""

    text: str
    id: int
    special: bool = False


@dataclass
class ServedModel:
    """What the server knows about the model besides its weights.

    ``eos_token_id`` is the tokenizer's EOS (vLLM's primary EOS, TensorRT-LLM's ``end_id``);
    ``generation_eos_ids`` is ``generation_config.json``'s ``eos_token_id`` list;
    ``tokenization`` says how a stop string tokenizes on its own (TensorRT-LLM matches stop
    strings as token ids); a string missing there is looked up as one added token in
    ``vocab``, else it cannot match.
    """

    name: str = "fake-model"
    eos_token_id: int | None = None
    generation_eos_ids: tuple[int, ...] = ()
    vocab: dict[str, int] = field(default_factory=dict)
    tokenization: dict[str, list[int]] = field(default_factory=dict)
    max_model_len: int = 32768

    def tokenize_stop(self, stop: str) -> list[int] | None:
        if stop in self.tokenization:
            return list(self.tokenization[stop])
        if stop in self.vocab:
            return [self.vocab[stop]]
        return None


# Token facts of the production models (see tests/agent/fixtures/templates/special_tokens.json).
QWEN_IM_END = Token("<|im_end|>", 151645, special=True)
QWEN_ENDOFTEXT = Token("<|endoftext|>", 151643, special=True)
QWEN_TOOL_CALL = Token("<tool_call>", 151657)  # an added token, but not special
QWEN_TOOL_CALL_END = Token("</tool_call>", 151658)

HARMONY = {
    name: Token(name, tid, special=True)
    for name, tid in [
        ("<|startoftext|>", 199998),
        ("<|endoftext|>", 199999),
        ("<|return|>", 200002),
        ("<|constrain|>", 200003),
        ("<|channel|>", 200005),
        ("<|start|>", 200006),
        ("<|end|>", 200007),
        ("<|message|>", 200008),
        ("<|call|>", 200012),
    ]
}


def qwen_model(name: str = "nvidia/OpenMath-Nemotron-14B", **kw: Any) -> ServedModel:
    """A Qwen2.5-family model: EOS ``<|im_end|>``, ``<tool_call>`` tags as added tokens."""
    vocab = {
        t.text: t.id for t in (QWEN_IM_END, QWEN_ENDOFTEXT, QWEN_TOOL_CALL, QWEN_TOOL_CALL_END)
    }
    kw.setdefault("generation_eos_ids", (151645, 151643))
    return ServedModel(name=name, eos_token_id=151645, vocab=vocab, **kw)


def gpt_oss_model(name: str = "openai/gpt-oss-120b", **kw: Any) -> ServedModel:
    """gpt-oss: tokenizer EOS ``<|return|>``, generation_config eos [200002, 199999, 200012]."""
    kw.setdefault("generation_eos_ids", (200002, 199999, 200012))
    kw.setdefault("max_model_len", 131072)
    return ServedModel(
        name=name,
        eos_token_id=200002,
        vocab={t.text: t.id for t in HARMONY.values()},
        **kw,
    )


def text_tokens(text: str, start_id: int = 1000) -> list[Token]:
    """Plain (non-special) tokens, one per character: enough for text-level behaviour."""
    return [Token(ch, start_id + i) for i, ch in enumerate(text)]


def harmony_tokens(text: str) -> list[Token]:
    """Split text into harmony special tokens and one-character plain tokens."""
    out: list[Token] = []
    i = 0
    while i < len(text):
        for name, tok in HARMONY.items():
            if text.startswith(name, i):
                out.append(tok)
                i += len(name)
                break
        else:
            out.append(Token(text[i], 1000 + ord(text[i])))
            i += 1
    return out


# ---------------------------------------------------------------------------------------------
# The engine: scripted tokens + request -> streamed text pieces and how generation ended.


@dataclass
class Outcome:
    """``deltas``: the text each engine step adds to a stream (the last is the finishing step's,
    possibly empty); ``text``: the whole returned text."""

    deltas: list[str]
    text: str
    finish_reason: str
    stop_reason: int | str | None
    completion_tokens: int


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def vllm_context_error(
    body: dict, model: ServedModel, prompt_tokens: int, chat: bool
) -> str | None:
    """vLLM's refusal of a request whose ``max_tokens`` (chat: ``max_completion_tokens`` first;
    completions: 16 when unset) does not fit the context after the prompt."""
    asked = (
        body.get("max_completion_tokens") or body.get("max_tokens")
        if chat
        else body.get("max_tokens", 16)
    )
    limit = model.max_model_len
    if asked is None or prompt_tokens + asked <= limit:
        return None
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{asked + prompt_tokens} tokens ({prompt_tokens} in the messages, {asked} in the "
        "completion). Please reduce the length of the messages or completion."
    )


def run_engine(
    tokens: Iterable[Token],
    body: dict,
    model: ServedModel,
    mode: str,
    prompt_tokens: int,
    chat: bool,
) -> Outcome:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    max_tokens = body.get("max_tokens")
    if body.get("max_completion_tokens") is not None:
        max_tokens = body["max_completion_tokens"]
    room = max(model.max_model_len - prompt_tokens, 0)
    if max_tokens is None:
        max_tokens = 16 if (mode != "trtllm" and not chat) else room
    max_tokens = min(max_tokens, room)
    skip = bool(body.get("skip_special_tokens", True)) or mode == "ignores-skip-special-tokens"
    if mode == "trtllm":
        return _run_trtllm(list(tokens), body, model, max_tokens, skip)
    return _run_vllm(list(tokens), body, model, max_tokens, skip)


def _run_vllm(
    tokens: list[Token], body: dict, model: ServedModel, max_tokens: int, skip: bool
) -> Outcome:
    include = bool(body.get("include_stop_str_in_output", False))
    ignore_eos = bool(body.get("ignore_eos", False))
    stops = _stops(body.get("stop"))
    stop_ids = set(body.get("stop_token_ids") or [])
    if not ignore_eos:
        stop_ids |= set(model.generation_eos_ids) - {model.eos_token_id}
    hold = max((len(s) for s in stops), default=1) - 1 if stops and not include else 0
    text, sent, deltas = "", 0, []
    finish, reason, n = None, None, 0
    for tok in tokens:
        n += 1
        terminated = False
        if not ignore_eos and tok.id == model.eos_token_id:
            finish, terminated = "stop", True
        elif tok.id in stop_ids:
            finish, reason, terminated = "stop", tok.id, True
        elif n >= max_tokens:
            finish = "length"
        new = 0
        if not (terminated and not include):
            piece = "" if (tok.special and skip) else tok.text
            text += piece
            new = len(piece)
        if not terminated and stops and new:
            for stop in stops:
                at = text.find(stop, -new - len(stop))
                if at == -1:
                    continue
                if include:
                    at += len(stop)
                text = text[:at]
                finish, reason = "stop", stop
                break
        upto = len(text) - (0 if finish else hold)
        delta = text[sent:upto] if upto > sent else ""
        sent = max(sent, upto)
        if finish:
            deltas.append(delta)
            break
        if delta:
            deltas.append(delta)
    if finish is None:  # the script ran out: as if the model had emitted its EOS
        finish = "stop"
        deltas.append(text[sent:])
    return Outcome(deltas, text, finish, reason, n)


def _run_trtllm(
    tokens: list[Token], body: dict, model: ServedModel, max_tokens: int, skip: bool
) -> Outcome:
    include = bool(body.get("include_stop_str_in_output", False))
    ignore_eos = bool(body.get("ignore_eos", False))
    words: list[tuple[int | str, list[int]]] = [
        (tid, [tid]) for tid in (body.get("stop_token_ids") or [])
    ]
    for stop in _stops(body.get("stop")):
        ids = model.tokenize_stop(stop)
        if ids:
            words.append((stop, ids))
    out: list[Token] = []
    deltas: list[str] = []
    sent = 0
    finish, reason = None, None

    def decode(toks: list[Token]) -> str:
        return "".join("" if (t.special and skip) else t.text for t in toks)

    for n, tok in enumerate(tokens, start=1):
        if not ignore_eos and tok.id == model.eos_token_id:
            finish = "stop"  # END_ID: the end token is not part of the output
            deltas.append("")
            break
        out.append(tok)
        ids = [t.id for t in out]
        for stop_reason, word in words:
            if ids[-len(word) :] == word:
                finish, reason = "stop", stop_reason
                if not include:
                    del out[-len(word) :]
                break
        if finish is None and n >= max_tokens:
            finish = "length"
        text = decode(out)
        delta = text[sent:] if len(text) > sent else ""
        sent = max(sent, len(text))
        if finish:
            deltas.append(delta)
            break
        if delta:
            deltas.append(delta)
    else:
        finish = "stop"  # the script ran out: as if the model had emitted its EOS
        deltas.append("")
    return Outcome(deltas, decode(out), finish, reason, len(out))


# ---------------------------------------------------------------------------------------------
# The HTTP server.


class FakeServer:
    """An OpenAI-compatible server in a thread; use as a context manager.

    ``script`` is a list of turns, one per request, each a list of tokens the model generates
    from that prompt (it may run past a stop: the engine stops where the real server would).
    ``base_url`` ends in ``/v1``.
    """

    def __init__(
        self, script: list[list[Token]], mode: str = "vllm", model: ServedModel | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
        self.mode = mode
        self.model = model or ServedModel()
        self.script = [list(turn) for turn in script]
        self.requests: list[dict] = []
        self.app = self._make_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeServer:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)

    # -- app ----------------------------------------------------------------------------------

    def _make_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            card: dict[str, Any] = {
                "id": self.model.name,
                "object": "model",
                "created": 0,
                "owned_by": "tensorrt_llm" if self.mode == "trtllm" else "vllm",
            }
            if self.mode != "trtllm":
                card.update(
                    root=self.model.name, parent=None, max_model_len=self.model.max_model_len
                )
            return {"object": "list", "data": [card]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._serve(await request.json(), chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._serve(await request.json(), chat=True)

        return app

    async def _serve(self, body: dict, chat: bool) -> Response:
        self.requests.append(body)
        if body.get("stream_options") and not body.get("stream"):
            return _error(400, "Stream options can only be defined when `stream=True`.")
        if not self.script:
            return _error(500, "the fake model's script is exhausted")
        prompt = (json.dumps(body.get("messages")) if chat else body.get("prompt")) or ""
        prompt_tokens = max(1, len(prompt) // 4)
        if self.mode != "trtllm" and (
            refused := vllm_context_error(body, self.model, prompt_tokens, chat)
        ):
            return _error(400, refused)
        outcome = run_engine(self.script.pop(0), body, self.model, self.mode, prompt_tokens, chat)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "total_tokens": prompt_tokens + outcome.completion_tokens,
        }
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if not body.get("stream"):
            return JSONResponse(self._whole(rid, outcome, usage, chat))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._stream(rid, outcome, usage, chat, include_usage),
            media_type="text/event-stream",
        )

    def _whole(self, rid: str, o: Outcome, usage: dict, chat: bool) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_reason,
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": o.text, "tool_calls": []}
        else:
            choice["text"] = o.text
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model.name,
            "choices": [choice],
            "usage": usage,
        }

    async def _stream(
        self, rid: str, o: Outcome, usage: dict, chat: bool, include_usage: bool
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def chunk(choices: list[dict], **extra: Any) -> dict:
            return {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.model.name,
                "choices": choices,
                **extra,
            }

        def event(data: dict, trailing: str = "") -> bytes:
            return f"data: {json.dumps(data)}{trailing}\n\n".encode()

        if chat:
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield event(chunk([first]), " " if self.mode == "trtllm" else "")
        pieces = o.deltas
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": o.finish_reason if last else None,
                "stop_reason": o.stop_reason if last else None,
            }
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            yield event(chunk([choice]))
            await asyncio.sleep(0)
        if include_usage:
            yield event(chunk([], usage=usage))
        yield b"data: [DONE]\n\n"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": status,
        },
        status_code=status,
    )
