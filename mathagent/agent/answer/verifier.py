"""math-verify in a child process, so a stuck comparison can be killed from any thread.

math-verify's own time limit uses ``signal.alarm``, which only works on the main thread of
the main interpreter; the eval runner grades from worker threads and the agent votes from
them. We switch its limit off and put ours at the process boundary instead: comparisons run
in a long-lived child (``python -m mathagent.agent.answer.verifier``, JSON lines over
stdin/stdout), and a call that overruns its deadline kills and replaces the child and counts
as "no match". The child is started on first use, so a solve whose answers compare without
it never imports sympy.

Three additions to math-verify's verdict, each where it is wrong (tests/agent/test_answer_rules.py):
an inequality answer is compared as the set it describes with an interval gold
(``allow_set_relation_comp``: math-verify only does it the other way round); a list of
inequalities in one variable ("x < -1 or x > 1") as the union of what each allows; and constants
written with the imaginary unit (``e^{i\\pi}``, ``(1+i)^2``) are compared with ``i`` read as
``I``, which math-verify leaves a plain symbol.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a busy 2-core machine can take a while


def _serve() -> None:
    """Child process: answer each [gold, predicted] line with the verdict."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            verdict = _verdict(*json.loads(line))
        except Exception:
            verdict = False
        print(json.dumps(verdict), flush=True)


def _verdict(gold: str, predicted: str) -> bool:
    from math_verify import parse, verify

    # Limits off (None): they would use signals; the parent enforces the deadline.
    gold_parsed = parse(_math(gold), parsing_timeout=None)
    pred_parsed = parse(_math(predicted), parsing_timeout=None)
    if verify(gold_parsed, pred_parsed, timeout_seconds=None, allow_set_relation_comp=True):
        return True
    if not (gold_parsed and pred_parsed):
        return False
    gold_expr, pred_expr = gold_parsed[0], pred_parsed[0]
    return _complex_equal(gold_expr, pred_expr) or _same_solution_set(gold_expr, pred_expr)


def _same_solution_set(gold: object, predicted: object) -> bool:
    """A list of inequalities in one variable (``x < -1, x > 1``, "or" between them) against a
    set of intervals: the union of what each inequality allows. math-verify parses the list as a
    set of relations and compares it with nothing."""
    import sympy

    a, b = _relations_union(gold), _relations_union(predicted)
    if (a is None) == (b is None):
        return False
    a, b = (e if u is None else u for e, u in ((gold, a), (predicted, b)))
    if not all(isinstance(e, sympy.Set) for e in (a, b)):
        return False
    return bool(a.symmetric_difference(b).is_empty)  # type: ignore[union-attr]


def _relations_union(expr: object) -> object | None:
    """The set a list of inequalities in one variable allows; None for anything else."""
    import sympy

    if not isinstance(expr, sympy.FiniteSet) or len(expr.args) < 2:
        return None
    if not all(isinstance(r, sympy.core.relational.Relational) for r in expr.args):
        return None
    if len(set().union(*(r.free_symbols for r in expr.args))) != 1:
        return None
    return sympy.Union(*(r.as_set() for r in expr.args))


def _math(text: str) -> str:
    """The answer as inline math; ``\\boxed{}`` where the text holds a ``$`` of its own."""
    return f"\\boxed{{{text}}}" if "$" in text.replace("\\$", "") else f"${text}$"


def _complex_equal(gold: object, predicted: object) -> bool:
    """Exact constants in ``i`` (and nothing else free), equal with ``i`` as the unit."""
    import sympy

    if not all(isinstance(e, sympy.Expr) for e in (gold, predicted)):
        return False
    exprs: list[sympy.Expr] = [gold, predicted]  # type: ignore[list-item]
    names = {s.name for e in exprs for s in e.free_symbols if isinstance(s, sympy.Symbol)}
    if names != {"i"} or any(e.atoms(sympy.Float) for e in exprs):
        return False
    # Substituted by object: the parser's ``i`` carries assumptions a fresh Symbol("i") lacks.
    a, b = (e.subs({s: sympy.I for s in e.free_symbols}) for e in exprs)
    return sympy.simplify(a - b) == 0


class Verifier:
    """A math-verify child process with a per-comparison deadline; safe to call from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.timeouts = 0

    def equivalent(self, gold: str, predicted: str, timeout_s: float) -> bool:
        """True when math-verify finds ``predicted`` equal to ``gold`` within ``timeout_s``."""
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps([gold, predicted]).encode() + b"\n")
                proc.stdin.flush()
                line = self._read_line(time.monotonic() + timeout_s)
            except (OSError, EOFError):
                line = None
            else:
                self.timeouts += line is None
            if line is None:
                self._stop()
                return False
            return line.strip() == b"true"

    def close(self) -> None:
        """Stop the child process."""
        with self._lock:
            self._stop()

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the math-verify worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        # The child must import this very package, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[3])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mathagent.agent.answer.verifier"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=root,  # `-m` puts the working directory first on sys.path
            bufsize=0,
        )
        try:
            ready = self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S)
        except EOFError:
            ready = None
        if ready != b"ready":
            self._stop()
            raise RuntimeError("the math-verify worker process did not start")
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(5)
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
        self._proc, self._buffer = None, b""


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


if __name__ == "__main__":
    _serve()
