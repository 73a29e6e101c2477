"""math-verify in a child process, so a stuck comparison can be killed from any thread.

math-verify's own time limit uses ``signal.alarm``, which only works on the main thread of
the main interpreter; the eval runner grades from worker threads. We switch its limit off and
put ours at the process boundary instead: the comparison runs in a long-lived child, and a call
that overruns its deadline kills and replaces the child and counts as "no match".
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import threading
from multiprocessing.connection import Connection

_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a busy 2-core machine can take a while


def _serve(conn: Connection) -> None:
    """Child process: answer (gold, predicted) pairs with math-verify's verdict."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    conn.send("ready")
    while True:
        try:
            gold, predicted = conn.recv()
        except EOFError:
            return
        try:
            # Limits off (None): they would use signals; the parent enforces the deadline.
            gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
            pred_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
            verdict = bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
        except Exception:
            verdict = False
        conn.send(verdict)


class Verifier:
    """A math-verify child process with a per-comparison deadline; safe to call from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.timeouts = 0

    def equivalent(self, gold: str, predicted: str, timeout_s: float) -> bool:
        """True when math-verify finds ``predicted`` equal to ``gold`` within ``timeout_s``."""
        with self._lock:
            conn = self._ensure_started()
            try:
                conn.send((gold, predicted))
                if conn.poll(timeout_s):
                    return bool(conn.recv())
            except (EOFError, OSError):
                pass
            else:
                self.timeouts += 1
            self._stop()
            return False

    def close(self) -> None:
        """Stop the child process."""
        with self._lock:
            self._stop()

    def _ensure_started(self) -> Connection:
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            return self._conn
        self._stop()
        # spawn, not fork: the parent may hold engine threads and locks a fork would copy.
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="math-verify")
        proc.start()
        child.close()
        if not parent.poll(_STARTUP_TIMEOUT_S) or parent.recv() != "ready":
            proc.kill()
            raise RuntimeError("the math-verify worker process did not start")
        self._proc, self._conn = proc, parent
        return parent

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None


_default: Verifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> Verifier:
    """The process-wide verifier, started on first use and stopped at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Verifier()
            atexit.register(_default.close)
        return _default
