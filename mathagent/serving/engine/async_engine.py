"""An asyncio front for :class:`LLMEngine`: the engine steps in one background thread.

Callers on any event loop ``async for`` over a request's outputs; requests are validated in the
caller's thread (so bad input fails at once), then handed to the engine thread through an
inbox it drains between steps. Leaving the iteration early (a client disconnect) aborts the
request, which frees its slot before the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.sequence import RequestOutput, Sequence


@dataclass
class _Listener:
    loop: asyncio.AbstractEventLoop
    coalesce: bool  # after the first output, hand over only the merged rest at the end
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)
    held: RequestOutput | None = None
    started: bool = False

    def take(self, out: RequestOutput) -> RequestOutput | None:
        """The output to hand over now, or None while a coalescing listener holds it back."""
        if self.held is not None:
            out = replace(
                out,
                delta_text=self.held.delta_text + out.delta_text,
                delta_token_ids=self.held.delta_token_ids + out.delta_token_ids,
            )
            self.held = None
        if self.coalesce and self.started and not out.finished:
            self.held = out
            return None
        self.started = True
        return out


class AsyncEngine:
    """Runs ``engine.step()`` in a daemon thread and streams outputs to asyncio callers."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._listeners: dict[str, _Listener] = {}
        self._adds: list[Sequence] = []
        self._aborts: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="mathagent-engine", daemon=True)
        self.on_output: list = []  # callables(RequestOutput) run in the engine thread (metrics)

    @classmethod
    def launch(cls, build: Callable[[], LLMEngine]) -> AsyncEngine:
        """Build the engine inside the engine thread and start stepping it there.

        torch's CPU ops run on an OpenMP team owned by the thread that calls them. Once a
        second thread (say, the one that loaded the model) has a team too, libgomp counts more
        threads than cores and stops spinning between ops: a decode step took ~1.5x longer
        (int4 on 2 cores). So one thread loads the model and steps it. A load error is raised
        here, in the caller's thread.
        """
        ready: queue.Queue[AsyncEngine | BaseException] = queue.Queue(maxsize=1)

        def run() -> None:
            try:
                front = cls(build())
            except BaseException as exc:  # handed to the caller, which raises it
                ready.put(exc)
                return
            front._thread = threading.current_thread()
            ready.put(front)
            front._loop()

        threading.Thread(target=run, name="mathagent-engine", daemon=True).start()
        front = ready.get()
        if isinstance(front, BaseException):
            raise front
        return front

    def start(self) -> None:
        """Start the engine thread (a launched engine's thread already runs)."""
        if not self._thread.is_alive():
            self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread; pending requests are dropped."""
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs until it finishes.

        ``stream=False`` yields the first output (after prefill) and then one output holding
        the rest: a caller that only wants the whole text does not wake its event loop, and
        contend with the engine thread for the GIL, once per token.

        Raises :class:`~mathagent.serving.engine.llm_engine.PromptError` at once for a prompt
        the engine cannot take.
        """
        rid = request_id or f"async-{next(self._ids)}"
        seq = self.engine.make_sequence(prompt, params, rid)
        listener = _Listener(asyncio.get_running_loop(), coalesce=not stream)
        with self._lock:
            self._listeners[rid] = listener
            self._adds.append(seq)
        self._wake.set()
        finished = False
        try:
            while not finished:
                item = await listener.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(rid)
            with self._lock:
                self._listeners.pop(rid, None)

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to abort a request (frees its slot before the next step)."""
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def _drain_inbox(self) -> None:
        with self._lock:
            adds, self._adds = self._adds, []
            aborts, self._aborts = self._aborts, []
        for seq in adds:
            self.engine.add_sequence(seq)
        for rid in aborts:
            out = self.engine.abort(rid)
            if out is not None:
                self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        for callback in self.on_output:
            callback(out)
        with self._lock:
            listener = self._listeners.get(out.request_id)
        if listener is not None and (ready := listener.take(out)) is not None:
            listener.loop.call_soon_threadsafe(listener.queue.put_nowait, ready)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            listeners = list(self._listeners.items())
        for rid, listener in listeners:
            self.engine.abort(rid)
            listener.loop.call_soon_threadsafe(listener.queue.put_nowait, exc)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # an engine bug must fail the requests, not hang them
                self._fail_all(exc)
                continue
            for out in outputs:
                self._deliver(out)
