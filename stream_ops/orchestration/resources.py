"""Dagster resources for the two external systems stream_ops talks to.

* :class:`ZooKeeperResource`: where the coordination data lives (hosts, chroot, timeouts,
  optional digest credentials). It builds a :class:`~stream_ops.config.ZooKeeperConfig`
  and opens :class:`~stream_ops.coordination.store.ZkStore` sessions.
* :class:`StreamClusterResource`: where the cluster keeps its files (dist store, topics,
  checkpoints, local state) and how workers launched from Dagster run (trigger, heartbeat
  interval, Spark master, state-query token and TLS...). It builds a
  :class:`~stream_ops.config.ClusterConfig` and :class:`~stream_ops.runtime.worker.WorkerSettings`.
* The workers' Spark settings are declared by dagster-pyspark's
  :class:`~dagster_pyspark.LazyPySparkResource`; :func:`pyspark_resource` builds one with
  stream_ops' session defaults and the cluster's Spark master. It starts no session in a run's
  process: a worker run starts a ``stream-ops worker`` process, which runs its own.

Validation reuses the core config models, so a bad value fails when the resource is built
(at code-location load time) with the same message the CLI gives. Fields given as
:class:`dagster.EnvVar` are validated when Dagster resolves them, at execution time.

Why a context manager and not a long-lived client:
    Dagster integration resources usually keep their client in a ``PrivateAttr`` created in
    ``setup_for_execution``. ZooKeeper sessions are different: they are cheap to open
    (one round trip), a session opened for a whole run would sit idle while ops do non-ZooKeeper
    work and could expire under them, and the same resource is used by sensors, whose resource
    teardown only runs when the sensor context is used as a context manager. So
    :meth:`ZooKeeperResource.store` opens one session for exactly the block that needs it and
    always closes it, in runs, sensors, tests and scripts alike.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import ConfigDict, Field, ValidationError, model_validator

from stream_ops.config import DEFAULT_CHROOT, DEFAULT_ZOOKEEPER, ClusterConfig, QueryConfig, ZooKeeperConfig
from stream_ops.coordination.store import ZkStore
from stream_ops.runtime.worker import WorkerSettings
from stream_ops.spark.jvm_classes import jvm_classes_jar, with_jvm_classes
from stream_ops.spark.local_fs import UMASK_KEY, checkpoint_umask
from stream_ops.spark.session import DEFAULT_CONF

__all__ = ["PYSPARK_RESOURCE_KEY", "StreamClusterResource", "ZooKeeperResource", "pyspark_resource"]

#: Resource key of the :class:`~dagster_pyspark.LazyPySparkResource` worker runs use.
PYSPARK_RESOURCE_KEY = "pyspark"

#: The worker-settings fields of :class:`StreamClusterResource` -> :class:`WorkerSettings` field.
_WORKER_FIELDS: Mapping[str, str] = {
    "worker_host": "host",
    "worker_bind_host": "bind_host",
    "worker_capacity": "capacity",
    "heartbeat_interval_s": "heartbeat_interval_s",
    "poll_interval_s": "poll_interval_s",
    "spark_master": "spark_master",
    "spark_conf": "spark_conf",
    "trigger_seconds": "trigger_seconds",
    "shuffle_trigger_seconds": "shuffle_trigger_seconds",
    "max_files_per_trigger": "max_files_per_trigger",
}

#: The state-query fields of :class:`StreamClusterResource` -> :class:`QueryConfig` field.
_QUERY_FIELDS: Mapping[str, str] = {
    "query_token": "token",
    "query_tls_cert": "tls_cert",
    "query_tls_key": "tls_key",
    "query_tls_ca": "tls_ca",
}


def _literal_values(data: Any, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """The fields of ``data`` given as literal values (not ``EnvVar``), or None if not a dict."""
    if not isinstance(data, dict):
        return None
    return {k: v for k, v in data.items() if k in fields and v is not None and not isinstance(v, dg.EnvVar)}


def _explain(resource: str, error: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """One readable line per problem: ``field: what to fix`` (core field names mapped back by ``names``)."""
    problems = []
    for item in error.errors():
        where = ".".join((names or {}).get(str(p), str(p)) for p in item["loc"]) or "config"
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
    return f"invalid {resource} configuration: " + "; ".join(problems)


class ZooKeeperResource(dg.ConfigurableResource):
    """How to reach the ZooKeeper ensemble that coordinates stream_ops topologies.

    Example:
        >>> zookeeper = ZooKeeperResource(hosts="127.0.0.1:2181", chroot="/stream_ops")
        >>> zookeeper.config().connection_string
        '127.0.0.1:2181/stream_ops'
        >>> with zookeeper.store() as store:  # doctest: +SKIP
        ...     store.children("/storms")
    """

    hosts: str = Field(
        default=DEFAULT_ZOOKEEPER,
        description="Comma-separated ZooKeeper servers, each written host:port, e.g. 'zk1:2181,zk2:2181'.",
    )
    chroot: str = Field(
        default=DEFAULT_CHROOT,
        description="Root znode under which all stream_ops data lives, e.g. '/stream_ops'. Created if missing.",
    )
    session_timeout_s: float = Field(
        default=10.0,
        description="ZooKeeper session timeout in seconds (> 0).",
    )
    connect_timeout_s: float = Field(
        default=10.0,
        description="Seconds to wait for the first connection before giving up (> 0).",
    )
    auth_digest: str | None = Field(
        default=None,
        repr=False,
        description="Optional digest credentials 'user:password'; use an EnvVar, never a literal secret.",
    )
    open_reads: bool = Field(
        default=False,
        description="With auth_digest: let anyone read the znodes stream_ops creates (writes stay the cluster's).",
    )
    insecure: bool = Field(
        default=False,
        description=(
            "Let worker runs start without auth_digest, on a ZooKeeper tree anyone who reaches it can rewrite. "
            "Only for a local development stack (stream-ops dev sets it); a cluster deployment leaves it off, "
            "so a worker run without credentials fails."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _validate_with_core_config(cls, data: Any) -> Any:
        """Fail fast with the core config's message; EnvVar fields are checked once resolved."""
        literal = _literal_values(data, tuple(ZooKeeperConfig.model_fields))
        if literal is not None and "auth_digest" not in literal:
            # open_reads needs auth_digest, insecure excludes it; when it is an EnvVar they are checked later.
            literal.pop("open_reads", None)
        if literal:
            try:
                ZooKeeperConfig.model_validate(literal)
            except ValidationError as e:
                raise ValueError(_explain("ZooKeeperResource", e)) from e
        return data

    def config(self) -> ZooKeeperConfig:
        """The core :class:`ZooKeeperConfig` these fields describe."""
        return ZooKeeperConfig(
            hosts=self.hosts,
            chroot=self.chroot,
            session_timeout_s=self.session_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            auth_digest=self.auth_digest,
            open_reads=self.open_reads,
            insecure=self.insecure,
        )

    @contextlib.contextmanager
    def store(self) -> Iterator[ZkStore]:
        """Open a ZooKeeper session for the duration of a ``with`` block.

        Yields:
            A connected :class:`ZkStore` under :attr:`chroot`, closed when the block exits.

        Raises:
            ZooKeeperUnavailableError: No server answered within ``connect_timeout_s``.
            CoordinationError: The session could not be opened (e.g. bad credentials).
        """
        with ZkStore.connect(self.config()) as store:
            yield store


