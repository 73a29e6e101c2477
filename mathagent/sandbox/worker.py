"""The in-container worker: runs Python cells in one persistent namespace (stdlib only).

It is one file, longer than the house limit, because the image copies it alone and runs it
isolated (``python3 -I``), where no sibling module can be imported.

Protocol: frames of ``<decimal length>\\n<ASCII JSON>`` on the container's own stdin/stdout,
which the worker keeps on private descriptors. Descriptors 1 and 2 are re-pointed at pipes that
a drain thread empties into the current cell's capture, and 0 at /dev/null, so neither
``print``, ``os.write(1, ...)`` nor a subprocess can reach or corrupt the channel. The
container's stderr keeps faulthandler dumps. Requests: ``{"id", "code", "timeout",
"max_output_chars"}``; replies: ``{"id", "status", "stdout", "stderr", "truncated",
"duration_s"}``. A ``{"ready": true}`` frame is sent once preloading is done.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import faulthandler
import importlib
import io
import json
import linecache
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings

MAX_FRAME = 64 * 1024 * 1024
# ast.PyCF_ONLY_AST | codeop's PyCF_DONT_IMPLY_DEDENT | PyCF_ALLOW_INCOMPLETE_INPUT.
IPYTHON_COMPILE_FLAGS = ast.PyCF_ONLY_AST | 0x200 | 0x4000
OUTPUT_CUT = "<output cut>"


class CellTimeout(BaseException):
    """Raised in the cell by the interval timer; a BaseException so ``except Exception`` misses it."""


class Capture:
    """Keeps the first ``limit`` bytes of a stream and counts the rest (never buffers more)."""

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self, max_chars: int) -> tuple[str, bool]:
        """The first ``max_chars`` characters, marked as NeMo-Skills marks a cut output."""
        text = self.data.decode("utf-8", "replace")
        if self.total > len(self.data) or len(text) > max_chars:
            return text[:max_chars] + OUTPUT_CUT, True
        return text, False


class StreamSink(io.RawIOBase):
    """The binary end of the cell's ``sys.stdout`` / ``sys.stderr``."""

    def __init__(self, worker: Worker, index: int) -> None:
        self.worker, self.index = worker, index

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        data = bytes(b)
        with self.worker.lock:
            self.worker.add(self.index, data)
        return len(data)


