"""Check the import graph of ``mathagent/``: no cycles, and the layering DESIGN.md draws.

Every import counts, wherever it stands: at the top, inside a function, under ``TYPE_CHECKING``.
An import of ``a.b.c`` is an edge to ``a.b.c`` (the module, or the package's ``__init__``);
``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``.

Exit status 1 with one line per problem; ``--json`` prints the graph's findings as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "mathagent"

# (importer prefix, forbidden import prefix, why): the dependency direction of DESIGN.md.
RULES = (
    ("mathagent.agent", "mathagent.serving", "the agent reaches models only over HTTP"),
    ("mathagent.agent", "mathagent.evals", "evals uses the agent, not the reverse"),
    ("mathagent.agent", "mathagent.runtime", "runtime composes the agent"),
    ("mathagent.agent", "mathagent.cli", "the CLI stands above everything"),
    ("mathagent.sandbox", "mathagent.agent", "the sandbox knows nothing of the agent"),
    ("mathagent.sandbox", "mathagent.evals", "the sandbox knows nothing of evals"),
    ("mathagent.sandbox", "mathagent.serving", "the sandbox knows nothing of serving"),
    ("mathagent.serving", "mathagent.agent", "serving knows nothing of the agent"),
    ("mathagent.serving", "mathagent.evals", "serving knows nothing of evals"),
    ("mathagent.serving", "mathagent.drafter", "training imports the engine, never the reverse"),
    ("mathagent.serving.engine", "mathagent.serving.", "the engine imports nothing around it"),
    ("mathagent.serving.engine", "mathagent.model_store", "the engine loads what its caller names"),
    ("mathagent.evals", "mathagent.serving", "evals reaches engines only over HTTP"),
    ("mathagent.evals", "mathagent.runtime", "runtime composes evals"),
    ("mathagent.evals", "mathagent.cli", "the CLI stands above everything"),
    ("mathagent.drafter", "mathagent.agent", "training knows nothing of the agent"),
    ("mathagent.drafter", "mathagent.serving.", "training builds on the engine alone"),
    ("mathagent.drafter", "mathagent.model_store", "the caller names the base model"),
    ("mathagent.drafter", "mathagent.cli", "the CLI stands above everything"),
    ("mathagent.runtime", "mathagent.cli", "the CLI stands above the runtime"),
)
# Imports a rule allows anyway: the engine's own subpackages, and the engine for training.
ALLOWED = (
    ("mathagent.serving.engine", "mathagent.serving.engine"),
    ("mathagent.drafter", "mathagent.serving.engine"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every mathagent module that ``mod`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        for target in targets:
            if target.startswith(PACKAGE):
                resolved = _resolve(target, known)
                if resolved and resolved != mod:
                    out.add(resolved)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {mod: imports_of(mod, path, known) for mod, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            for importer, forbidden, why in RULES:
                if not _within(src, importer) or not _within(dst, forbidden):
                    continue
                if any(_within(src, a) and _within(dst, b) for a, b in ALLOWED):
                    continue
                out.append(f"{src} imports {dst}: {why}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args()
    edges = graph()
    found, bad = cycles(edges), violations(edges)
    if args.json:
        report = {
            "modules": len(edges),
            "edges": sum(map(len, edges.values())),
            "cycles": found,
            "violations": bad,
        }
        print(json.dumps(report, indent=2))
    else:
        for component in found:
            print("cycle: " + " <-> ".join(component))
        for line in bad:
            print("layering: " + line)
        print(f"{len(edges)} modules, {len(found)} cycles, {len(bad)} layering violations")
    return 1 if found or bad else 0


if __name__ == "__main__":
    sys.exit(main())
