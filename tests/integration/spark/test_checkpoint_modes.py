"""Spark checkpoints get the cluster's modes (``spark/local_fs.py``): Hadoop chmods what it
creates to its own umask, which stream_ops sets (``fs.permissions.umask-mode``), so no chmod is
needed afterwards. The shared session is the one CLI workers create; Dagster workers get the
same setting through ``DEFAULT_CONF``."""

from __future__ import annotations

import stat
from pathlib import Path

from stream_ops.config import ClusterConfig
from stream_ops.doctor import file_findings
from stream_ops.durable_files import make_dirs
from stream_ops.orchestration.resources import StreamClusterResource
from stream_ops.spark.local_fs import BINDING_KEY, UMASK_KEY, checkpoint_umask


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}


def test_checkpoints_and_their_checksum_files_are_private_without_a_chmod(spark, tmp_path):
    home = tmp_path / "cluster"
    make_dirs(home / "input")
    (home / "input" / "a.json").write_text('{"word": "cow"}\n{"word": "cow"}\n')
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    bound = conf.get(BINDING_KEY)
    # Hadoop's own checksummed local file system: one .crc file beside each checkpoint file.
    conf.set(BINDING_KEY, "org.apache.hadoop.fs.local.LocalFs")
    try:
        query = (
            spark.readStream.schema("word string")
            .json(str(home / "input"))
            .writeStream.foreachBatch(lambda frame, _: frame.collect())
            .option("checkpointLocation", str(home / "checkpoints" / "t" / "task-00000"))
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        conf.set(BINDING_KEY, bound)

    modes = _modes(home / "checkpoints")
    names = {Path(p).name for p in modes}
    assert {"metadata", ".metadata.crc", "offsets", "commits", "sources", "0", ".0.crc"} <= names, sorted(modes)
    wrong = {p: oct(m) for p, m in modes.items() if m != (0o750 if (home / "checkpoints" / p).is_dir() else 0o640)}
    assert wrong == {}, "Hadoop's default umask (022) gave 0755/0644"
    findings = {f.check: f.status for f in file_findings(ClusterConfig(root=home))}
    assert set(findings.values()) == {"ok"}, findings


def test_every_session_stream_ops_makes_carries_the_umask(spark):
    assert spark.sparkContext.getConf().get(f"spark.hadoop.{UMASK_KEY}") == "027"  # the CLI workers' session
    assert StreamClusterResource(root="/srv/so").spark_config()[f"spark.hadoop.{UMASK_KEY}"] == "027"  # Dagster's
    # A stricter cluster umask is kept; a looser one cannot open checkpoints beyond 0640/0750.
    assert (checkpoint_umask(0o077), checkpoint_umask(0o002)) == ("077", "027")
