"""Checkpoint writes through the java.nio local file system (``spark/local_fs.py``).

The shared session binds ``file:`` for FileContext to ``NioLocalFs`` (built with the JDK on
this machine); files it creates get Hadoop's default permissions, links are still seen as links,
and the jar is built once and reused. Without a JDK the session falls back to Hadoop's classes.
"""

from __future__ import annotations

import stat

import pytest

from stream_ops.spark import jvm_classes, local_fs
from stream_ops.spark.jvm_classes import jvm_classes_jar
from stream_ops.spark.local_fs import BINDING_KEY, LOCAL_FS_CLASS, bind_local_fs


def _file_context(spark, path):
    jvm = spark.sparkContext._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return jvm.org.apache.hadoop.fs.FileContext.getFileContext(jvm.java.net.URI(path.as_uri()), conf), jvm


def _checkpoint_manager(spark, path):
    jvm = spark.sparkContext._jvm
    module = getattr(getattr(jvm.org.apache.spark.sql.execution.streaming.checkpointing, "CheckpointFileManager$"), "MODULE$")
    return module.create(jvm.org.apache.hadoop.fs.Path(str(path)), spark._jsparkSession.sessionState().newHadoopConf()), jvm


def test_the_session_writes_checkpoints_through_the_nio_file_system(spark, tmp_path):
    assert spark.sparkContext._jsc.hadoopConfiguration().get(BINDING_KEY) == LOCAL_FS_CLASS
    manager, jvm = _checkpoint_manager(spark, tmp_path)
    target = tmp_path / "offsets" / "7"
    manager.mkdirs(jvm.org.apache.hadoop.fs.Path(str(target.parent)))
    out = manager.createAtomic(jvm.org.apache.hadoop.fs.Path(str(target)), True)
    out.write(b"v1\n{}")
    out.close()
    assert target.read_bytes() == b"v1\n{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640, (
        "rw-r-----: the cluster's umask (fs.permissions.umask-mode 027, spark/local_fs.py)"
    )
    assert sorted(p.name for p in target.parent.iterdir()) == ["7"], "the temp file was renamed, no .crc file"


def test_links_are_still_links(spark, tmp_path):
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    context, jvm = _file_context(spark, tmp_path)
    assert context.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "link"))).isSymlink()
    plain = context.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "real")))
    assert not plain.isSymlink() and plain.getLen() == 1
    with pytest.raises(Exception, match="FileNotFoundException"):
        context.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "missing")))


def test_the_jar_is_built_once_and_reused(tmp_path, monkeypatch):
    jar = jvm_classes_jar(tmp_path)
    assert jar is not None and jar.is_file() and jar.parent == tmp_path
    monkeypatch.setattr(jvm_classes.shutil, "which", lambda name: None)  # no JDK any more
    assert jvm_classes_jar(tmp_path) == jar
    assert [p.name for p in tmp_path.iterdir()] == [jar.name], "no build directory left behind"


def test_without_a_jdk_no_jar_and_hadoops_binding(spark, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(jvm_classes.shutil, "which", lambda name: None)
    with caplog.at_level("INFO", logger="stream_ops.spark.jvm_classes"):
        assert jvm_classes_jar(tmp_path / "empty") is None
    assert "no JDK" in caplog.text
    monkeypatch.setattr(local_fs, "LOCAL_FS_CLASS", "io.streamops.hadoop.Missing")  # as if not on the class path
    try:
        assert bind_local_fs(spark) == "org.apache.hadoop.fs.local.RawLocalFs"
    finally:
        monkeypatch.undo()
        assert bind_local_fs(spark) == LOCAL_FS_CLASS


def test_a_failing_build_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(jvm_classes, "_SOURCES", tmp_path / "src")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "Broken.java").write_text("class Broken { nonsense }")
    with caplog.at_level("WARNING", logger="stream_ops.spark.jvm_classes"):
        assert jvm_classes_jar(tmp_path / "cache") is None
    assert "could not build" in caplog.text and "javac exited" in caplog.text
