"""The in-container worker run directly on the host (no Docker): its error text is the layout the
training-era sandbox produced (IPython "Plain", NeMo-Skills release 0f7bd733).

Expected texts come from tests/agent/fixtures/sandbox/nemo_skills_release.json (the reference
sandbox run on these cells) and, for the cases the fixture lacks, from IPython 8.39 run the
same way in the reference environment (/work/ref/venv, see the fixtures' README).
"""

from __future__ import annotations

import fractions
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mathagent.sandbox import worker as worker_module

FIXTURE = Path(__file__).parents[1] / "agent/fixtures/sandbox/nemo_skills_release.json"
# The worker runs with HOME above the standard library, so paths there read as IPython
# shortens them: "~/python3.X/fractions.py".
HOME = Path(fractions.__file__).parents[1]


class WorkerProcess:
    """Speaks the worker's frame protocol over its stdin/stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-u", worker_module.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "HOME": str(HOME)},
        )
        assert self._read()["ready"]

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        size = int(self.proc.stdout.readline())
        return json.loads(self.proc.stdout.read(size))

    def run(self, code: str, timeout: float = 5.0, max_output_chars: int = 1000) -> dict:
        assert self.proc.stdin is not None
        body = json.dumps(
            {"id": 1, "code": code, "timeout": timeout, "max_output_chars": max_output_chars}
        ).encode()
        self.proc.stdin.write(b"%d\n" % len(body) + body)
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    proc = WorkerProcess()
    yield proc
    proc.close()


def _release_cells() -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(FIXTURE.read_text())["cells"]}


@pytest.mark.parametrize("name", ["zero_division", "name_error_in_function", "syntax_error"])
def test_errors_read_as_the_reference_sandbox_printed_them(worker, name):
    cell = _release_cells()[name]
    reply = worker.run(cell["code"])
    assert reply["status"] == "error"
    # The reference printed the traceback to stdout; the worker keeps it on stderr (the
    # contract), and the agent feeds back stdout then stderr: the model reads the same bytes.
    assert reply["stdout"] + reply["stderr"] == cell["execution_dict"]["stdout"]


IPYTHON_PLAIN = {
    "import fractions\nfractions.Fraction(1, 0)": (
        "Traceback (most recent call last):\n"
        "    fractions.Fraction(1, 0)\n"
        "  File ~/{fractions}:157 in __new__\n"
        "    raise ZeroDivisionError('Fraction(%s, 0)' % numerator)\n"
        "ZeroDivisionError: Fraction(1, 0)\n"
    ),
    "try:\n    1/0\nexcept Exception as e:\n    raise ValueError('bad') from e": (
        "Traceback (most recent call last):\n    1/0\nZeroDivisionError: division by zero\n\n"
        "The above exception was the direct cause of the following exception:\n"
        "Traceback (most recent call last):\n    raise ValueError('bad') from e\nValueError: bad\n"
    ),
    "try:\n    1/0\nexcept Exception:\n    raise KeyError('k')": (
        "Traceback (most recent call last):\n    1/0\nZeroDivisionError: division by zero\n\n"
        "During handling of the above exception, another exception occurred:\n"
        "Traceback (most recent call last):\n    raise KeyError('k')\nKeyError: 'k'\n"
    ),
    "try:\n    1/0\nexcept Exception:\n    raise KeyError('k') from None": (
        "Traceback (most recent call last):\n    raise KeyError('k') from None\nKeyError: 'k'\n"
    ),
    "raise ValueError('')": "Traceback (most recent call last):\n    raise ValueError('')\nValueError\n",
    "x = (1 +\n     2 +\n     1/0)": (
        "Traceback (most recent call last):\n    1/0)\nZeroDivisionError: division by zero\n"
    ),
    "exec('def h():\\n    return 1/0')\nh()": (
        "Traceback (most recent call last):\n    h()\n  File <string>:2 in h\n"
        "ZeroDivisionError: division by zero\n"
    ),
    "e = ValueError('x')\ne.add_note('note here')\nraise e": (
        "Traceback (most recent call last):\n    raise e\nValueError: x\nnote here\n"
    ),
    "if True:\n    x = = 1": "    x = = 1\n        ^\nSyntaxError: invalid syntax\n",
    "def g():\nreturn 1": (
        "    return 1\n    ^\n"
        "IndentationError: expected an indented block after function definition on line 1\n"
    ),
    "x = (1,\n": "    x = (1,\n           ^\nSyntaxError: incomplete input\n",
    "import sys\nsys.exit(3)": (
        "An exception has occurred, use %tb to see the full traceback.\nSystemExit: 3\n"
    ),
}


@pytest.mark.parametrize("code", list(IPYTHON_PLAIN))
def test_tracebacks_follow_ipython_plain_layout(worker, code):
    reply = worker.run(code)
    assert reply["status"] == "error"
    relative = Path(fractions.__file__).relative_to(HOME)
    assert reply["stderr"] == IPYTHON_PLAIN[code].format(fractions=relative)


def test_output_before_the_error_stays_on_stdout(worker):
    reply = worker.run("print('a')\n1/0")
    assert reply["stdout"] == "a\n"
    assert reply["stderr"].endswith("ZeroDivisionError: division by zero\n")


def test_warnings_are_silenced_as_in_the_reference(worker):
    reply = worker.run("import warnings\nwarnings.warn('careful')\n2")
    assert (reply["status"], reply["stdout"], reply["stderr"]) == ("completed", "2\n", "")


def test_valid_cells_still_run_and_keep_state(worker):
    assert worker.run("for i in range(2):\n    print(i)")["stdout"] == "0\n1\n"
    assert worker.run("y = 41")["stdout"] == ""
    assert worker.run("y + 1")["stdout"] == "42\n"
