"""Check the size rules of DESIGN.md's house style over ``mathagent/``.

A file over ``--max-file`` lines or a function over ``--max-function`` lines whose docstring
gives no reason (its module or function docstring says why: "... because ...") is a finding; exit status 1 with one line
per finding. ``--json`` prints the findings and the largest files and functions as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REASON = "because"


def measure(package: Path) -> tuple[list[tuple[str, int, bool]], list[tuple[str, int, bool]]]:
    """(file, lines, has a reason) for every file and (file:function, lines, has a reason) for
    every function."""
    files, functions = [], []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(ROOT))
        tree = ast.parse(source, name)
        files.append((name, len(source.splitlines()), _has_reason(tree)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                functions.append((f"{name}:{node.name}", lines, _has_reason(node)))
    return files, functions


def _has_reason(node: ast.AST) -> bool:
    return REASON in (ast.get_docstring(node) or "").lower()  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-file", type=int, default=300)
    parser.add_argument("--max-function", type=int, default=60)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args()
    files, functions = measure(ROOT / "mathagent")
    findings = [
        f"file {n}: {k} lines, no '{REASON}' in its docstring"
        for n, k, reason in files
        if k > args.max_file and not reason
    ]
    findings += [
        f"function {n}: {k} lines, no '{REASON}' in its docstring"
        for n, k, reason in functions
        if k > args.max_function and not reason
    ]
    if args.json:
        largest = {
            "files": [f[:2] for f in sorted(files, key=lambda f: -f[1])[:5]],
            "functions": [f[:2] for f in sorted(functions, key=lambda f: -f[1])[:5]],
        }
        print(json.dumps({"findings": findings, "largest": largest}, indent=2))
    else:
        for line in findings:
            print(line)
        print(f"{len(files)} files, {len(functions)} functions, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
