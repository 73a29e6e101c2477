"""Reach vLLM's and SGLang's real argument parsers on a machine without a GPU.

Not run by CI. Run it with an interpreter where the engine's wheel is installed with
``--no-deps`` (plus the small pure-Python packages its parser modules import):

    python scripts/engine_parsers.py dump vllm  > tests/serving/launchers/schemas/vllm-X.json
    python scripts/engine_parsers.py dump sglang > tests/serving/launchers/schemas/sglang-X.json
    echo '[["vllm", "serve", "m", "--max-num-seqs", "1"]]' | python scripts/engine_parsers.py replay vllm

``dump`` writes the schema snapshot (every flag of the parser, whether it takes a value, its
choices; for vLLM also the ``--speculative-config`` fields and methods). ``replay`` reads a JSON
list of command lines on stdin and answers, for each, ``null`` when the real parser accepts it
or the parser's error message. GPU-only modules (triton, and whatever else ``STUBS`` names) are
replaced by empty stand-ins before the engine is imported; nothing is downloaded or started.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import io
import json
import os
import sys
import types
import typing

# Modules the parsers' import chains touch but never call while parsing.
STUBS = {"vllm": {"llguidance", "partial_json_parser", "xgrammar"}, "sglang": {"IPython", "triton"}}
_CLASS_NAMES = {"dtype", "constexpr", "tensor"}


class _Stub(types.ModuleType):
    """A module whose every attribute is a harmless class (decorators return their function)."""

    __path__: typing.ClassVar[list[str]] = []

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in {"jit", "autotune", "heuristics"}:
            return lambda fn=None, **_: fn if callable(fn) else (lambda f: f)
        if name.islower() and name not in _CLASS_NAMES:
            return _Stub(f"{self.__name__}.{name}")
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _Stub(spec.name)
        if spec.name == "triton":
            module.__version__ = "3.4.0"
        return module

    def exec_module(self, module) -> None:
        return None


def parser_for(engine: str) -> argparse.ArgumentParser:
    """The engine's own server parser (``vllm serve`` / ``sglang.launch_server``)."""
    sys.meta_path.insert(0, _StubFinder(STUBS[engine]))
    if engine == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU to detect a platform from
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def flags(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Every option string: whether it takes a value, and its choices (as strings)."""
    out: dict[str, dict] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            entry: dict = {"takes_value": action.nargs != 0, "dest": action.dest}
            if action.choices is not None:
                entry["choices"] = sorted(str(c) for c in action.choices)
            out[opt] = entry
    return dict(sorted(out.items()))


def _literal_values(tp: object) -> list[str]:
    if typing.get_origin(tp) is typing.Literal:
        return [v for arg in typing.get_args(tp) for v in _literal_values(arg)]
    return [tp] if isinstance(tp, str) else []


def vllm_speculative() -> dict:
    """``--speculative-config``: the accepted keys and ``method`` values of SpeculativeConfig."""
    import dataclasses

    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    return {
        "fields": sorted(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init),
        "methods": sorted(_literal_values(SpeculativeMethod)),
    }


def value_sets(engine: str) -> dict[str, list[str]]:
    """Values checked after parsing (not argparse choices) for the flags the presets set."""
    if engine == "vllm":
        from vllm.config.parallel import DistributedExecutorBackend

        return {"--distributed-executor-backend": _literal_values(DistributedExecutorBackend)}
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = [a.name for a in SpeculativeAlgorithm if a.name != "NONE"]
    return {"--speculative-algorithm": sorted(names)}


def dump(engine: str) -> dict:
    """The schema snapshot of the installed engine."""
    version = importlib.metadata.version(engine)
    snapshot = {
        "engine": engine,
        "version": version,
        "origin": f"PyPI wheel {engine}=={version}, installed with --no-deps",
        "extracted": f"scripts/engine_parsers.py dump {engine}: the real argparse parser, "
        f"stubbed modules {sorted(STUBS[engine])}",
        "flags": flags(parser_for(engine)),
        "value_sets": value_sets(engine),
    }
    if engine == "vllm":
        snapshot["speculative_config"] = vllm_speculative()
    return snapshot


def replay(engine: str, argvs: list[list[str]]) -> list[str | None]:
    """Each command line through the real parser: ``None`` if accepted, else its error."""
    parser = parser_for(engine)
    prefix = 2 if engine == "vllm" else 3  # "vllm serve" / "python3 -m sglang.launch_server"
    results: list[str | None] = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(argv[prefix:])
        except SystemExit:
            results.append(err.getvalue().strip().splitlines()[-1])
        else:
            results.append(None)
    return results


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("action", choices=["dump", "replay"])
    cli.add_argument("engine", choices=sorted(STUBS))
    args = cli.parse_args()
    if args.action == "dump":
        print(json.dumps(dump(args.engine), indent=1, sort_keys=True))
    else:
        print(json.dumps(replay(args.engine, json.load(sys.stdin))))


if __name__ == "__main__":
    main()