class StreamClusterResource(dg.ConfigurableResource):
    """Where the stream_ops cluster keeps its files (shared by workers, nimbus and Dagster).

    Only ``root`` is required in practice; the other directories default to sub-directories
    of it. Relative paths are resolved against the working directory of the process that uses
    them, so code locations should pass absolute paths.

    Example:
        >>> cluster = StreamClusterResource(root="/srv/stream_ops")
        >>> str(cluster.config().resolved_dist_dir())
        '/srv/stream_ops/dist'
    """

    # A validation error never repeats the input: it may hold query_token.
    model_config = ConfigDict(hide_input_in_errors=True)

    root: str = Field(
        default="var/stream_ops",
        description="Base directory of the cluster; everything below defaults to a sub-directory of it.",
    )
    dist_dir: str | None = Field(
        default=None,
        description="Dist store (plan, conf and code of each submission). Default: <root>/dist.",
    )
    topics_root: str | None = Field(
        default=None,
        description="Internal topics (shuffle, state, dead letters). Default: <root>/topics.",
    )
    checkpoints_root: str | None = Field(
        default=None,
        description="Spark checkpoints, one per task; must be shared by all workers. Default: <root>/checkpoints.",
    )
    local_state_dir: str | None = Field(
        default=None,
        description="Local RocksDB stores of the workers on this machine. Default: <root>/local.",
    )
    topology_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="Conf every topology submitted from Dagster gets unless its own conf sets the key, e.g. "
        '{"state_topic": "kafka", "state_topic_bootstrap": "kafka:9092"}.',
    )

    # --- how workers launched from Dagster run (-> WorkerSettings) ---------------------------
    worker_host: str = Field(
        default="127.0.0.1",
        description="Host name other processes reach Dagster-launched workers by (their slot is host:port).",
    )
    worker_bind_host: str = Field(
        default="127.0.0.1",
        description="Interface the workers' state-query server binds to (0.0.0.0 for all).",
    )
    worker_capacity: int = Field(default=64, description="Most tasks one worker runs at once (>= 1).")
    trigger_seconds: float = Field(
        default=1.0,
        description="Spark trigger interval of the task queries that read a source, in seconds (>= 0; 0 = as fast as possible).",
    )
    shuffle_trigger_seconds: float | None = Field(
        default=None,
        description="Trigger interval of the task queries that read a shuffle (every stage after the first); "
        "None: trigger_seconds. Shorter lowers the wait between stages at the cost of idle triggers.",
    )
    max_files_per_trigger: int = Field(
        default=100, description="Most input files one micro-batch reads (>= 1); keep above arrival rate x trigger."
    )
    heartbeat_interval_s: float = Field(
        default=2.0, description="Seconds between a worker's heartbeats (> 0); keep well below the heartbeat timeout."
    )
    poll_interval_s: float = Field(
        default=0.5, description="Seconds between a worker's reconciliations with its assignment (> 0)."
    )
    spark_master: str = Field(
        default="local[*]",
        description="Spark master of the workers' SparkSession, e.g. 'local[2]' or 'spark://host:7077'.",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark configuration of the workers' SparkSession (overrides stream_ops' defaults).",
    )
    worker_pass_env: list[str] = Field(
        default_factory=list,
        description="Environment variables of the Dagster process that its workers' topology code may read "
        "(stream-ops worker --pass-env), e.g. KAFKA_PASSWORD for a conf naming env:KAFKA_PASSWORD. Workers get "
        "only these and what Python, Java and Spark need to start; stream_ops, Dagster and database secrets "
        "(STREAM_OPS_ZK_AUTH*, STREAM_OPS_QUERY_TOKEN*, DAGSTER_*, PG*) are refused when a worker run starts.",
    )

    # --- state queries of Dagster-launched workers (-> QueryConfig) --------------------------
    query_token: str | None = Field(
        default=None,
        repr=False,
        description=(
            "Bearer token of state queries, overriding the one derived from ZooKeeperResource.auth_digest; "
            "use an EnvVar, never a literal secret."
        ),
    )
    query_tls_cert: str | None = Field(
        default=None, description="PEM certificate the workers' query servers present; must name worker_host."
    )
    query_tls_key: str | None = Field(default=None, description="PEM private key of query_tls_cert.")
    query_tls_ca: str | None = Field(
        default=None, description="PEM CA bundle the workers' certificates are verified against (queries use https)."
    )

    @model_validator(mode="before")
    @classmethod
    def _validate_paths(cls, data: Any) -> Any:
        """Reject empty paths and bad worker settings with a message naming the field."""
        literal = _literal_values(data, tuple(ClusterConfig.model_fields))
        if literal:
            empty = sorted(k for k, v in literal.items() if isinstance(v, str) and not v.strip())
            if empty:
                raise ValueError(
                    f"invalid StreamClusterResource configuration: {', '.join(empty)} must be a directory path, "
                    "not an empty string (leave optional directories unset to use <root>/...)"
                )
        worker = _literal_values(data, tuple(_WORKER_FIELDS))
        if worker:
            try:
                WorkerSettings.model_validate({_WORKER_FIELDS[k]: v for k, v in worker.items()})
            except ValidationError as e:
                reverse = {v: k for k, v in _WORKER_FIELDS.items()}
                problems = []
                for item in e.errors():
                    field = reverse.get(str(item["loc"][0]), str(item["loc"][0])) if item["loc"] else "config"
                    problems.append(f"{field}: {item['msg']}")
                raise ValueError("invalid StreamClusterResource configuration: " + "; ".join(problems)) from e
        query = _literal_values(data, tuple(_QUERY_FIELDS))
        # Checked together (tls_cert needs tls_key and tls_ca): only when none is an EnvVar.
        if query and not any(isinstance(data.get(k), dg.EnvVar) for k in _QUERY_FIELDS):
            try:
                QueryConfig.model_validate({_QUERY_FIELDS[k]: v for k, v in query.items()})
            except ValidationError as e:
                raise ValueError(_explain("StreamClusterResource", e, {v: k for k, v in _QUERY_FIELDS.items()})) from e
        return data

    def config(self) -> ClusterConfig:
        """The core :class:`ClusterConfig` these fields describe (``~`` expanded)."""

        def path(value: str | None) -> Path | None:
            return None if value is None else Path(value).expanduser()

        return ClusterConfig(
            root=Path(self.root).expanduser(),
            dist_dir=path(self.dist_dir),
            topics_root=path(self.topics_root),
            checkpoints_root=path(self.checkpoints_root),
            local_state_dir=path(self.local_state_dir),
            topology_defaults=dict(self.topology_defaults),
        )

    def worker_settings(self, *, port: int, launched_by: str = "dagster") -> WorkerSettings:
        """The :class:`WorkerSettings` of one worker on slot ``worker_host:port``.

        Args:
            port: The worker's slot port (its state-query server listens on it).
            launched_by: Recorded in ``/workers/{id}``, e.g. ``dagster:<run id>``.

        Raises:
            pydantic.ValidationError: A field given as an EnvVar resolved to a bad value.
        """
        values = {target: getattr(self, source) for source, target in _WORKER_FIELDS.items()}
        return WorkerSettings(**values, port=port, launched_by=launched_by, query=self.query_config())

    def query_config(self) -> QueryConfig:
        """The :class:`QueryConfig` of Dagster-launched workers and of state queries made from Dagster.

        Raises:
            pydantic.ValidationError: A field given as an EnvVar resolved to a bad value.
        """
        return QueryConfig(**{target: getattr(self, source) for source, target in _QUERY_FIELDS.items()})

    def spark_config(self) -> dict[str, str]:
        """The Spark configuration workers use: stream_ops' defaults, the master, then ``spark_conf``.

        The Python of the worker process (this interpreter) runs Spark's Python workers, and
        stream_ops' JVM classes are on the driver's class path (built once per machine with the
        JDK), as
        :func:`~stream_ops.spark.session.create_spark_session` arranges for CLI workers: a
        Dagster-launched worker must run the tasks CLI workers started, whose shuffle-stage
        checkpoints need the queue source (:mod:`stream_ops.spark.shuffle_queue`).
        """
        settings = {
            **DEFAULT_CONF,
            # Checkpoints with this cluster's modes, also when its umask is stricter than the default.
            f"spark.hadoop.{UMASK_KEY}": checkpoint_umask(self.config().umask),
            "spark.master": self.spark_master,
            "spark.app.name": "stream-ops-dagster-worker",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            **dict(self.spark_conf),
        }
        return with_jvm_classes(settings, jvm_classes_jar())


def pyspark_resource(stream_cluster: StreamClusterResource) -> LazyPySparkResource:
    """A :class:`LazyPySparkResource` with the Spark configuration of ``stream_cluster``'s workers.

    Worker runs pass its ``spark_config`` to the ``stream-ops worker`` process they start; being
    lazy, it starts no SparkSession (no JVM) in the run's own process.

    Example:
        >>> spark = pyspark_resource(StreamClusterResource(spark_master="local[2]"))
        >>> spark.spark_config["spark.master"]
        'local[2]'

    Raises:
        ValueError: ``spark_master`` or ``spark_conf`` is an :class:`dagster.EnvVar`, which only
            resolves at execution time: build the ``LazyPySparkResource`` yourself then.
    """
    if isinstance(stream_cluster.spark_master, dg.EnvVar) or isinstance(stream_cluster.spark_conf, dg.EnvVar):
        raise ValueError(
            "pyspark_resource: StreamClusterResource.spark_master / spark_conf is an EnvVar, which resolves only when "
            "a run starts; pass build_definitions(pyspark=LazyPySparkResource(spark_config={...})) instead"
        )
    return LazyPySparkResource(spark_config=stream_cluster.spark_config())
