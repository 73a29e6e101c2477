"""Malformed and hostile HTTP requests against one service, over raw loopback sockets.

Kinds (seeded, mixed): random JSON, wrong types and ranges, bodies of 0 bytes to 50 MiB
(declared or chunked, sent whole or only begun), bad UTF-8, slow bodies (trickled; a few stall
until the server's body timeout), requests dropped mid-body or mid-response, auth missing,
malformed or wrong, wrong routes and methods. Raw sockets so the client can do what real
clients do wrong and see exactly what the server answers, and when.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

MiB = 1024 * 1024
SIZES = [0, 1, 100, 4096, 65_536, 200_000, MiB, 2 * MiB, 5 * MiB, 20 * MiB, 50 * MiB]
FIRST_SLICE = 64 * 1024
READ_TIMEOUT_S = 120.0


@dataclass
class Target:
    """One service: where, its POST routes, a valid body, its body limit and its key."""

    name: str
    port: int
    routes: list[str]
    valid: dict[str, Any]
    limit: int
    key: str | None = None
    stream_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    kind: str
    status: int | None  # None: no answer (dropped by us, or the server closed)
    oversized: bool = False
    early: bool = False  # the answer was complete before the body was sent whole
    timed_out: bool = False


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(7 if depth < 4 else 4)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.choice([0, -1, 10**30, 1.5, -1e308, rng.randrange(-(10**9), 10**9)])
    if pick in (2, 3):
        return "".join(rng.choice('ab \\"\n\x00é€😀') for _ in range(rng.randrange(20)))
    if pick in (4, 5):
        return {rng.choice(["problem", "prompt", "code", "x", ""]): _random_json(rng, depth + 1)
                for _ in range(rng.randrange(4))}  # fmt: skip
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


WRONG = [None, "", "x", -1, 0, 10**12, -1e9, 1.5, True, [], {}, [1, "a"], {"a": {}}]
RAW_WRONG = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"0x10", b"'str'", b"[" * 5000]


def _wrong_types(rng: random.Random, valid: dict) -> bytes:
    body = dict(valid)
    key = rng.choice([*valid, "extra_field"])
    if rng.random() < 0.25:  # a value JSON itself cannot carry, or Python's json accepts
        text = json.dumps({k: v for k, v in body.items() if k != key})
        return text[:-1].encode() + b', "%s": %s}' % (key.encode(), rng.choice(RAW_WRONG))
    body[key] = rng.choice(WRONG)
    return json.dumps(body).encode()


def _head(target: Target, route: str, size: int | None, auth: str | None, extra=()) -> bytes:
    lines = [f"POST {route} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if auth is not None:
        lines.append(f"Authorization: {auth}")
    lines.append(f"Content-Length: {size}" if size is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def _auth(target: Target) -> str | None:
    return f"Bearer {target.key}" if target.key else None


async def _read_response(reader: asyncio.StreamReader) -> int | None:
    """The status of one response, after reading it whole (Content-Length or to EOF)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if b"transfer-encoding: chunked" in head.lower():
        await reader.read()  # to the end of the (closed or finished) stream
    else:
        await reader.readexactly(length)
    return status


