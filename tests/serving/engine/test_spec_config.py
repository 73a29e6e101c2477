"""The one ``--speculative`` parser: five methods, the embedded engine's four, clear refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mathagent.serving.engine.spec_config import (
    EMBEDDED_METHODS,
    METHODS,
    SpecMethod,
    SpecMethodError,
    embedded_method,
)


@pytest.mark.parametrize(
    ("spec", "kind", "path"),
    [("none", "none", None), (" ngram ", "ngram", None), ("draft:/d", "draft", "/d"),
     ("redrafter:/r/x:y", "redrafter", "/r/x:y"), ("eagle3:/e", "eagle3", "/e")],
)  # fmt: skip
def test_every_method_parses_and_prints_back(spec, kind, path):
    method = SpecMethod.parse(spec)
    assert (method.kind, method.path) == (kind, path)
    assert SpecMethod.parse(str(method)) == method


@pytest.mark.parametrize("bad", ["medusa", "medusa:/x", "ngram:/x", "", "none:"])
def test_unknown_methods_name_the_grammar(bad):
    with pytest.raises(SpecMethodError, match="none \\| ngram \\| draft:PATH"):
        SpecMethod.parse(bad)


@pytest.mark.parametrize("bad", ["draft", "draft:", "eagle3:", "redrafter"])
def test_a_method_without_its_path_says_so(bad):
    with pytest.raises(SpecMethodError, match="needs a path"):
        SpecMethod.parse(bad)


def test_the_embedded_engine_takes_every_method_eagle3_included():
    assert METHODS == "none | ngram | draft:PATH | redrafter:PATH | eagle3:PATH"
    assert EMBEDDED_METHODS == METHODS
    assert embedded_method("redrafter:/r") == SpecMethod("redrafter", "/r")
    assert embedded_method("eagle3:/e") == SpecMethod("eagle3", "/e")
    with pytest.raises(SpecMethodError, match=f"use {EMBEDDED_METHODS.replace('|', '.')}$"):
        embedded_method("medusa")


def test_the_parser_needs_no_torch():
    code = (
        "import sys; import mathagent.serving.engine.spec_config, mathagent.serving.launchers.serve; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
