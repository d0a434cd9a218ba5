"""stream_ops' own JVM classes: Java sources shipped in ``spark/java/``, built into one jar.

The classes are small and stand in where Spark and Hadoop take a slow or blind path on one
machine: the java.nio checkpoint file system (:mod:`stream_ops.spark.local_fs`), the clock
that starts a shuffle stage's batch when its input lands (:mod:`stream_ops.spark.input_wake`),
the shuffle-queue source whose offsets do not grow (:mod:`stream_ops.spark.shuffle_queue`)
and the sink that hands a task its batches unplanned (:mod:`stream_ops.spark.callback_sink`).
They are compiled once per machine with the JDK's ``javac`` into the jar cache
(:func:`jvm_classes_jar`) and put on the driver's class path when this process starts the JVM.
Without a JDK, or when the JVM was started elsewhere, each user of a class falls back to
Spark's and Hadoop's own behaviour (:func:`loadable` tells).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from stream_ops.kafka.jars import jars_cache_dir

logger = logging.getLogger(__name__)

CLASS_PATH_KEY = "spark.driver.extraClassPath"

_CLASSES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
"""Per py4j gateway (one JVM), the class handles :func:`jvm_class` looked up (None: not loadable)."""
_CLASSES_LOCK = threading.Lock()

_SOURCES = Path(__file__).parent / "java"
_COMPILE_AGAINST = (
    "hadoop-client-api-*.jar",
    "spark-core_*.jar",
    "scala-library-*.jar",
    "spark-catalyst_*.jar",
    "spark-sql-api_*.jar",
    "spark-sql_*.jar",
)
"""The pyspark jars the sources compile against (Hadoop's file system API, Spark's ``Clock``,
the data source V2 interfaces, ``StructType`` and the streaming sink interfaces)."""


def jvm_classes_jar(cache: Path | None = None) -> Path | None:
    """The jar of stream_ops' JVM classes, compiled into ``cache`` (the jar cache by default)
    the first time; None when it cannot be built (no ``javac``/``jar``, or they failed:
    logged), and Spark then runs without them.

    The jar's name carries a digest of the sources and of the jars they compile against, so
    an upgrade builds a new one; concurrent builders each rename a complete jar into place.
    """
    sources = sorted(_SOURCES.rglob("*.java"))
    against = _compile_classpath()
    if not sources or against is None:
        logger.info("no Spark or Hadoop API jars in pyspark or no Java sources: running without stream_ops' JVM classes")
        return None
    digest = hashlib.sha256("".join(jar.name for jar in against).encode())
    for source in sources:
        digest.update(source.read_bytes())
    directory = cache or jars_cache_dir()
    jar = directory / f"stream-ops-jvm-{digest.hexdigest()[:12]}.jar"
    if jar.is_file():
        return jar
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        logger.info(
            "no JDK (javac, jar) on PATH: Spark's checkpoint writes fork chmod per file and shuffle stages wait "
            "for their next trigger (install a JDK to avoid both)"
        )
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".jvm-classes-") as work:
            classes = Path(work) / "classes"
            built = Path(work) / "classes.jar"
            classpath = os.pathsep.join(str(p) for p in against)
            _run([javac, "--release", "17", "-nowarn", "-cp", classpath, "-d", str(classes), *map(str, sources)])
            _run([jar_tool, "cf", str(built), "-C", str(classes), "."])
            os.replace(built, jar)
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("could not build %s (%s): running without stream_ops' JVM classes", jar.name, e)
        return None
    logger.info("built %s", jar)
    return jar


def with_jvm_classes(settings: Mapping[str, str], jar: Path | None) -> dict[str, str]:
    """``settings`` with ``jar`` added to the driver's class path (it counts only when the
    session's JVM is started with them)."""
    result = dict(settings)
    if jar is not None:
        current = result.get(CLASS_PATH_KEY)
        result[CLASS_PATH_KEY] = f"{current}{os.pathsep}{jar}" if current else str(jar)
    return result


def loadable(spark: SparkSession, name: str) -> bool:
    """Whether the session's JVM can load the class ``name`` (asked once per JVM)."""
    return jvm_class(spark, name) is not None


def jvm_class(spark: SparkSession, name: str) -> Any:
    """The py4j handle of the class ``name`` in the session's JVM, or None when it cannot load
    it. Looked up once per JVM: each step of a py4j path (``jvm.io.streamops...``) is a round
    trip to the JVM, 1-5 ms each on a busy driver, on every task start and batch otherwise."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    with _CLASSES_LOCK:
        known = _CLASSES.setdefault(gateway, {})
        if name not in known:
            try:
                gateway.jvm.java.lang.Class.forName(name)
            except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException in a generic error
                known[name] = None
            else:
                known[name] = getattr(gateway.jvm, name)
        return known[name]


def _compile_classpath() -> list[Path] | None:
    import pyspark

    jars_dir = Path(pyspark.__file__).parent / "jars"
    found: list[Path] = []
    for pattern in _COMPILE_AGAINST:
        matches = sorted(jars_dir.glob(pattern))
        if not matches:
            return None
        found.append(matches[-1])
    return found


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise subprocess.SubprocessError(f"{Path(command[0]).name} exited {result.returncode}: {result.stderr.strip()[:500]}")