async def _exchange(port: int, chunks: list[bytes], pause: float = 0.0) -> int | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        return await asyncio.wait_for(_read_response(reader), READ_TIMEOUT_S)
    except (ConnectionError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()


async def _oversized(target: Target, rng: random.Random, size: int) -> Outcome:
    """A body over the limit: only begun (is it answered before the rest is sent?), or sent
    whole before reading (is it a 413 and not a reset?); declared or chunked."""
    route, chunked = rng.choice(target.routes), rng.random() < 0.3
    head = _head(target, route, None if chunked else size, _auth(target))
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    try:
        whole = rng.random() < 0.3
        sent = 0
        writer.write(head)
        while sent < (size if whole or chunked else FIRST_SLICE):
            piece = b"x" * min(MiB, size - sent)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            sent += len(piece)
            if chunked and sent > target.limit + MiB:
                break  # the server answered by now, or never will
        status = await asyncio.wait_for(_read_response(reader), 30)
        # A chunked body is never terminated here: any answer to it came before its end.
        return Outcome("oversized", status, oversized=True, early=chunked or sent < size)
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
        return Outcome("oversized", None, oversized=True)
    finally:
        writer.close()


async def one_request(target: Target, rng: random.Random) -> Outcome:
    """One hostile request of a random kind; its outcome."""
    kind = rng.choices(
        ["random_json", "wrong_types", "size", "bad_utf8", "slow", "stall", "dropped_body",
         "dropped_response", "auth", "route"],
        weights=[20, 25, 15, 8, 6, 1, 8, 3, 10, 4],
    )[0]  # fmt: skip
    route, auth = rng.choice(target.routes), _auth(target)
    if kind == "size":
        size = rng.choice(SIZES)
        if size > target.limit:
            return await _oversized(target, rng, size)
        body = json.dumps({**target.valid, "pad": ""}).encode()[:-2]
        body += b"x" * max(0, size - len(body) - 2) + b'"}'
        body = body[:size] if size < len(body) else body
    elif kind == "random_json":
        body = json.dumps(_random_json(rng)).encode()
    elif kind == "wrong_types":
        body = _wrong_types(rng, target.valid)
    elif kind == "bad_utf8":
        body = rng.choice([b'{"problem": "\xff\xfe"}', b'{"prompt": "\xc3\x28"}',
                           b'{"code": "\xed\xa0\x80"}', b"\xef\xbb\xbf{}", b"\x80" * 64])  # fmt: skip
    elif kind == "auth":
        auth = rng.choice([None, "Bearer", "Bearer wrong", "Basic dXNlcjpwdw==", "bearer  ",
                           f"Bearer {target.key or ''}x", "Bearer \t"])  # fmt: skip
        body = json.dumps(target.valid).encode()
    elif kind == "route":
        method = rng.choice(["GET", "PUT", "DELETE", "PATCH"])
        path = rng.choice([route, "/nope", "/" + "a" * 5000, "/%ff%fe", "/sessions/..%2f"])
        request = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
        return Outcome(kind, await _exchange(target.port, [request]))
    else:  # slow, stall, dropped_body, dropped_response
        body = json.dumps(target.valid).encode()
    return await _send(target, rng, kind, route, auth, body)


async def _send(target, rng, kind, route, auth, body: bytes) -> Outcome:
    head = _head(target, route, len(body), auth)
    if kind == "slow":  # trickled in ten pieces over about a second: still answered
        step = max(1, len(body) // 10)
        pieces = [head] + [body[i : i + step] for i in range(0, len(body), step)]
        return Outcome(kind, await _exchange(target.port, pieces, pause=0.1))
    if kind == "stall":  # half the body, then silence: the server's body timeout answers
        return Outcome(kind, await _exchange(target.port, [head + body[: len(body) // 2]]))
    if kind == "dropped_body":
        _, writer = await asyncio.open_connection("127.0.0.1", target.port)
        writer.write(head + body[: rng.randrange(len(body) + 1) // 2])
        await writer.drain()
        writer.close()
        return Outcome(kind, None)
    if kind == "dropped_response" and target.stream_body:
        streamed = json.dumps(target.stream_body).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
        writer.write(_head(target, route, len(streamed), auth) + streamed)
        await writer.drain()
        try:
            first = await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_TIMEOUT_S)
            status = int(first.split(b" ", 2)[1])
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            status = None
        writer.close()  # mid-response: the server must notice and free what it held
        return Outcome(kind, status)
    return Outcome(kind, await _exchange(target.port, [head + body]))


async def storm(target: Target, count: int, concurrency: int = 32, seed: int = 0) -> dict:
    """``count`` hostile requests, ``concurrency`` at a time; counts by kind and status."""
    rng, sem = random.Random(seed), asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def guarded(i: int) -> Outcome:
        async with sem:
            try:
                return await one_request(target, random.Random(rng.random() + i))
            except TimeoutError:
                return Outcome("timeout", None, timed_out=True)
            except Exception as exc:  # the client's own trouble (say, an unreadable reply)
                return Outcome(f"client_error:{type(exc).__name__}", None)

    outcomes = await asyncio.gather(*(guarded(i) for i in range(count)))
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        by_kind[o.kind][str(o.status)] += 1
    big = [o for o in outcomes if o.oversized]
    return {
        "requests": count,
        "seconds": round(time.monotonic() - started, 1),
        "5xx": sum(1 for o in outcomes if o.status is not None and o.status >= 500),
        "oversized": len(big),
        "oversized_413": sum(o.status == 413 for o in big),
        "oversized_413_before_read_whole": sum(o.status == 413 and o.early for o in big),
        "oversized_sent_whole_then_413": sum(o.status == 413 and not o.early for o in big),
        "client_timeouts": sum(o.timed_out for o in outcomes),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
    }
