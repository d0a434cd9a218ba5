"""The package's import structure: no import circles; each third-party client library only in its
home (kazoo in ``coordination``, dagster in ``orchestration`` and ``definitions/``, confluent_kafka in
``kafka`` and the Kafka state topic, rocksdict in the RocksDB store).

Read from the source with ``ast`` (nothing is imported). Imports under ``if TYPE_CHECKING:``
are left out: they never run.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "stream_ops"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Every module imported outside ``if TYPE_CHECKING:`` blocks."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _import_graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """(module -> the package modules it imports, module -> everything it imports)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    # Package __init__ files only re-export their modules; a circle through one is no real circle.
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    everything: dict[str, list[str]] = {}
    for name, path in modules.items():
        imports = _runtime_imports(ast.parse(path.read_text(encoding="utf-8")))
        everything[name] = imports
        graph[name] = set()
        for imported in imports:
            # "from a.b import c": c may be a module (a.b.c) or a name in a.b
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name and target not in packages and name not in packages:
                graph[name].add(target)
    return graph, everything


def test_no_module_imports_itself_through_others() -> None:
    graph, _ = _import_graph()
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import circle: {' -> '.join(e.args[1])}")


#: Third-party library -> the only places that may import it (module or package prefixes).
LIBRARY_HOMES: dict[str, tuple[str, ...]] = {
    "kazoo": ("stream_ops.coordination",),
    "dagster": ("stream_ops.orchestration",),
    "dagster_pyspark": ("stream_ops.orchestration",),
    "confluent_kafka": ("stream_ops.kafka", "stream_ops.state.kafka_state_partition"),
    "rocksdict": ("stream_ops.state.rocksdb_backing",),
}


def _in(name: str, homes: tuple[str, ...]) -> bool:
    return any(name == home or name.startswith(f"{home}.") for home in homes)


@pytest.mark.parametrize("library", sorted(LIBRARY_HOMES))
def test_each_library_is_imported_only_by_its_home(library: str) -> None:
    _, imports = _import_graph()
    homes = LIBRARY_HOMES[library]
    outside = sorted(
        name
        for name, found in imports.items()
        if not _in(name, homes) and any(i == library or i.startswith(f"{library}.") for i in found)
    )
    assert outside == [], f"{library} imported outside {homes} by {outside}"


def test_the_code_location_imports_no_client_library_directly() -> None:
    """``definitions/`` is wiring: it may import dagster and stream_ops, never kazoo, Kafka or RocksDB."""
    root = PACKAGE.parent / "definitions"
    for path in root.rglob("*.py"):
        imports = _runtime_imports(ast.parse(path.read_text(encoding="utf-8")))
        assert not any(i == "kazoo" or i.startswith(("kazoo.", "confluent_kafka", "rocksdict")) for i in imports), path
