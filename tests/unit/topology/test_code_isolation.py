"""References bound to a verified code archive: the allow-list and per-submission imports.

No Spark and no ZooKeeper: archives are written to temporary files and imported with
:func:`~stream_ops.topology.functions.resolve_function` as a worker's driver or a Spark
Python worker does.
"""

from __future__ import annotations

import hashlib
import io
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_ops.dsl.build_plan import build_plan
from stream_ops.errors import TopologyLoadError
from stream_ops.examples.counter_pe import build_counter
from stream_ops.examples.wordcount_db import build_wordcount_db
from stream_ops.operators.record_pipeline import RecordPipeline
from stream_ops.topology.code_scope import CodeScope, forbidden_top_level
from stream_ops.topology.functions import resolve_function, resolve_object
from stream_ops.topology.plan import OperationSpec
from stream_ops.topology.plan_code import bind_plan, bound_places, check_references, plan_references

OPS = """\
import os
import subprocess

VERSION = {version!r}
LOADS = []
LOADS.append(VERSION)


def tag(word):
    return [word + "-" + VERSION]


class Factory:
    def __init__(self, label="x"):
        self.label = label + "-" + VERSION


not_a_class = tag
"""


def _archive(tmp_path: Path, name: str, version: str) -> CodeScope:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{name}/ops.py", OPS.format(version=version))
    data = buffer.getvalue()
    path = tmp_path / f"{name}-{version}-{uuid.uuid4().hex[:8]}.zip"
    path.write_bytes(data)
    digest = hashlib.sha256(data + version.encode()).hexdigest()
    return CodeScope(
        digest=digest, code_sha256=hashlib.sha256(data).hexdigest(), archive=str(path), file_name=path.name, modules=(name,)
    )


@pytest.fixture
def package() -> Iterator[str]:
    """A top-level name no other test imports; its modules are dropped afterwards."""
    name = f"isopkg_{uuid.uuid4().hex[:8]}"
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


@pytest.mark.parametrize("ref", ["subprocess:Popen", "os:system", "builtins:eval", "importlib:import_module"])
def test_a_bound_reference_outside_the_archive_and_stream_ops_is_refused(tmp_path, package, ref):
    scope = _archive(tmp_path, package, "v1")
    with pytest.raises(TopologyLoadError, match="neither in the submitted code archive") as refused:
        resolve_function(ref, scope=scope)
    assert repr(ref) in str(refused.value)
    with pytest.raises(TopologyLoadError):
        resolve_object({"class": ref, "args": {"args": ["true"]}, "code": scope})


def test_a_bound_reference_cannot_reach_a_module_the_archive_imported(tmp_path, package):
    scope = _archive(tmp_path, package, "v1")
    with pytest.raises(TopologyLoadError, match="outside the submitted code archive"):
        resolve_function(f"{package}.ops:subprocess.Popen", scope=scope)
    with pytest.raises(TopologyLoadError, match="outside the submitted code archive"):
        resolve_function(f"{package}.ops:os.system", scope=scope)
    with pytest.raises(TopologyLoadError, match="dunder"):
        resolve_function(f"{package}.ops:tag.__globals__", scope=scope)
    with pytest.raises(TopologyLoadError, match="not a class"):
        resolve_object({"class": f"{package}.ops:not_a_class", "args": {"word": "x"}, "code": scope})


def test_stream_ops_and_archive_references_resolve(tmp_path, package):
    scope = _archive(tmp_path, package, "v1")
    assert resolve_function("stream_ops.examples.wordcount:split", scope=scope)("a b") is not None
    assert resolve_function(f"{package}.ops:tag", scope=scope)("w") == ["w-v1"]
    assert resolve_object({"class": f"{package}.ops:Factory", "args": {"label": "f"}, "code": scope}).label == "f-v1"


