"""The package order: each package and top-level module of ``stream_ops`` sits in one layer and
imports only from the layers below it, never from its own layer or one above.

This list is the source of truth for the order (``docs/design.md`` section 2 describes it). It is
read from the source with ``ast`` (nothing is imported), and every import counts: at module
level, inside a function, under ``if TYPE_CHECKING:``, ``import stream_ops.x``, ``from
stream_ops import x`` and relative imports alike.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "stream_ops"

FACADE = "__init__"
"""The unit of ``stream_ops/__init__.py``: the public API users import (``from stream_ops import Topology``)."""

#: Ground floor first. A unit is a package or top-level module directly under ``stream_ops/``.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    # leaf modules and generic helpers: no stream_ops import but errors
    frozenset(
        {
            "arrow_types",
            "asset_metadata",
            "config",
            "durable_files",
            "hashing",
            "helpers",
            "jvm_server",
            "ports",
            "registry",
            "scheduler",
            "topology_env",
        }
    ),
    # clients of external services, each the only home of its library
    frozenset({"coordination", "kafka"}),
    frozenset({"topics"}),
    frozenset({"sources", "state"}),
    # the plan data model and the seams it is checked against (stage kinds, sink kinds, windows, layout)
    frozenset({"topology"}),
    frozenset({"operators", "sinks"}),
    frozenset({"spark"}),
    # how a stage's batches are computed (the four source-batch paths) and the query that feeds them
    frozenset({"compute"}),
    # the DSL users write, and building a plan from it
    frozenset({"dsl"}),
    frozenset({"nimbus"}),
    frozenset({"runtime"}),
    frozenset({"doctor", "local_stack", "orchestration"}),
    frozenset({"cli", "cluster_stack", FACADE}),
    frozenset({"examples"}),
)


def _layer_of() -> dict[str, int]:
    layer_of: dict[str, int] = {}
    for index, units in enumerate(LAYERS):
        for unit in units:
            assert unit not in layer_of, f"{unit} is in two layers"
            layer_of[unit] = index
    return layer_of


def _units() -> set[str]:
    """Every package and top-level module under ``stream_ops/``, and the facade."""
    found = {FACADE}
    for path in PACKAGE.iterdir():
        if path.suffix == ".py" and path.name != "__init__.py":
            found.add(path.stem)
        elif path.is_dir() and (path / "__init__.py").is_file():
            found.add(path.name)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit_of(module: str, units: set[str]) -> str | None:
    """The unit of a module or of a name imported from one (None outside ``stream_ops``):
    ``stream_ops.X...`` is unit X, and ``stream_ops`` itself, or a name of it, the facade."""
    parts = module.split(".")
    if parts[0] != "stream_ops":
        return None
    if len(parts) >= 2 and parts[1] in units:
        return parts[1]
    return FACADE


@dataclass(frozen=True)
class Import:
    """One imported module, as written, and where."""

    path: Path
    line: int
    module: str
    text: str


def _imports(path: Path) -> list[Import]:
    """Every ``stream_ops`` module ``path`` imports, wherever the import statement is."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend(Import(path, node.lineno, alias.name, ast.unparse(node)) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # ``from a import b``: b is a module of package a, or a name in module a
            found.extend(Import(path, node.lineno, f"{source}.{alias.name}", ast.unparse(node)) for alias in node.names)
    return found


def _violations() -> list[str]:
    units = _units()
    layer_of = _layer_of()
    problems = [f"stream_ops unit {unit!r} is in no layer: add it to LAYERS" for unit in sorted(units - set(layer_of))]
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _unit_of(_module_name(path), units)
        assert unit is not None
        for found in _imports(path):
            target = _unit_of(found.module, units)
            if target is None or target == unit or unit not in layer_of or target not in layer_of:
                continue
            mine, theirs = layer_of[unit], layer_of[target]
            if theirs < mine:
                continue
            how = "its own layer" if theirs == mine else "a higher layer"
            problem = (
                f"{path.relative_to(PACKAGE.parent)}:{found.line}: `{found.text}` imports {target!r} "
                f"({how}, {theirs}) from {unit!r} (layer {mine})"
            )
            if problem not in problems:  # once per statement, however many names it imports
                problems.append(problem)
    return problems


def test_every_import_points_down_the_package_order() -> None:
    problems = _violations()
    assert problems == [], "imports against the package order:\n" + "\n".join(problems)


def test_the_order_names_only_units_that_exist_or_the_facade() -> None:
    assert set(_layer_of()) <= _units(), sorted(set(_layer_of()) - _units())
