"""The floors' import rule (docs/architecture.md): no two modules import each other, not even
through a function-local import. The modules are read, not imported: every `import` and `from
... import` of a module's source, at any depth, is an edge to the k3compile module it names."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KNOWN_CYCLES: set[tuple[str, str]] = set()  # none left (issue 39, item 5): a new one fails the test


def modules() -> dict[str, Path]:
    """Each k3compile module's name and source, by pyproject.toml's package-dir."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for prefix, folder in folders.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found.setdefault(".".join([prefix, *parts]), path)
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The k3compile modules a module's source imports, at top level or inside a function."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                           for alias in node.names)
    found = set()
    for target in targets:
        while target not in known and "." in target:  # a name of a module: the module
            target = target.rsplit(".", 1)[0]
        if target in known and target != name:
            found.add(target)
    return found


def mutual_imports() -> set[tuple[str, str]]:
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    return {tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, ())}


def test_the_graph_is_read():
    """The reader finds the imports the rule is about: a top-level one and a function-local one."""
    known = modules()
    chunk = imported("k3compile.ir.k3s.chunk", known["k3compile.ir.k3s.chunk"], known)
    assert {"k3compile.ir.k3s.token", "k3compile.ir.k3s.kernels"} <= chunk
    assert "k3compile.checking.cost_cli" in imported("k3compile.cli", known["k3compile.cli"], known)


def test_no_two_modules_import_each_other():
    """No pair of modules imports each other, function-local imports included (ir/k3s/chunk.py and
    token.py did: k3s.cache_update, whose parents are in both, now lives in chunk.py)."""
    cycles = mutual_imports()
    assert ("k3compile.ir.k3s.chunk", "k3compile.ir.k3s.token") not in cycles
    assert cycles <= KNOWN_CYCLES, f"modules that import each other: {sorted(cycles - KNOWN_CYCLES)}"
    assert cycles == KNOWN_CYCLES, f"broken, take off KNOWN_CYCLES: {sorted(KNOWN_CYCLES - cycles)}"