def test_each_archive_gets_its_own_modules_and_keeps_them(tmp_path, package):
    v1, v2 = _archive(tmp_path, package, "v1"), _archive(tmp_path, package, "v2")
    # The same top-level name is already imported from elsewhere (a stale copy, another archive).
    stale = tmp_path / "stale"
    (stale / package).mkdir(parents=True)
    (stale / package / "__init__.py").write_text("STALE = True\n")
    sys.path.insert(0, str(stale))
    try:
        __import__(package)
    finally:
        sys.path.remove(str(stale))

    tag1 = resolve_function(f"{package}.ops:tag", scope=v1)
    factory1 = resolve_function(f"{package}.ops:Factory", scope=v1)
    tag2 = resolve_function(f"{package}.ops:tag", scope=v2)
    assert tag1("w") == ["w-v1"] and tag2("w") == ["w-v2"]
    assert not hasattr(sys.modules[package], "STALE")
    # Resolving again (a per-batch updater) gives the same objects: no second import of the module.
    assert resolve_function(f"{package}.ops:Factory", scope=v1) is factory1
    assert resolve_function(f"{package}.ops:tag", scope=v2) is tag2
    assert sys.modules[f"{package}.ops"].LOADS == ["v2"]
    assert tag1("w") == ["w-v1"], "objects of an archive keep working while another one is active"
    # Nothing was extracted or compiled next to the archives.
    assert sorted(p.suffix for p in tmp_path.iterdir() if p.is_file()) == [".zip", ".zip"]


def test_the_record_pipeline_imports_from_the_operations_archive(tmp_path, package):
    pipelines = {}
    for version in ("v1", "v2", "v1"):
        scope = _archive(tmp_path, package, version) if version not in pipelines else pipelines[version][0]
        op = OperationSpec(kind="each", function=f"{package}.ops:tag", fields=("word",), out={"tagged": "string"}, code=scope)
        pipelines[version] = (scope, RecordPipeline([op]))
        out, dead = pipelines[version][1].run({"word": "w"})
        assert dead is None and out == [{"word": "w", "tagged": f"w-{version}"}]


def test_a_copy_that_differs_from_the_verified_archive_is_refused(tmp_path, package):
    scope = _archive(tmp_path, package, "v1")
    Path(scope.archive).write_bytes(Path(_archive(tmp_path, package, "evil").archive).read_bytes())
    with pytest.raises(TopologyLoadError, match="no verified copy"):
        resolve_function(f"{package}.ops:tag", scope=scope)


@pytest.mark.parametrize("topology", [build_wordcount_db("/in"), build_counter("/in")], ids=["persist+query", "process"])
def test_bind_plan_binds_every_reference(topology):
    plan = build_plan(topology)
    scope = CodeScope(digest="d" * 64, code_sha256="c" * 64, archive="/a.zip", file_name="a.zip", modules=())
    assert bound_places(plan) == []
    bound = bind_plan(plan, scope)
    assert bound.code == scope
    for stage in bound.stages:
        assert all(op.code == scope for op in stage.operations)
        for op in stage.operations:
            if op.query is not None:
                assert op.query["function"]["code"] == scope
        if stage.persist is not None:
            assert stage.persist.factory["code"] == scope and stage.persist.updater["code"] == scope
        if stage.process is not None:
            assert stage.process.code == scope
    assert len(bound_places(bound)) >= len({r.where.rsplit(" ", 1)[0] for r in plan_references(plan)})
    # A plan as submitted (plan.json) carries no binding, not even an empty one.
    assert '"code"' not in plan.to_json()
    assert type(plan).from_json(plan.to_json()) == plan


def test_check_references_names_the_reference_outside_the_archive():
    plan = build_plan(build_wordcount_db("/in"))
    check_references(plan, ())
    stages = list(plan.stages)
    persist = next(s for s in stages if s.persist is not None)
    tampered_persist = persist.persist.model_copy(update={"factory": {"class": "subprocess:Popen", "args": {"args": ["id"]}}})
    outputs = tuple(tampered_persist if o is persist.persist else o for o in persist.outputs)
    stages[persist.index] = persist.model_copy(update={"outputs": outputs})
    tampered = plan.model_copy(update={"stages": tuple(stages)})
    with pytest.raises(TopologyLoadError, match="'subprocess:Popen'.*neither in the submitted code archive"):
        check_references(tampered, ("userpkg",))


def test_forbidden_top_level_names():
    assert forbidden_top_level("subprocess") and forbidden_top_level("stream_ops") and forbidden_top_level("sys")
    assert forbidden_top_level("not-a-name") and forbidden_top_level("userpkg") is None
