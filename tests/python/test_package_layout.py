"""python/opforge has no import circle: each module imports only modules below it, so any one
of them can be read (and imported) on its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "opforge"


def imports(root: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for the package in ``root`` (relative and
    absolute imports; ``from . import x`` counts as importing x)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                deps |= {f"{module}.{a.name}" for a in node.names} | {module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        modules[name] = deps
    return {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles, not counting a package's own ``__init__`` importing its submodules (the
    edge from a package to a module inside it)."""
    found = []

    def visit(node: str, path: list[str]) -> None:
        for dep in sorted(graph[node]):
            if dep.startswith(node + "."):
                continue
            if dep in path:
                found.append(path[path.index(dep) :] + [dep])
            elif len(path) < len(graph):
                visit(dep, path + [dep])

    for start in sorted(graph):
        visit(start, [start])
    return found


def test_the_package_has_no_import_circle():
    assert cycles(imports(PACKAGE)) == []


def test_the_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .b import g\n\ndef f(): pass\n")
    (pkg / "b.py").write_text("from . import a\n\ndef g(): pass\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert ["pkg.a", "pkg.b", "pkg.a"] in cycles(imports(pkg))
    assert all("pkg.c" not in c for c in cycles(imports(pkg)))
