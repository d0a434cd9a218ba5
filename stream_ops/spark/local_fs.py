"""Spark's checkpoint writes on the local file system without a forked ``chmod``.

Without Hadoop's native library (pyspark ships none), ``RawLocalFileSystem.setPermission``
runs the ``chmod`` command for every file it creates, and a streaming query creates three
checkpoint files per micro-batch (source log, offsets, commits): 15-18 ms each where the write
and rename take well under a millisecond (``CheckpointFileManager.createAtomic`` measured
18 ms, a java.nio write and move 3 ms through py4j, 2-core machine). With four queries per
worker that is the largest fixed cost of a small batch.

The fix is two small Java classes shipped as sources (``spark/java/``): Hadoop's local file
system with ``setPermission`` through java.nio, and its FileContext binding, which Spark's
checkpoint file manager uses. They are compiled once per machine with the JDK's ``javac`` into
the jar cache (:func:`local_fs_jar`), put on the driver's class path when this process starts
the JVM, and bound to ``file:`` for FileContext only (``fs.AbstractFileSystem.file.impl``, the
driver's checkpoint writes). Executors read and write files through Hadoop's FileSystem, not
FileContext, so a cluster's executors need no jar; only Spark's own state stores (stateful
Spark operators, which stream_ops does not use) write through FileContext on executors, and
would need the jar there. Without a JDK, or when the JVM was started elsewhere, Hadoop's
``RawLocalFs`` is bound instead (no ``.crc`` files: one file per entry, not two).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from stream_ops.kafka.jars import jars_cache_dir

logger = logging.getLogger(__name__)

LOCAL_FS_CLASS = "io.streamops.hadoop.NioLocalFs"
"""The FileContext file system bound to ``file:`` when its jar is on the driver's class path."""
FALLBACK_CLASS = "org.apache.hadoop.fs.local.RawLocalFs"
"""Hadoop's own binding without checksum files, used otherwise."""
BINDING_KEY = "fs.AbstractFileSystem.file.impl"
"""The Hadoop setting naming the FileContext implementation of ``file:``."""
CLASS_PATH_KEY = "spark.driver.extraClassPath"

_SOURCES = Path(__file__).parent / "java"


def local_fs_jar(cache: Path | None = None) -> Path | None:
    """The jar of the java.nio local file system, compiled into ``cache`` (the jar cache by
    default) the first time; None when it cannot be built (no ``javac``/``jar``, or they
    failed: logged), and Spark then uses Hadoop's classes.

    The jar's name carries a digest of the sources and the Hadoop API jar they compile
    against, so an upgrade builds a new one; concurrent builders each rename a complete jar
    into place.
    """
    sources = sorted(_SOURCES.rglob("*.java"))
    api = _hadoop_api_jar()
    if not sources or api is None:
        logger.info("no Hadoop API jar in pyspark or no Java sources: checkpoints through Hadoop's RawLocalFs")
        return None
    digest = hashlib.sha256(api.name.encode())
    for source in sources:
        digest.update(source.read_bytes())
    directory = cache or jars_cache_dir()
    jar = directory / f"stream-ops-local-fs-{digest.hexdigest()[:12]}.jar"
    if jar.is_file():
        return jar
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        logger.info("no JDK (javac, jar) on PATH: Spark's checkpoint writes fork chmod per file (install a JDK to avoid it)")
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".local-fs-") as work:
            classes = Path(work) / "classes"
            built = Path(work) / "local-fs.jar"
            _run([javac, "--release", "17", "-nowarn", "-cp", str(api), "-d", str(classes), *map(str, sources)])
            _run([jar_tool, "cf", str(built), "-C", str(classes), "."])
            os.replace(built, jar)
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("could not build %s (%s): checkpoints through Hadoop's RawLocalFs", jar.name, e)
        return None
    logger.info("built %s", jar)
    return jar


def with_local_fs_jar(settings: Mapping[str, str], jar: Path | None) -> dict[str, str]:
    """``settings`` with ``jar`` added to the driver's class path (it counts only when the
    session's JVM is started with them)."""
    result = dict(settings)
    if jar is not None:
        current = result.get(CLASS_PATH_KEY)
        result[CLASS_PATH_KEY] = f"{current}{os.pathsep}{jar}" if current else str(jar)
    return result


def bind_local_fs(spark: SparkSession) -> str:
    """Bind ``file:`` for FileContext in the driver's Hadoop configuration to the java.nio
    file system when the JVM can load it, else to Hadoop's ``RawLocalFs``; returns the class.

    A binding the session was configured with (``spark.hadoop.fs.AbstractFileSystem.file.impl``)
    is left as it is.
    """
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    if spark.sparkContext.getConf().contains(f"spark.hadoop.{BINDING_KEY}"):
        return str(conf.get(BINDING_KEY))
    chosen = LOCAL_FS_CLASS if _loadable(spark, LOCAL_FS_CLASS) else FALLBACK_CLASS
    conf.set(BINDING_KEY, chosen)
    logger.info("checkpoint writes through %s", chosen)
    return chosen


def _loadable(spark: SparkSession, name: str) -> bool:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        jvm.java.lang.Class.forName(name)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException in a generic error
        return False
    return True


def _hadoop_api_jar() -> Path | None:
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise subprocess.SubprocessError(f"{Path(command[0]).name} exited {result.returncode}: {result.stderr.strip()[:500]}")
