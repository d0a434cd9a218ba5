"""The Kafka jars stream_ops needs, fetched once from Maven into a cache directory.

Two sets, each resolved with Maven (``mvn dependency:copy-dependencies`` on a generated
minimal pom, runtime scope) and kept under :func:`jars_cache_dir`:

* ``kafka-broker-<version>``: ``org.apache.kafka:kafka_2.13`` and its runtime dependencies,
  the classpath of the embedded broker (:mod:`stream_ops.kafka.embedded`), which runs in its
  own JVM.
* ``spark-sql-kafka-<spark version>``: Spark's Kafka connector
  ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed pyspark's version, plus those
  of its runtime dependencies that ``pyspark/jars`` lacks (``kafka-clients``,
  ``spark-token-provider-kafka``, ``commons-pool2``, ...). A dependency pyspark already ships
  (in any version: ``hadoop-client-runtime``, ``slf4j-api``, ``lz4-java``, ...) is left out, so
  the driver never has two copies of a class. :func:`spark_kafka_jars` lists the jars for
  ``spark.jars``. While Maven Central has no connector of pyspark's version yet, the newest
  published one is fetched instead, into ``spark-sql-kafka-<its version>-for-spark-<spark
  version>``: a directory is named for the jars it holds.

A set is complete when its marker file (``<set>/.complete``, JSON: the coordinates and jar
names) exists and names jars that are all there; until then it is fetched into a temporary
directory and renamed into place, under a lock file, so concurrent callers fetch it once and
nobody sees half a set. Fetching needs ``mvn`` (Debian package ``maven``) and Maven Central (or
the mirror in ``~/.m2/settings.xml``); it takes a minute or two the first time, nothing later.

Earlier releases kept that fallback under the name of pyspark's version; such a directory is
still used as it is, and the next fetch (``python -m stream_ops.kafka.jars``) renames it to the
name of what it holds, leaving a symlink under the old name for processes started with its paths.

Run ``python -m stream_ops.kafka.jars`` to fetch both sets (``tests/run.sh`` does).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stream_ops.errors import KafkaJarsError

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.3.1"
"""The Kafka release of the embedded broker."""
SCALA_BINARY = "2.13"
"""The Scala binary version of pyspark 4 (and of the Kafka and connector jars)."""
NEWEST_PUBLISHED_CONNECTOR = "4.2.0"
"""The newest ``spark-sql-kafka-0-10_2.13`` on Maven Central when this was written. The connector
of a Spark release is published some time after pyspark's wheel (4.3.0's was not there yet):
this one is fetched when pyspark's own version is not published. It runs on Spark 4.3.0 (the
Kafka tests exercise it). Its directory names both versions (``spark-sql-kafka-4.2.0-for-spark-4.3.0``):
delete it to fetch the exact connector once it is published."""
CONNECTOR_VERSION_ENV = "STREAM_OPS_SPARK_KAFKA_VERSION"
"""Environment variable naming the connector version to fetch instead of pyspark's."""
BROKER_LOG_BINDING = "org.apache.logging.log4j:log4j-slf4j-impl:2.25.4"
"""The slf4j 1.x binding to log4j2 (Kafka's distribution ships it; its pom does not), so the
broker's log reaches its log file instead of slf4j's no-op logger."""
MARKER_NAME = ".complete"
MVN_TIMEOUT_S = 900.0
"""How long one Maven resolution may take (a cold ``~/.m2`` downloads ~40 MiB)."""
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


