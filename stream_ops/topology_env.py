"""The environment of a process that runs topology code: an allow-list, not a deny-list.

A worker's own process (small batches run on its driver thread), its Spark JVM, Spark's Python
workers and its row processes all run the topologies' code, which can read the process's
environment and ``/proc/self/environ``. They keep only what starting Python, Java, Spark and
Hadoop needs (:data:`KEPT_NAMES`, :data:`KEPT_PREFIXES`) and the names the operator passes
through for the topologies' own use: ``stream-ops worker --pass-env NAME``,
``STREAM_OPS_WORKER_PASS_ENV=NAME,NAME`` or ``StreamClusterResource.worker_pass_env``, e.g. a
Kafka password a topology's conf names as ``env:KAFKA_PASSWORD``. Everything else is dropped,
whatever it is called: the secrets a worker needs itself (ZooKeeper credentials, the state-query
token) are read into memory before its environment is reduced (``stream-ops worker``), and those
of Dagster and its database never reach it. A pass-through of such a secret is refused
(:func:`check_pass_env`).

The Spark names are the ones pyspark's launcher (``java_gateway.py``, ``bin/spark-class``,
``bin/load-spark-env.sh``), Spark's launcher library and Spark core read to find and start the
JVM and bind its ports; Spark's own per-process variables (``PYTHONHASHSEED``, ``SPARK_HOME``
and the Python workers' factory settings) are added by Spark itself below this list.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from stream_ops.errors import TopologyEnvironmentError

logger = logging.getLogger(__name__)

PASS_ENV_VARIABLE = "STREAM_OPS_WORKER_PASS_ENV"
"""Names passed through to topology code, comma or space separated. It stays in the reduced
environment itself, so every process below the worker keeps the same names."""

KEPT_NAMES: frozenset[str] = frozenset(
    {
        # the process and its locale
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TMP",
        "TEMP",
        # Python (the flags that narrow what is imported stay: dropping them would widen it)
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONDONTWRITEBYTECODE",
        # OpenSSL's CA locations (TLS to Kafka, https): public, and dropping them would change what TLS trusts
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        # Java
        "JAVA_HOME",
        "LD_LIBRARY_PATH",
        # Spark: finding the installation and its configuration, starting and binding the JVM
        "SPARK_HOME",
        "SPARK_CONF_DIR",
        "SPARK_DIST_CLASSPATH",
        "SPARK_SCALA_VERSION",
        "SPARK_LOCAL_IP",
        "SPARK_LOCAL_HOSTNAME",
        "SPARK_PUBLIC_DNS",
        "SPARK_PREFER_IPV6",
        "SPARK_LOCAL_DIRS",
        "SPARK_USER",
        "PYSPARK_PYTHON",
        "PYSPARK_DRIVER_PYTHON",
        # Hadoop (checkpoints and files on HDFS, YARN)
        "HADOOP_CONF_DIR",
        "HADOOP_HOME",
        "HADOOP_USER_NAME",
        "YARN_CONF_DIR",
        # stream_ops: the jar cache, the Kafka connector a worker may fetch with Maven at start
        "STREAM_OPS_CACHE",
        "STREAM_OPS_SPARK_KAFKA_VERSION",
        "MAVEN_HOME",
        "M2_HOME",
        PASS_ENV_VARIABLE,
    }
)
"""Names every process running topology code keeps (when set)."""

KEPT_PREFIXES: tuple[str, ...] = ("LC_",)
"""Name prefixes every process running topology code keeps (the locale categories)."""

REFUSED_PREFIXES: Mapping[str, str] = {
    "STREAM_OPS_ZK_AUTH": "stream_ops' ZooKeeper credentials",
    "STREAM_OPS_QUERY_TOKEN": "stream_ops' state-query token",
    "STREAM_OPS_QUERY_TLS_KEY": "the private key of the workers' query port",
    "DAGSTER_": "Dagster's settings and secrets (its database password among them)",
    "PG": "PostgreSQL client settings and passwords (libpq's PG*)",
    "POSTGRES": "PostgreSQL settings and passwords",
    "MYSQL_": "MySQL settings and passwords (Dagster's MySQL storage)",
    "PYSPARK_GATEWAY_": "the py4j gateway's port and secret",
}
"""Name prefixes a pass-through may not name, with what they hold."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_kept(name: str) -> bool:
    """Whether every process running topology code keeps ``name`` (without a pass-through)."""
    return name in KEPT_NAMES or name.startswith(KEPT_PREFIXES)


