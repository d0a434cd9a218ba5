"""Kafka Streams as a peer engine of ``bench/kafka.py``: the Java word count under
``bench/peers/kafka-streams/`` built with Maven once into the stream_ops cache, and one JVM
running it for a whole benchmark.

**Build.** ``mvn package dependency:copy-dependencies`` (runtime scope) on a copy of the project,
its jar and dependency jars kept in ``~/.cache/stream_ops/peers/kafka-streams-<digest>`` (or
under ``$STREAM_OPS_CACHE``), where the digest is that of ``pom.xml`` and the source: a changed
program is built again, an unchanged one never. Built in a temporary directory and renamed into
place under a lock file (:func:`stream_ops.kafka.jars.cache_lock`), as :mod:`stream_ops.kafka.jars`
fetches jars. Without Maven or Maven Central the build raises :class:`PeerBuildError` saying why
(the benchmark then skips the peer).

**Run.** :class:`KafkaStreamsPeer` starts ``java -cp <jars> stream_ops.peers.WordCount`` and
drives it over stdin/stdout (``start <application id> <input> <output> <state dir>`` ->
``started``; ``stop`` -> ``stopped``), so one JVM, warmed up by the benchmark's warm-up run,
serves every run, as the SparkSession does for the other engines.

Run ``.venv/bin/python bench/kafka_streams_peer.py`` to build it (or see where it is cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stream_ops.errors import KafkaJarsError
from stream_ops.jvm_server import die_with_parent, find_java
from stream_ops.kafka.jars import KAFKA_VERSION, cache_lock, find_mvn, jars_cache_dir

PROJECT = Path(__file__).resolve().parent / "peers" / "kafka-streams"
MAIN_CLASS = "stream_ops.peers.WordCount"
MARKER_NAME = ".complete"
MVN_TIMEOUT_S = 900.0
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
"""The heap the embedded broker gets; Kafka Streams' INFO log (every commit) left out."""
ANSWER_TIMEOUT_S = 60.0


class PeerBuildError(RuntimeError):
    """The Kafka Streams peer could not be built (no Maven, Maven Central not reachable, a
    compile error); the message says which."""


class PeerRunError(RuntimeError):
    """The Kafka Streams peer's JVM failed or did not answer."""


def project_digest(project: Path = PROJECT) -> str:
    """The first 12 hex digits of the SHA-256 of the project's ``pom.xml`` and sources."""
    digest = hashlib.sha256()
    for path in sorted(p for p in project.rglob("*") if p.is_file() and "target" not in p.relative_to(project).parts):
        digest.update(str(path.relative_to(project)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def peers_cache_dir() -> Path:
    """``peers`` beside the jar cache of :mod:`stream_ops.kafka.jars` (``~/.cache/stream_ops/peers``)."""
    return jars_cache_dir().parent / "peers"


def _complete(directory: Path) -> list[Path] | None:
    try:
        names = json.loads((directory / MARKER_NAME).read_text(encoding="utf-8"))["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    jars = [directory / str(name) for name in names]
    return jars if jars and all(jar.is_file() for jar in jars) else None


def build(project: Path = PROJECT, cache_dir: Path | None = None) -> list[Path]:
    """The peer's classpath (its jar first), built with Maven unless the cache has this version.

    Raises:
        PeerBuildError: Maven is missing, cannot reach Maven Central, or the build failed.
    """
    root = cache_dir if cache_dir is not None else peers_cache_dir()
    target = root / f"kafka-streams-{KAFKA_VERSION}-{project_digest(project)}"
    found = _complete(target)
    if found is not None:
        return found
    try:
        mvn = find_mvn()
    except KafkaJarsError as e:
        raise PeerBuildError(str(e)) from e
    with cache_lock(root / f".{target.name}.lock"):
        found = _complete(target)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=root) as work:
            copy = Path(work) / "project"
            shutil.copytree(project, copy, ignore=shutil.ignore_patterns("target"))
            command = [mvn, "-B", "-q", "package", "dependency:copy-dependencies", "-DincludeScope=runtime"]
            try:
                done = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired as e:
                raise PeerBuildError(f"Maven did not build the Kafka Streams peer in {MVN_TIMEOUT_S:.0f} s") from e
            except OSError as e:
                raise PeerBuildError(f"could not run Maven ({mvn}): {e}") from e
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
                raise PeerBuildError(
                    f"Maven could not build the Kafka Streams peer (exit {done.returncode}); is Maven Central (or the "
                    f"mirror in ~/.m2/settings.xml) reachable? Last lines:\n{tail}"
                )
            staged = Path(work) / "jars"
            staged.mkdir()
            built = sorted((copy / "target").glob("*.jar"))
            dependencies = sorted((copy / "target" / "dependency").glob("*.jar"))
            if len(built) != 1 or not dependencies:
                raise PeerBuildError(
                    f"Maven built {len(built)} jars and copied {len(dependencies)} dependencies (1 and some expected)"
                )
            for jar in [*built, *dependencies]:
                shutil.copy2(jar, staged / jar.name)
            marker = {"jars": [j.name for j in [*built, *dependencies]]}
            (staged / MARKER_NAME).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
            if target.exists():  # an incomplete earlier attempt
                shutil.rmtree(target)
            staged.rename(target)
    found = _complete(target)
    if found is None:  # pragma: no cover - just written
        raise PeerBuildError(f"{target}: the jars vanished right after they were built")
    return found


class KafkaStreamsPeer:
    """One JVM running the peer, started by :meth:`launch`, driven by :meth:`start`/:meth:`stop`.

    Args:
        classpath: from :func:`build`.
        bootstrap: the broker.
        threads: Kafka Streams' ``num.stream.threads``.
        commit_interval_s: ``commit.interval.ms`` / 1000.
        work: the state directories and the JVM's log (``kafka-streams.log``) go here.
    """

    def __init__(self, classpath: list[Path], bootstrap: str, *, threads: int, commit_interval_s: float, work: Path) -> None:
        self.work = work
        self.threads = threads
        self.commit_interval_s = commit_interval_s
        self._command = [
            find_java(),
            *JVM_OPTIONS,
            "-cp",
            os.pathsep.join(str(j) for j in classpath),
            MAIN_CLASS,
            bootstrap,
            str(threads),
            str(round(commit_interval_s * 1000)),
        ]
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, "launch() first"
        return self._proc.pid

    def launch(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self._log = open(self.work / "kafka-streams.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            preexec_fn=die_with_parent(),
        )

    def _ask(self, command: str, expected: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None, "launch() first"
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()  # the JVM answers every command or dies
        if answer != expected:
            raise PeerRunError(
                f"Kafka Streams answered {answer!r} to {command.split()[0]!r}; see {self.work / 'kafka-streams.log'}"
            )

    def start(self, application_id: str, input_topic: str, output_topic: str) -> None:
        """A new Kafka Streams application (its own group, state and internal topics) on the topics."""
        state = self.work / "state" / application_id
        state.mkdir(parents=True, exist_ok=True)
        self._ask(f"start {application_id} {input_topic} {output_topic} {state}", "started")

    def stop(self) -> None:
        """Close the running application (its state directory cleaned up)."""
        self._ask("stop", "stopped")

    def close(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # end of stdin ends the JVM
            try:
                self._proc.wait(ANSWER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def main() -> None:
    try:
        jars = build()
    except PeerBuildError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"Kafka Streams peer: {len(jars)} jars in {jars[0].parent}")


if __name__ == "__main__":
    main()