@dataclass(frozen=True)
class JarSet:
    """A set of Maven artifacts with their runtime dependencies, fetched into one directory.

    Attributes:
        name: the directory name under the cache of the artifacts themselves (carries the
            versions, so another version is another set).
        artifacts: ``group:artifact:version`` coordinates.
        skip_present_in: a directory of jars (pyspark's): a dependency whose artifact has a jar
            there, in any version, is left out of the set.
        fallback_version: the version fetched instead when Maven Central does not have the
            artifacts' own (yet); the marker records which was taken.
        fallback_name: the directory name of the set when ``fallback_version`` was fetched
            (required with it: a directory is named for what it holds).
    """

    name: str
    artifacts: tuple[str, ...]
    skip_present_in: Path | None = None
    fallback_version: str | None = None
    fallback_name: str | None = None

    def __post_init__(self) -> None:
        if (self.fallback_version is None) != (self.fallback_name is None):
            raise ValueError(f"jar set {self.name!r}: give fallback_version and fallback_name together")

    @property
    def fallback_artifacts(self) -> tuple[str, ...] | None:
        """:attr:`artifacts` at :attr:`fallback_version` (None without one)."""
        if self.fallback_version is None:
            return None
        return tuple(f"{c.rpartition(':')[0]}:{self.fallback_version}" for c in self.artifacts)

    def directory_name(self, fetched: Sequence[str]) -> str:
        """The directory holding the set when Maven fetched the coordinates ``fetched``."""
        if self.fallback_name is not None and tuple(fetched) == self.fallback_artifacts:
            return self.fallback_name
        return self.name


def jars_cache_dir() -> Path:
    """``$STREAM_OPS_CACHE/jars``, or ``~/.cache/stream_ops/jars`` (the cache stream_ops uses)."""
    root = os.environ.get("STREAM_OPS_CACHE") or str(Path.home() / ".cache" / "stream_ops")
    return Path(root) / "jars"


def pyspark_version() -> str:
    """The installed pyspark's version (``4.3.0``)."""
    import pyspark

    return str(pyspark.__version__)


def pyspark_jars() -> Path:
    """The installed pyspark's ``jars`` directory."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def broker_jar_set(version: str = KAFKA_VERSION) -> JarSet:
    """The embedded broker's classpath: ``kafka_2.13:<version>`` with its runtime dependencies."""
    return JarSet(f"kafka-broker-{version}", (f"org.apache.kafka:kafka_{SCALA_BINARY}:{version}", BROKER_LOG_BINDING))