def check_pass_env(names: Iterable[str]) -> tuple[str, ...]:
    """The pass-through ``names``, sorted and without repeats, once each is allowed.

    Raises:
        TopologyEnvironmentError: a name is not an environment variable name, or is one of
            :data:`REFUSED_PREFIXES` (a secret of stream_ops, Dagster or its database).
    """
    checked: set[str] = set()
    for name in names:
        if not _NAME.fullmatch(name):
            raise TopologyEnvironmentError(
                f"{name!r} is not an environment variable name: pass letters, digits and underscores "
                f"(--pass-env NAME, {PASS_ENV_VARIABLE}=NAME,NAME)"
            )
        for prefix, what in REFUSED_PREFIXES.items():
            if name.startswith(prefix):
                raise TopologyEnvironmentError(
                    f"{name} may not be passed through to topology code: {prefix}* is {what}. Remove it from "
                    f"--pass-env / {PASS_ENV_VARIABLE} / worker_pass_env; a topology that needs a secret gets one of "
                    "its own under its own name (e.g. KAFKA_PASSWORD, named as env:KAFKA_PASSWORD in its conf)"
                )
        checked.add(name)
    return tuple(sorted(checked))


def pass_env_names(environ: Mapping[str, str], given: Iterable[str] = ()) -> tuple[str, ...]:
    """The names passed through: ``given`` and those ``environ``'s :data:`PASS_ENV_VARIABLE` lists.

    Raises:
        TopologyEnvironmentError: one of them may not be passed through (:func:`check_pass_env`).
    """
    listed = re.split(r"[\s,]+", environ.get(PASS_ENV_VARIABLE, "").strip())
    return check_pass_env([*given, *(name for name in listed if name)])


def topology_environment(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """What of ``environ`` a process running topology code gets.

    Args:
        environ: The environment to reduce (e.g. ``os.environ``).
        pass_env: Names passed through besides those ``environ``'s :data:`PASS_ENV_VARIABLE`
            lists; the result lists them all there, so reducing it again changes nothing.

    Raises:
        TopologyEnvironmentError: a pass-through name is refused (:func:`check_pass_env`).
    """
    passed = pass_env_names(environ, pass_env)
    reduced = {name: value for name, value in environ.items() if is_kept(name) or name in passed}
    if passed:
        reduced[PASS_ENV_VARIABLE] = ",".join(passed)
    else:
        reduced.pop(PASS_ENV_VARIABLE, None)
    return reduced


def reduce_environ(pass_env: Iterable[str] = ()) -> list[str]:
    """Reduce ``os.environ`` in place to :func:`topology_environment`; children started from
    now on inherit only that.

    Returns:
        The names dropped, sorted (for a log line; never their values).

    Raises:
        TopologyEnvironmentError: a pass-through name is refused (:func:`check_pass_env`).
    """
    reduced = topology_environment(os.environ, pass_env)
    dropped = sorted(name for name in os.environ if name not in reduced)
    for name in dropped:
        del os.environ[name]
    os.environ.update(reduced)
    for name in pass_env_names(reduced):
        if name not in reduced:
            logger.warning("%s is passed through to topology code (%s) but is not set here", name, PASS_ENV_VARIABLE)
    return dropped


def exec_environment(path: Path = Path("/proc/self/environ")) -> dict[str, str] | None:
    """The environment this process was started with, as the kernel still shows it to anyone
    who may read ``/proc/<pid>/environ`` (the process itself included), whatever was removed
    from ``os.environ`` since; None where there is no such file (not Linux).
    """
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            found[os.fsdecode(name)] = os.fsdecode(value)
    return found
