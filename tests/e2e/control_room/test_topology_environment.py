"""Topology code sees no secret of the worker's (issue 30, item 2): an allow-listed environment.

The secured cluster's worker was started with ``DAGSTER_PG_PASSWORD``, ``STREAM_OPS_ZK_AUTH``
and ``STREAM_OPS_QUERY_TOKEN`` in its environment. A topology whose ``map`` reports, from every
process it runs in, whether a planted value appears in ``os.environ`` or in
``/proc/self/environ`` runs its code in the three kinds of process that run topology code:

* the worker's own process (a small batch, on the driver: ``spark.stream_ops.driverBatchBytes``);
* its row processes (a large batch read in Arrow: native field types, above that limit, on a
  ``local`` master, ``spark.stream_ops.rowProcesses`` unset);
* Spark's Python workers (a large batch of a source with a ``float`` field, which the Arrow
  reader leaves to Spark: ``mapInArrow``).

Each report names the process it came from, so the test knows the code really ran there. Then
every process below the worker (its Spark JVM, the pyspark daemon and workers, the row
processes) is read from ``/proc``: no planted value in any environment block or command line.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from process_tree import process_tree, secrets_shown

from stream_ops import FileTopic, Topology
from stream_ops.nimbus.submission import kill, submit
from stream_ops.topics.producer import produce

PROBE_SOURCE = '''
import os

PLANTED = {planted!r}
_SEEN = {{}}


def _kind():
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\\0", b" ").decode(errors="replace")
    for marker, kind in (
        ("pyspark.daemon", "spark_python_worker"),
        ("pyspark.worker", "spark_python_worker"),
        ("stream_ops.compute.row_process_main", "row_process"),
        ("stream_ops.cli", "worker"),
    ):
        if marker in cmdline:
            return kind
    return "unknown: " + cmdline[:200]


def probe(record):
    """What this process shows its topology code: once per process, then the same answer."""
    if not _SEEN:
        with open("/proc/self/environ", "rb") as f:
            started_with = f.read().decode(errors="replace")
        current = "\\0".join(f"{{k}}={{v}}" for k, v in os.environ.items())
        leaked = sorted(n for n, v in PLANTED.items() if v in current or v in started_with)
        _SEEN.update(pid=os.getpid(), kind=_kind(), leaked=",".join(leaked), names=",".join(sorted(os.environ)))
    return dict(_SEEN)
'''

OUT = {"pid": "long", "kind": "string", "leaked": "string", "names": "string"}
KINDS = ("worker", "row_process", "spark_python_worker")


def _probe_module(root: Path, planted: dict[str, str]) -> Any:
    """Write the probe as a top-level module under ``root`` and import it, as a client would
    (the submission ships it in the code archive; the worker imports it from there)."""
    name = f"envprobe_{uuid.uuid4().hex[:12]}"
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(PROBE_SOURCE.format(planted=planted)), encoding="utf-8")
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(root))


def _reports(out: Path) -> list[dict[str, Any]]:
    """The probe's reports in the sinks under ``out`` (one directory per source)."""
    files = [str(f) for f in sorted(out.glob("*/*.parquet"))]
    return ds.dataset(files, format="parquet").to_table(columns=list(OUT)).to_pylist() if files else []


def _wait_for_kinds(out: Path, kinds: set[str], timeout_s: float, log: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        reports = _reports(out)
        if kinds <= {r["kind"] for r in reports}:
            return reports
        if time.monotonic() > deadline:
            seen = sorted({r["kind"] for r in reports})
            raise AssertionError(f"topology code did not report from {sorted(kinds)} (only {seen}); worker log:\n{log()[-4000:]}")
        time.sleep(0.5)


def test_topology_code_sees_no_secret_in_any_process_of_the_worker(secured_cluster: Any, tmp_path: Path) -> None:
    planted = secured_cluster.planted
    probe = _probe_module(tmp_path / "code", planted).probe
    native, sparky, out = (tmp_path / name for name in ("native", "sparky", "out"))
    topology = Topology(f"envprobe-{uuid.uuid4().hex[:8]}")
    # Native field types: a large batch is read in Arrow and its map runs in the row processes.
    topology.source("native", FileTopic(native, 1), schema={"line": "string"}).map(probe, out=OUT).to_parquet(out / "native")
    # A float field leaves parsing to Spark: a large batch's map runs in Spark's Python workers.
    topology.source("sparky", FileTopic(sparky, 1), schema={"line": "string", "weight": "float"}).map(probe, out=OUT).to_parquet(
        out / "sparky"
    )

    with secured_cluster.store() as store:
        topology_id = submit(store, secured_cluster.cluster, topology, workers=1)  # ships the probe's module
        sys.modules.pop(probe.__module__, None)
        try:
            for path in (native, sparky):  # small batches: computed on the worker's driver
                produce(FileTopic(path, 1), [{"line": "small", "weight": 1.0}])
            _wait_for_kinds(out, {"worker"}, 120, secured_cluster.worker_log)
            # Well above spark.stream_ops.driverBatchBytes (1 MiB): row processes, Spark's workers.
            large = [{"line": "x" * 100, "weight": 0.5}] * 12_000
            for path in (native, sparky):
                produce(FileTopic(path, 1), large, records_per_file=len(large))
            reports = _wait_for_kinds(out, set(KINDS), 180, secured_cluster.worker_log)
            tree = process_tree(secured_cluster.worker.proc.pid)
        finally:
            kill(store, topology_id)

    by_kind = {r["kind"]: r for r in reports}
    assert by_kind["worker"]["pid"] == secured_cluster.worker.proc.pid  # small batches ran in the worker itself
    assert {kind: by_kind[kind]["leaked"] for kind in KINDS} == dict.fromkeys(KINDS, "")  # planted values seen
    assert {r["leaked"] for r in reports} == {""}
    assert not any(name in by_kind[kind]["names"].split(",") for kind in KINDS for name in planted)

    kinds = {view.kind for view in tree}
    assert {"stream-ops worker", "Spark JVM", "Spark Python worker", "row process"} <= kinds, kinds
    assert secrets_shown(tree, planted) == []
