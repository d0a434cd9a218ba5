"""What ``build_code_archive`` ships and refuses, and what ``archive_modules`` accepts."""

from __future__ import annotations

import importlib
import io
import json
import stat
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_ops import Count, FileTopic, OpaqueMapState, Topology
from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import SubmissionError, TopologyLoadError
from stream_ops.nimbus.code_archive import archive_modules, build_code_archive


@pytest.fixture
def package(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A package ``pkg_<hex>`` under ``<tmp>/site-packages`` with an ``ops.split`` function."""
    name = f"pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "site-packages"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "ops.py").write_text("def split(s):\n    return s.split()\n")
    yield name, root
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _plan(name: str, root: Path, tmp_path: Path, fn_name: str = "split"):
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        fn = getattr(importlib.import_module(f"{name}.ops"), fn_name)
    finally:
        sys.path.remove(str(root))
    return _topology_plan(fn, tmp_path)


def _topology_plan(fn, tmp_path: Path):
    topology = Topology("t")
    counts = (
        topology.source("s", FileTopic(tmp_path / "in"), schema={"sentence": "string"})
        .each(fn, out="word", fields=["sentence"])
        .group_by("word")
        .persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    )
    topology.query("q", counts)
    return build_plan(topology)


def _members(data: bytes) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: info for info in archive.infolist()}


def test_ships_the_referenced_package_wherever_installed_with_modes_and_no_bytecode(package, tmp_path):
    name, root = package
    (root / name / "secret_ops.py").write_text("X = 1\n")
    (root / name / "secret_ops.py").chmod(0o600)
    (root / name / "__pycache__").mkdir()
    (root / name / "__pycache__" / "ops.cpython-311.pyc").write_bytes(b"planted")
    (root / name / "alias.py").symlink_to(root / name / "ops.py")  # inside the package: shipped as a file
    members = _members(build_code_archive(_plan(name, root, tmp_path)))
    assert sorted(members) == sorted(f"{name}/{f}" for f in ("__init__.py", "alias.py", "ops.py", "secret_ops.py"))
    assert stat.S_IMODE(members[f"{name}/secret_ops.py"].external_attr >> 16) == 0o600
    assert stat.S_IMODE(members[f"{name}/ops.py"].external_attr >> 16) == stat.S_IMODE((root / name / "ops.py").stat().st_mode)
    assert archive_modules(build_code_archive(_plan(name, root, tmp_path))) == (name,)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_symlink_leaving_the_package_is_refused_naming_it(package, tmp_path, kind):
    name, root = package
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secrets.py").write_text("TOKEN = 'do-not-ship'\n")
    link = root / name / ("leak.py" if kind == "file" else "vendored")
    link.symlink_to(outside / "secrets.py" if kind == "file" else outside)
    with pytest.raises(SubmissionError) as refused:
        build_code_archive(_plan(name, root, tmp_path))
    assert str(link) in str(refused.value) and "outside the package" in str(refused.value)


def test_a_compiled_extension_in_a_package_is_refused(package, tmp_path):
    name, root = package
    (root / name / "fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    with pytest.raises(SubmissionError, match="compiled extension"):
        build_code_archive(_plan(name, root, tmp_path))


def test_a_reference_to_the_standard_library_is_refused_at_submit(tmp_path):
    with pytest.raises(SubmissionError, match="'json:dumps'.*standard library.*your own package"):
        build_code_archive(_topology_plan(json.dumps, tmp_path))


def test_stream_ops_references_ship_nothing(tmp_path):
    from stream_ops.examples.wordcount import split

    assert _members(build_code_archive(_topology_plan(split, tmp_path))) == {}


def _zip(names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member in names:
            archive.writestr(member, "")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("members", "problem"),
    [
        (["userpkg/__pycache__/ops.cpython-311.pyc"], "bytecode"),
        (["userpkg/ops.pyc"], "bytecode"),
        (["../evil.py"], "unsafe member name"),
        (["/abs/evil.py"], "unsafe member name"),
        (["subprocess.py"], "standard library"),
        (["os/__init__.py"], "standard library"),
        (["stream_ops/__init__.py"], "never shipped"),
        (["README"], "not a Python module"),
    ],
)
def test_archive_modules_refuses_what_submit_never_ships(members, problem):
    with pytest.raises(TopologyLoadError, match=problem):
        archive_modules(_zip(members))


def test_archive_modules_lists_top_level_modules():
    assert archive_modules(_zip(["a/__init__.py", "a/b/c.py", "single.py"])) == ("a", "single")
    assert archive_modules(_zip([])) == ()
    with pytest.raises(TopologyLoadError, match="not a zip"):
        archive_modules(b"not a zip")


MODULE_SOURCES = {
    "fns": "def split(s):\n    return s.split()\n\n\ndef keep(t, records):\n    pass\n",
    "pes": "from stream_ops.operators import ProcessingElement\n\n\nclass Echo(ProcessingElement):\n"
    "    def on_event(self, event):\n        self.emit(word=event['word'])\n",
    "states": "from stream_ops.operators.trident_state import State, StateFactory, StateUpdater\n\n\n"
    "class S(State):\n    def begin_commit(self, txid): pass\n    def commit(self, txid): pass\n\n\n"
    "class F(StateFactory):\n    def make_state(self, p, n):\n        return S()\n\n\n"
    "class U(StateUpdater):\n    def update_state(self, state, tuples, collector): pass\n",
    "sinks": "def write(txid, records):\n    pass\n",
}


def test_the_archive_ships_the_module_of_every_kind_of_reference(tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    root = tmp_path / "site-packages"
    root.mkdir()
    for name, text in MODULE_SOURCES.items():
        (root / f"{name}_{suffix}.py").write_text(text)
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        mods = {name: importlib.import_module(f"{name}_{suffix}") for name in MODULE_SOURCES}
        topology = Topology("kinds")
        words = topology.source("s", FileTopic(tmp_path / "in", 1), schema={"sentence": "string"}).each(
            mods["fns"].split, out="word", fields=["sentence"]
        )
        words.process(mods["pes"].Echo, key="word", out={"word": "string"}).partition_persist(
            mods["states"].F(), ["word"], mods["states"].U(), name="st"
        )
        words.sink(mods["sinks"].write)
        plan = build_plan(topology)
        members = _members(build_code_archive(plan))
        assert {f"{name}_{suffix}.py" for name in MODULE_SOURCES} <= set(members)
    finally:
        sys.path.remove(str(root))
        for name in MODULE_SOURCES:
            sys.modules.pop(f"{name}_{suffix}", None)
