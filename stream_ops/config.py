"""Configuration models, frozen and validated (pydantic).

Core code never reads the environment; the CLI and the Dagster resources build these models.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from stream_ops.errors import ConfigError

DEFAULT_ZOOKEEPER = "127.0.0.1:2181"
DEFAULT_CHROOT = "/stream_ops"
#: HMAC message of the state-query token derived from the ZooKeeper digest (see :func:`query_token`).
QUERY_TOKEN_LABEL = b"stream-ops state-query token v1"
MIN_QUERY_TOKEN_LENGTH = 16


class ZooKeeperConfig(BaseModel):
    """How to reach ZooKeeper, and as whom.

    ``auth_digest`` is a :class:`~pydantic.SecretStr`: its ``repr``, ``str`` and every validation
    error show ``**********``, never the password. Code that needs the clear text (the ZooKeeper
    session, derived tokens) calls :meth:`auth_credentials`.

    Example:
        >>> cfg = ZooKeeperConfig(auth_digest="stream-ops:s3cret")
        >>> "s3cret" in repr(cfg), cfg.auth_credentials()
        (False, 'stream-ops:s3cret')
        >>> ZooKeeperConfig(insecure=True).insecure
        True
    """

    # A validation error never repeats the input: it may hold the password.
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    hosts: str = Field(DEFAULT_ZOOKEEPER, description="Comma-separated host:port list.")
    chroot: str = Field(
        DEFAULT_CHROOT,
        description=(
            "Root znode for all stream_ops data. With auth_digest the cluster creates and owns it (it must not be '/')."
        ),
    )
    session_timeout_s: float = Field(10.0, gt=0, description="ZooKeeper session timeout.")
    connect_timeout_s: float = Field(10.0, gt=0, description="How long to wait for a first connection.")
    auth_digest: SecretStr | None = Field(
        None,
        description=(
            "Optional 'user:password' digest credentials: the cluster's identity. When set, every "
            "znode stream_ops creates gets an ACL giving this identity all permissions and nobody "
            "else any (see stream_ops.coordination.acl), and every connect checks that the chroot and "
            "its top-level znodes carry exactly that ACL."
        ),
    )
    open_reads: bool = Field(
        False,
        description=(
            "With auth_digest: also let anyone (world) READ the znodes stream_ops creates, e.g. for "
            "dashboards; writes stay limited to the cluster's identity."
        ),
    )
    insecure: bool = Field(
        False,
        description=(
            "Let workers, the nimbus and the supervisor run without auth_digest, on a tree any client that "
            "reaches ZooKeeper can rewrite (and so choose the code workers run). Only for a local, single-user "
            "stack (stream-ops dev / demo) or tests; a cluster deployment leaves it off."
        ),
    )

    @field_validator("hosts")
    @classmethod
    def _hosts_have_ports(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            raise ValueError("give at least one ZooKeeper server as host:port")
        for part in parts:
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"ZooKeeper server {part!r} must be written host:port, e.g. 127.0.0.1:2181")
        return ",".join(parts)

    @field_validator("chroot")
    @classmethod
    def _chroot_is_absolute(cls, value: str) -> str:
        if not value.startswith("/") or (len(value) > 1 and value.endswith("/")):
            raise ValueError(f"chroot {value!r} must start with '/' and not end with '/', e.g. /stream_ops")
        return value

    @field_validator("auth_digest")
    @classmethod
    def _digest_is_user_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        user, sep, password = value.get_secret_value().partition(":")
        if not sep or not user or not password:
            raise ValueError("auth_digest must be written user:password, both non-empty (e.g. stream-ops:<secret>)")
        return value

    @model_validator(mode="after")
    def _open_reads_needs_auth(self) -> ZooKeeperConfig:
        if self.open_reads and not self.auth_digest:
            raise ValueError(
                "open_reads only narrows an ACL, and without auth_digest znodes have none (anyone can "
                "read and write): set auth_digest too, or drop open_reads"
            )
        return self

    @model_validator(mode="after")
    def _owned_tree_needs_a_chroot(self) -> ZooKeeperConfig:
        if self.auth_digest and self.chroot == "/":
            raise ValueError(
                "with auth_digest the cluster must own its tree, and ZooKeeper's root '/' is world-writable and "
                "shared (anyone may delete and recreate top-level nodes under it): give the cluster its own "
                "chroot, e.g. --chroot /stream_ops"
            )
        return self

    @model_validator(mode="after")
    def _insecure_means_no_auth(self) -> ZooKeeperConfig:
        if self.insecure and self.auth_digest:
            raise ValueError(
                "insecure (--insecure) only allows running without auth_digest; with digest credentials it means "
                "nothing: drop one of them"
            )
        return self

    def __repr_args__(self) -> Any:
        # Never print the password (logs, tracebacks, Dagster run config), even when a model_copy(update=...)
        # put a plain string there.
        for name, value in super().__repr_args__():
            yield name, ("**********" if name == "auth_digest" and value else value)

    def auth_credentials(self) -> str | None:
        """The clear-text ``user:password`` of :attr:`auth_digest`, or None.

        Only for the ZooKeeper session and values derived from it (the query token); never log it.
        """
        value: Any = self.auth_digest
        if value is None:
            return None
        # model_copy(update=...) skips validation and may leave a plain str here.
        return value.get_secret_value() if isinstance(value, SecretStr) else str(value)

    @property
    def connection_string(self) -> str:
        """Hosts plus chroot, as kazoo expects them."""
        return self.hosts if self.chroot == "/" else f"{self.hosts}{self.chroot}"


class QueryConfig(BaseModel):
    """How state queries are authenticated and encrypted: the workers' query servers and every client.

    The bearer token a worker requires and a client sends is :func:`query_token` of this and the
    cluster's :class:`ZooKeeperConfig`; by default it is derived from ``auth_digest``.
    """

    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    token: SecretStr | None = Field(
        None,
        description=(
            f"Explicit bearer token (at least {MIN_QUERY_TOKEN_LENGTH} visible ASCII characters); overrides the "
            "one derived from ZooKeeperConfig.auth_digest. Every worker and client of a cluster needs the same."
        ),
    )
    tls_cert: Path | None = Field(
        None, description="Worker: PEM certificate (chain) its query server presents; must name the worker's host."
    )
    tls_key: Path | None = Field(None, description="Worker: PEM private key of tls_cert.")
    tls_ca: Path | None = Field(
        None,
        description="Client: PEM CA bundle the workers' certificates are verified against; queries then use https.",
    )

    @field_validator("token")
    @classmethod
    def _token_is_visible_ascii(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        secret = value.get_secret_value()
        if len(secret) < MIN_QUERY_TOKEN_LENGTH or not all("!" <= c <= "~" for c in secret):
            raise ValueError(
                f"the query token must be at least {MIN_QUERY_TOKEN_LENGTH} visible ASCII characters without spaces "
                "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @model_validator(mode="after")
    def _tls_is_complete(self) -> QueryConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(
                "give both tls_cert and tls_key (--query-tls-cert, --query-tls-key): the query server's certificate "
                "and its private key"
            )
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError(
                "a worker serving TLS queries the other workers over TLS too (state_query): give tls_ca as well (--query-tls-ca)"
            )
        return self


def query_token(query: QueryConfig, zookeeper: ZooKeeperConfig) -> str | None:
    """The bearer token of state queries: what a worker requires and what a client sends.

    An explicit ``query.token`` wins; otherwise, with ZooKeeper digest credentials, the token is
    HMAC-SHA256 of :data:`QUERY_TOKEN_LABEL` keyed with ``auth_digest`` (hex), so every process that
    has the cluster's credentials can query and the token reveals nothing of them. Without either,
    None: queries are unauthenticated.

    Example:
        >>> query_token(QueryConfig(), ZooKeeperConfig(auth_digest="so:pw"))[:8]
        '3c138590'
    """
    if query.token is not None:
        return query.token.get_secret_value()
    credentials = zookeeper.auth_credentials()
    if credentials:
        return hmac.new(credentials.encode("utf-8"), QUERY_TOKEN_LABEL, hashlib.sha256).hexdigest()
    return None


class ClusterConfig(BaseModel):
    """Where a stream_ops cluster keeps its files.

    ``root`` may be any path the workers share (a local directory on one machine). The dist
    store, topics and Spark checkpoints live under it unless given explicitly.
    """

    model_config = ConfigDict(frozen=True)

    root: Path = Field(Path("var/stream_ops"), description="Base directory for everything below.")
    dist_dir: Path | None = Field(None, description="Dist store: plan, conf and code of each submission.")
    topics_root: Path | None = Field(None, description="Internal topics (shuffle, state, dead letters).")
    checkpoints_root: Path | None = Field(None, description="Spark checkpoints, one per task.")
    local_state_dir: Path | None = Field(None, description="Local RocksDB stores of this machine's workers.")
    umask: int = Field(
        0o027,
        ge=0,
        le=0o777,
        description=(
            "umask of stream_ops processes (workers, nimbus, supervisor, CLI): data files are created 0640 and "
            "directories 0750 at most, and this can only take more away; 0o027 keeps others out"
        ),
    )
    topology_defaults: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Conf every topology submitted to this cluster gets, unless its own conf sets the key: e.g. "
            "KafkaStateTopic(bootstrap=...).to_conf() keeps every state topic in Kafka, KafkaShuffle(...).to_conf() "
            "every shuffle"
        ),
    )
    fsync: bool = Field(
        True,
        description=(
            "fsync every batch file and its directory before the batch commits, so an OS crash or power loss "
            "cannot lose a committed batch. Turn off only for throwaway data or to measure what it costs."
        ),
    )

    def resolved_dist_dir(self) -> Path:
        return self.dist_dir or self.root / "dist"

    def resolved_topics_root(self) -> Path:
        return self.topics_root or self.root / "topics"

    def resolved_checkpoints_root(self) -> Path:
        return self.checkpoints_root or self.root / "checkpoints"

    def resolved_local_state_dir(self) -> Path:
        return self.local_state_dir or self.root / "local"


class SpreadPolicy(BaseModel):
    """When the nimbus spreads a topology onto free slots (Storm's even scheduler, rate-limited).

    A topology that uses fewer worker slots than it wants (``workers`` at submission) while
    live slots are free is spread over them, moving the fewest tasks. Two limits keep a
    flapping worker from causing churn, both measured by the observer's own clock (the nimbus
    monitor's, or the Dagster heartbeat sensor's):

    * a slot counts only once it has been registered without interruption for ``stability_s``;
    * a topology is spread at most once per ``interval_s``.

    The cluster-wide default applies to every topology; a topology's conf may override it
    with ``spread_interval_s`` and ``spread_stability_s`` (``submit(..., conf={...})``).

    Example:
        >>> SpreadPolicy().interval_s, SpreadPolicy().stability_s
        (10.0, 5.0)
        >>> SpreadPolicy().for_conf({"spread_interval_s": 30}).interval_s
        30.0
    """

    model_config = ConfigDict(frozen=True)

    interval_s: float = Field(10.0, ge=0, description="Least time between two spreads of one topology.")
    stability_s: float = Field(5.0, ge=0, description="Time a slot must be live before a spread uses it.")

    def for_conf(self, conf: Mapping[str, Any]) -> SpreadPolicy:
        """This policy with a topology conf's ``spread_interval_s`` / ``spread_stability_s`` applied.

        Raises:
            ConfigError: a value that is not a non-negative number.
        """
        values = {
            name: conf[key]
            for name, key in (("interval_s", "spread_interval_s"), ("stability_s", "spread_stability_s"))
            if key in conf
        }
        if not values:
            return self
        try:
            return SpreadPolicy(**{**self.model_dump(), **values})
        except ValidationError as e:
            raise ConfigError(
                f"topology conf: spread_interval_s and spread_stability_s must be non-negative numbers: {e}"
            ) from None