def connector_jar_set(spark_version: str | None = None) -> JarSet:
    """Spark's Kafka connector at ``spark_version`` (default: pyspark's) and what pyspark lacks of its dependencies.

    Example:
        >>> jar_set = connector_jar_set("4.3.0")
        >>> jar_set.name, jar_set.fallback_name
        ('spark-sql-kafka-4.3.0', 'spark-sql-kafka-4.2.0-for-spark-4.3.0')
    """
    version = os.environ.get(CONNECTOR_VERSION_ENV) or spark_version or pyspark_version()
    fallback = NEWEST_PUBLISHED_CONNECTOR if version != NEWEST_PUBLISHED_CONNECTOR else None
    return JarSet(
        f"spark-sql-kafka-{version}",
        (f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{version}",),
        skip_present_in=pyspark_jars(),
        fallback_version=fallback,
        fallback_name=f"spark-sql-kafka-{fallback}-for-spark-{version}" if fallback is not None else None,
    )


# --- fetching ------------------------------------------------------------------------------


def find_mvn() -> str:
    """The ``mvn`` executable (``$MAVEN_HOME/bin/mvn`` or ``mvn`` on PATH).

    Raises:
        KafkaJarsError: Maven is not installed.
    """
    maven_home = os.environ.get("MAVEN_HOME") or os.environ.get("M2_HOME")
    if maven_home:
        candidate = Path(maven_home) / "bin" / "mvn"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("mvn")
    if found:
        return found
    raise KafkaJarsError(
        "Maven (`mvn`) is needed once to fetch the Kafka jars and is not installed: "
        "`apt-get install maven` (or put mvn on PATH / set MAVEN_HOME), then run `python -m stream_ops.kafka.jars`"
    )


def _pom(artifacts: Sequence[str]) -> str:
    dependencies = []
    for coordinates in artifacts:
        parts = coordinates.split(":")
        if len(parts) != 3 or not all(parts):
            raise KafkaJarsError(f"bad Maven coordinates {coordinates!r}: use group:artifact:version")
        group, artifact, version = parts
        dependencies.append(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>"
        )
    return "\n".join(
        [
            '<project xmlns="http://maven.apache.org/POM/4.0.0">',
            "  <modelVersion>4.0.0</modelVersion>",
            "  <groupId>stream-ops.local</groupId>",
            "  <artifactId>jar-fetch</artifactId>",
            "  <version>1</version>",
            "  <packaging>pom</packaging>",
            "  <dependencies>",
            *dependencies,
            "  </dependencies>",
            "</project>",
            "",
        ]
    )


def _present_artifacts(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in directory.iterdir() if p.name.endswith(".jar"))
    except OSError:
        return []


def _shipped(artifact_id: str, present: Sequence[str]) -> bool:
    """Whether a jar of ``artifact_id`` (any version) is among the jar names ``present``."""
    pattern = re.compile(re.escape(artifact_id) + r"-\d")
    return any(pattern.match(name) for name in present)


class _NotPublishedError(KafkaJarsError):
    """Maven Central has no such artifact version."""


def _run_mvn(mvn: str, pom_dir: Path, output: Path) -> None:
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom_dir / "pom.xml"),
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={output}",
        "-DincludeScope=runtime",
        "-Dmdep.useRepositoryLayout=true",
    ]
    logger.info("fetching jars: %s", " ".join(command))
    try:
        done = subprocess.run(command, cwd=pom_dir, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise KafkaJarsError(f"Maven did not finish fetching jars in {MVN_TIMEOUT_S:.0f} s: {' '.join(command)}") from e
    except OSError as e:
        raise KafkaJarsError(f"could not run Maven ({mvn}): {e}") from e
    if done.returncode != 0:
        text = done.stdout + done.stderr
        tail = "\n".join(text.strip().splitlines()[-25:])
        error = _NotPublishedError if "Could not find artifact" in text or "was not found in" in text else KafkaJarsError
        raise error(
            f"Maven could not fetch the jars (exit {done.returncode}); is Maven Central (or the mirror in "
            f"~/.m2/settings.xml) reachable and are the versions published? Last lines:\n{tail}"
        )


def _resolve(mvn: str, jar_set: JarSet, work_dir: Path) -> tuple[Path, tuple[str, ...]]:
    """Run Maven for ``jar_set`` in ``work_dir``: (the repository-layout directory of the jars,
    the coordinates fetched), falling back to :attr:`JarSet.fallback_version` when the
    versions asked for are not published."""
    attempts = [jar_set.artifacts]
    if jar_set.fallback_artifacts is not None:
        attempts.append(jar_set.fallback_artifacts)
    for number, artifacts in enumerate(attempts):
        (work_dir / "pom.xml").write_text(_pom(artifacts), encoding="utf-8")
        resolved = work_dir / f"resolved-{number}"
        try:
            _run_mvn(mvn, work_dir, resolved)
        except _NotPublishedError:
            if number + 1 == len(attempts):
                raise
            logger.warning(
                "%s: not published on Maven Central; fetching version %s instead",
                ", ".join(artifacts),
                jar_set.fallback_version,
            )
            continue
        return resolved, artifacts
    raise AssertionError("unreachable")  # pragma: no cover


def _read_marker(directory: Path, jar_set: JarSet, fetched: Sequence[str]) -> list[Path] | None:
    """The jars of a complete set of ``jar_set`` for which Maven fetched ``fetched``, None when
    the set is missing, incomplete, damaged or holds other artifacts."""
    try:
        marker = json.loads((directory / MARKER_NAME).read_text(encoding="utf-8"))
        jars = [directory / str(name) for name in marker["jars"]]
        asked, artifacts = marker["asked"], marker["artifacts"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if asked != list(jar_set.artifacts) or artifacts != list(fetched):
        return None
    return jars if jars and all(jar.is_file() for jar in jars) else None


def _locate(root: Path, jar_set: JarSet) -> tuple[list[Path], bool] | None:
    """``(jars, under its old name)`` of the complete set in the cache ``root``, None without one.

    Looked for in turn: the artifacts' own version under :attr:`JarSet.name`, the fallback under
    :attr:`JarSet.fallback_name`, and the fallback under :attr:`JarSet.name`, where earlier
    releases kept it (``True``: to be renamed by :func:`fetch_jar_set`).
    """
    found = _read_marker(root / jar_set.name, jar_set, jar_set.artifacts)
    if found is not None:
        return found, False
    fallback = jar_set.fallback_artifacts
    if fallback is None or jar_set.fallback_name is None:
        return None
    found = _read_marker(root / jar_set.fallback_name, jar_set, fallback)
    if found is not None:
        return found, False
    found = _read_marker(root / jar_set.name, jar_set, fallback)
    return (found, True) if found is not None else None


def _rename_old_fallback(root: Path, jar_set: JarSet) -> list[Path]:
    """Move a fallback set kept under :attr:`JarSet.name` (earlier releases) to
    :attr:`JarSet.fallback_name`, leaving a symlink under the old name: a process started with
    the old paths (a worker's ``spark.jars``, which Spark serves to executors) keeps reading them."""
    assert jar_set.fallback_name is not None and jar_set.fallback_artifacts is not None
    old, new = root / jar_set.name, root / jar_set.fallback_name
    if new.is_symlink() or new.exists():  # not a complete set, or _locate would have found it
        _remove(new)
    old.rename(new)
    old.symlink_to(new.name)
    logger.info("renamed %s to %s, the connector version it holds (a symlink stays under the old name)", old, new)
    found = _read_marker(new, jar_set, jar_set.fallback_artifacts)
    if found is None:  # pragma: no cover - was complete a moment ago, under the lock
        raise KafkaJarsError(f"{new}: the jars vanished while the set was renamed; run `python -m stream_ops.kafka.jars` again")
    return found


def _remove(path: Path) -> None:
    """Remove a file, symlink (not what it points to) or directory tree."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created, with its directory, when
    missing) for the block: how the processes that fill a cache take turns, so that one of them
    builds an entry and the others, once they hold the lock, find it complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_jar_set(jar_set: JarSet, cache_dir: Path | None = None) -> list[Path]:
    """The jars of ``jar_set`` in the cache, fetched with Maven unless they are there already.

    Idempotent: a complete set (see the module doc) is returned as it is, without running Maven.

    Returns:
        The jar paths, sorted by name.

    Raises:
        KafkaJarsError: Maven is missing or failed (the message says why), or it resolved no jar.
    """
    root = cache_dir if cache_dir is not None else jars_cache_dir()
    located = _locate(root, jar_set)
    if located is not None and not located[1]:
        return located[0]
    with cache_lock(root / f".{jar_set.name}.lock"):
        located = _locate(root, jar_set)  # fetched (or renamed) by another process while we waited
        if located is not None:
            return _rename_old_fallback(root, jar_set) if located[1] else located[0]
        started = time.monotonic()
        mvn = find_mvn()
        present = _present_artifacts(jar_set.skip_present_in) if jar_set.skip_present_in is not None else []
        with tempfile.TemporaryDirectory(prefix=f".{jar_set.name}-", dir=root) as work:
            work_dir = Path(work)
            resolved, wanted = _resolve(mvn, jar_set, work_dir)
            staged = work_dir / "jars"
            staged.mkdir()
            kept: list[str] = []
            skipped: list[str] = []
            coordinates: list[str] = []
            for jar in sorted(resolved.rglob("*.jar")):
                # repository layout: <group path>/<artifact>/<version>/<file>
                artifact_id = jar.parent.parent.name
                if _shipped(artifact_id, present):
                    skipped.append(jar.name)
                    continue
                shutil.copy2(jar, staged / jar.name)
                kept.append(jar.name)
                group = ".".join(jar.relative_to(resolved).parts[:-3])
                coordinates.append(f"{group}:{artifact_id}:{jar.parent.name}")
            if not kept:
                raise KafkaJarsError(f"Maven resolved no jar for {', '.join(jar_set.artifacts)}")
            marker = {
                "artifacts": list(wanted),
                "asked": list(jar_set.artifacts),
                "jars": sorted(kept),
                "resolved": sorted(coordinates),
                "skipped": skipped,
            }
            (staged / MARKER_NAME).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
            target = root / jar_set.directory_name(wanted)
            if target.is_symlink() or target.exists():  # an incomplete or damaged earlier attempt
                _remove(target)
            staged.rename(target)
        logger.info(
            "fetched %d jars of %s into %s in %.1f s (%d already in pyspark, left out)",
            len(kept),
            jar_set.name,
            target,
            time.monotonic() - started,
            len(skipped),
        )
    found = _read_marker(target, jar_set, wanted)
    if found is None:  # pragma: no cover - just written
        raise KafkaJarsError(f"{target}: the jars vanished right after they were fetched")
    return found


def broker_jars(cache_dir: Path | None = None) -> list[Path]:
    """The embedded broker's classpath (fetched on first use)."""
    return fetch_jar_set(broker_jar_set(), cache_dir)


def spark_kafka_jars(cache_dir: Path | None = None) -> list[Path]:
    """The jars Spark needs besides pyspark's for its Kafka source and sink (fetched on first use).

    Give them to the SparkSession when it is built, before the JVM starts::

        create_spark_session(kafka_connector=True)
    """
    return fetch_jar_set(connector_jar_set(), cache_dir)


def cached_jar_set(jar_set: JarSet, cache_dir: Path | None = None) -> list[Path] | None:
    """The jars of ``jar_set`` when the cache holds the complete set, None otherwise (never fetches
    nor renames: a set under its old name is returned where it is)."""
    root = cache_dir if cache_dir is not None else jars_cache_dir()
    located = _locate(root, jar_set)
    return located[0] if located is not None else None


def with_kafka_connector(conf: Mapping[str, str], *, fetch: bool, cache_dir: Path | None = None) -> dict[str, str]:
    """``conf`` with Spark's Kafka connector jars appended to its ``spark.jars``.

    Args:
        conf: Spark settings (left unchanged).
        fetch: fetch the jars with Maven when the cache does not have them; when False, a cache
            without them leaves ``conf`` as it is (logged at debug level).
        cache_dir: the jar cache (default :func:`jars_cache_dir`).

    Raises:
        KafkaJarsError: ``fetch`` and the jars cannot be fetched.
    """
    jars = spark_kafka_jars(cache_dir) if fetch else cached_jar_set(connector_jar_set(), cache_dir)
    merged = dict(conf)
    if jars is None:
        logger.debug("Spark's Kafka connector is not in the jar cache; Spark starts without it")
        return merged
    present = [item for item in merged.get("spark.jars", "").split(",") if item.strip()]
    merged["spark.jars"] = ",".join([*present, *(str(jar) for jar in jars if str(jar) not in present)])
    return merged


def spark_jars_conf(cache_dir: Path | None = None) -> str:
    """:func:`spark_kafka_jars` as the comma-separated value of ``spark.jars``."""
    return ",".join(str(jar) for jar in spark_kafka_jars(cache_dir))


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch both sets and say where they are; with ``--spark-jars`` print only the value of
    ``spark.jars`` (``stream-ops worker --spark-conf spark.jars=$(python -m stream_ops.kafka.jars --spark-jars)``).
    Exit 1 (with the reason) when they cannot be fetched."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m stream_ops.kafka.jars", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spark-jars", action="store_true", help="print only the comma-separated jars for spark.jars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.spark_jars else logging.INFO, format="%(message)s")
    try:
        if args.spark_jars:
            print(spark_jars_conf())
            return 0
        for jar_set in (broker_jar_set(), connector_jar_set()):
            jars = fetch_jar_set(jar_set)
            print(f"{jars[0].parent.name}: {len(jars)} jars in {jars[0].parent}")
    except KafkaJarsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
