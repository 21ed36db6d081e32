"""The tree is the architecture (STYLE.md): dependencies point one way and imports never circle.

Read from the source with `ast`, so every import counts: module level, inside functions, and under
`TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from catalog.records import POSITIONAL

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "providers", "catalog", "devtools")
MAX_LINES = 400


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycles() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_providers_and_catalog_are_leaves_and_devtools_stays_out_of_the_service() -> None:
    edges = graph()
    top = {name: {target.split(".")[0] for target in targets} for name, targets in edges.items()}
    for leaf in ("providers", "catalog"):
        outside = {name: sorted(t - {leaf}) for name, t in top.items() if name.startswith(leaf) and t - {leaf}}
        assert outside == {}, leaf
    # `switchyard mock-upstream` is the one way in: the CLI imports devtools lazily, nothing else does.
    assert sorted(name for name, t in top.items() if name.startswith("app") and "devtools" in t) == ["app.cli"]
    assert sorted(name for name, t in top.items() if name.startswith("devtools") and t & {"app", "catalog"}) == []


def test_no_module_is_over_400_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: size for name, size in sizes.items() if size > MAX_LINES} == {}


def test_reading_the_configuration_imports_no_routing_http_or_sql() -> None:
    heavy = ("httpx", "sqlalchemy", "litestar", "redis", "app.routing")
    probe = f"import sys, app.settings; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == ""


def test_the_sqlite_ledger_writer_process_imports_no_sqlalchemy() -> None:
    """`catalog.sqlite_child` starts with the first ledger batch of every gateway process:
    it imports the driver, msgspec and the row code only (SQLAlchemy alone takes about 0.6 s)."""
    heavy = ("sqlalchemy", "alembic", "asyncpg", "litestar", "httpx", "app", "providers")
    probe = f"import sys, catalog.sqlite_child; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == ""


_EXACT_PROBE = """
import ast, importlib, json, sys
from pathlib import Path
names, paths, packages = json.loads(sys.argv[1])
found, subclassed = set(), {}
for name, path in zip(names, paths):
    module = importlib.import_module(name)
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)):
            continue
        if not (isinstance(node.left.func, ast.Name) and node.left.func.id == "type"):
            continue
        for op, right in zip(node.ops, node.comparators):
            if not isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                continue
            try:
                value = eval(compile(ast.Expression(right), path, "eval"), vars(module))
            except NameError:  # a function's local (`type(x) is cls`): not a module-level class
                continue
            for cls in value if isinstance(value, (frozenset, set, tuple)) else (value,):
                if isinstance(cls, type) and cls.__module__.split(".")[0] in packages:
                    label = f"{cls.__module__}.{cls.__qualname__}"
                    found.add(label)
                    if cls.__subclasses__():
                        subclassed[label] = [sub.__qualname__ for sub in cls.__subclasses__()]
print(json.dumps({"found": sorted(found), "subclassed": subclassed}))
"""


def test_our_classes_tested_by_exact_type_have_no_subclasses() -> None:
    """The per-request path tests some of our classes by exact type (`type(x) is C`, `type(x) in
    MEDIA_PARTS`; `providers.types` says why): right only while no class derives from them. Every
    service module is imported and every such comparison's classes checked."""
    known = {name: path for name, path in modules().items() if not name.startswith("devtools")}
    argument = json.dumps([list(known), [str(path) for path in known.values()], list(PACKAGES)])
    done = subprocess.run(
        [sys.executable, "-c", _EXACT_PROBE, argument], capture_output=True, text=True, check=True, cwd=ROOT
    )
    result = json.loads(done.stdout)
    assert {"providers.types.ImagePart", "providers.events.Finish", "providers.types.CompletionRequest"} <= set(
        result["found"]
    )
    assert result["subclassed"] == {}


def _many_keywords(tree: ast.AST) -> Iterator[tuple[int, str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.keywords) >= POSITIONAL:
            yield node.lineno, ast.unparse(node.func), len(node.keywords)


def test_no_call_passes_16_keywords_or_more() -> None:
    """A call with 16 keywords or more costs CPython 3.11 ~0.7 µs more than one with 15
    (`catalog.records.POSITIONAL`: the ledger row's 28 keywords were ~2.5 % of a request's
    instructions). Such calls are written by position, or with fewer keywords and the rest set after."""
    found = [
        f"{path.relative_to(ROOT)}:{line} {func}({count} keywords)"
        for path in modules().values()
        for line, func, count in _many_keywords(ast.parse(path.read_text(), str(path)))
    ]
    assert found == []


def test_the_keyword_finder_finds_a_call_of_16() -> None:
    def call(count: int) -> ast.AST:
        return ast.parse("f(0, " + ", ".join(f"k{i}={i}" for i in range(count)) + ")")

    assert [(line, func) for line, func, _ in _many_keywords(call(16))] == [(1, "f")]
    assert list(_many_keywords(call(15))) == []