class Worker:
    """Owns the namespace, the captures and the descriptor plumbing."""

    def __init__(self, reap: bool) -> None:
        # kill(-1) ends every process the caller may signal: only sane inside the container,
        # as a non-root user whose parent is the container's init.
        self.reap = reap and os.getuid() != 0 and os.getppid() == 1
        self.lock = threading.Lock()
        self.captures: list[Capture] | None = None
        self.running = False
        self.namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = 0
        self.proto_in = os.fdopen(os.dup(0), "rb")
        self.proto_out = os.dup(1)
        self.fault_file = os.fdopen(os.dup(2), "w")
        # Private copies of /dev/null and the pipes' write ends: each cell re-points 0, 1, 2 at
        # them, so a cell that closed or redirected those descriptors harms only itself.
        self.null = os.open(os.devnull, os.O_RDONLY)
        self.pipes, self.pipe_ends = [], []
        for _ in (1, 2):
            r, w = os.pipe()
            os.set_blocking(r, False)
            self.pipes.append(r)
            self.pipe_ends.append(w)
        self._plumb()
        faulthandler.enable(file=self.fault_file, all_threads=False)
        signal.signal(signal.SIGALRM, self._on_alarm)
        self.pid = os.getpid()
        os.register_at_fork(after_in_child=self._after_fork)
        threading.Thread(target=self._drain_forever, daemon=True).start()

    def _after_fork(self) -> None:
        """A child forked by a cell must never touch the channel; its prints go to the pipes."""
        self.reap = False
        self.proto_in.close()
        os.close(self.proto_out)
        self.captures = None
        self.stdout = sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
        self.stderr = sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115

    def _plumb(self) -> None:
        """Fresh standard descriptors and streams for the next cell."""
        for fd, target in zip((0, 1, 2), (self.null, *self.pipe_ends), strict=True):
            os.dup2(target, fd)
        self.stdout, self.stderr = (_text_stream(StreamSink(self, i)) for i in (0, 1))

    def add(self, index: int, data: bytes) -> None:
        if self.captures is not None:
            self.captures[index].add(data)

    def _drain_forever(self) -> None:
        while True:
            ready, _, _ = select.select(self.pipes, [], [])
            with self.lock:
                for fd in ready:
                    self._drain(fd)

    def _drain(self, fd: int) -> None:
        """Read what the pipe holds now (caller holds the lock)."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.add(self.pipes.index(fd), chunk)

    def _on_alarm(self, signum: int, frame: object) -> None:
        if self.running:
            raise CellTimeout

    def run(self, request: dict) -> dict:
        """Execute one request and build its reply."""
        start = time.monotonic()
        max_chars = int(request["max_output_chars"])
        with self.lock:
            self.captures = [Capture(4 * max_chars + 4), Capture(4 * max_chars + 4)]
        status = "completed"
        try:
            status = self._execute(str(request["code"]), float(request["timeout"]))
        except CellTimeout:
            status = "timeout"
        finally:
            self.running = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != self.pid:  # a forked child finished the cell: it ends here
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        self._end_cell()
        with self.lock:
            (out, cut_out), (err, cut_err) = (c.text(max_chars) for c in self.captures)
            self.captures = None
        return {
            "id": request.get("id"),
            "status": status,
            "stdout": out,
            "stderr": err,
            "truncated": cut_out or cut_err,
            "duration_s": time.monotonic() - start,
        }

    def _execute(self, code: str, timeout: float) -> str:
        self.cells += 1
        self._plumb()
        filename = f"<cell-{self.cells}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        sys.stdout, sys.stderr, sys.stdin = self.stdout, self.stderr, io.StringIO()
        # Re-fires every 0.2 s so a cell that swallows one CellTimeout meets the next.
        signal.setitimer(signal.ITIMER_REAL, timeout, 0.2)
        self.running = True
        try:
            tree = _parse(code, filename)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    self.stdout.write(repr(value) + "\n")
        except CellTimeout:
            self.running = False
            self.stderr.write(f"TimeoutError: the cell ran longer than {timeout:g} s\n")
            return "timeout"
        except BaseException as exc:
            self.running = False
            self.stderr.write(_format_exception(exc))
            return "memory_limit" if isinstance(exc, MemoryError) else "error"
        finally:
            self.running = False
        return "completed"

    def _end_cell(self) -> None:
        """Flush the streams, collect what the pipes hold, and end leftover processes."""
        for stream in (self.stdout, self.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout, sys.stderr = self.stdout, self.stderr
        if self.reap:
            _kill_leftovers()
        with self.lock:
            for fd in self.pipes:
                self._drain(fd)

    def serve(self) -> None:
        """Answer requests until the host closes the channel."""
        self._send({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
        while (request := self._receive()) is not None:
            self._send(self.run(request))

    def _receive(self) -> dict | None:
        header = self.proto_in.readline()
        if not header:
            return None
        size = int(header)
        if not 0 < size <= MAX_FRAME:
            raise ValueError(f"bad frame size {size}")
        return json.loads(self.proto_in.read(size))

    def _send(self, message: dict) -> None:
        body = json.dumps(message, ensure_ascii=True).encode()
        view = memoryview(b"%d\n" % len(body) + body)
        while view:
            view = view[os.write(self.proto_out, view) :]


def _parse(code: str, filename: str) -> ast.Module:
    """Parse as IPython does (codeop's flags, a trailing newline), so an unclosed bracket is
    reported as IPython reports it ("incomplete input")."""
    source = code if code.endswith("\n") else code + "\n"
    return compile(source, filename, "exec", IPYTHON_COMPILE_FLAGS, dont_inherit=True)


def _text_stream(sink: StreamSink) -> io.TextIOWrapper:
    return io.TextIOWrapper(sink, "utf-8", "backslashreplace", write_through=True)


def _format_exception(exc: BaseException) -> str:
    """The error as the training-era sandbox showed it (see :func:`_plain_traceback`)."""
    if isinstance(exc, SystemExit):
        # IPython's wording for a cell that calls sys.exit().
        return f"An exception has occurred, use %tb to see the full traceback.\n{_last_line(exc)}\n"
    if isinstance(exc, BaseExceptionGroup):  # IPython 8 itself falls back to CPython's layout
        return "".join(traceback.format_exception(type(exc), exc, _user_tb(exc)))
    return _plain_traceback(exc)


def _plain_traceback(exc: BaseException) -> str:
    """IPython's "Plain" traceback with its ``File <ipython-input-…>`` lines removed.

    That is what OpenMath-Nemotron read in training: NeMo-Skills' sandbox of the
    OpenMathReasoning release (commit 0f7bd733, ``nemo_skills/code_execution/sandbox.py``:
    ``InteractiveTB.set_mode('Plain')`` then ``simplify_errors``) ran cells in IPython. A cell
    frame shows only its source line, a library frame ``  File path:line in name`` and its line;
    causes come first, joined as IPython joins them (tests/agent/fixtures/sandbox).
    """
    blocks, seen = [_plain_one(exc)], {id(exc)}
    while True:
        if exc.__cause__ is not None:
            note, exc = (
                "The above exception was the direct cause of the following exception:",
                exc.__cause__,
            )
        elif exc.__context__ is not None and not exc.__suppress_context__:
            note, exc = (
                "During handling of the above exception, another exception occurred:",
                exc.__context__,
            )
        else:
            break
        if id(exc) in seen:
            break
        seen.add(id(exc))
        blocks.append(f"{_plain_one(exc)}\n{note}\n")
    return "".join(reversed(blocks))


def _plain_one(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError) and (exc.filename or "").startswith("<cell-"):
        return _syntax_lines(exc) + _last_line(exc) + "\n"  # the cell itself did not compile
    lines = ["Traceback (most recent call last):\n"]
    for frame in traceback.extract_tb(_user_tb(exc)):
        if not frame.filename.startswith("<cell-"):
            name = "" if frame.name == "<module>" else f" in {frame.name}"
            lines.append(f"  File {_home_short(frame.filename)}:{frame.lineno}{name}\n")
        if frame.line:
            lines.append(f"    {frame.line.strip()}\n")
    if isinstance(exc, SyntaxError):
        lines.append(_syntax_lines(exc))
    return "".join(lines) + _last_line(exc) + "\n"


def _user_tb(exc: BaseException):
    """The traceback without the worker's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _syntax_lines(exc: SyntaxError) -> str:
    text = (exc.text or "").rstrip("\n")
    if not text.strip():
        return ""
    indent = len(text) - len(text.lstrip())
    caret = " " * (4 + max((exc.offset or 1) - 1 - indent, 0))
    return f"    {text.strip()}\n{caret}^\n"


def _last_line(exc: BaseException) -> str:
    """``Name: message`` (IPython uses the bare class name), then any notes."""
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    line = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    notes = getattr(exc, "__notes__", None) or []
    return "\n".join([line, *map(str, notes)])


def _home_short(path: str) -> str:
    home = os.environ.get("HOME", "")
    return "~" + path[len(home) :] if home and path.startswith(home + "/") else path


def _kill_leftovers() -> None:
    """SIGKILL every other process of the sandbox user (a fork bomb, a background job).

    kill(-1) succeeds while any process (zombies too) remains, so loop until it finds none:
    our children are reaped here, orphans by the container's init.
    """
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.002)


def _preload(names: str) -> None:
    """Import heavy modules once while the container waits in the pool."""
    for name in filter(None, names.split(",")):
        with contextlib.suppress(Exception):  # a missing module only costs its later import
            importlib.import_module(name.strip())


def main(argv: list[str]) -> None:
    """``worker.py [--reap] [--preload mod1,mod2]``; ``--reap`` only in the container."""
    # The training-era sandbox ran every cell under warnings.filterwarnings('ignore')
    # (NeMo-Skills 0f7bd733, code_execution/sandbox.py): its models never read a warning.
    warnings.filterwarnings("ignore")
    worker = Worker(reap="--reap" in argv)
    if "--preload" in argv[:-1]:
        _preload(argv[argv.index("--preload") + 1])
    worker.serve()


if __name__ == "__main__":
    main(sys.argv)
