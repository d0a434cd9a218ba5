"""Typed access to ZooKeeper: the only module that calls kazoo's data API.

:class:`ZkStore` wraps one :class:`kazoo.client.KazooClient` and speaks JSON: values are
encoded compactly as UTF-8 (:func:`encode_json` / :func:`decode_json`), writes are
compare-and-set on znode versions, and multi-node changes go through one kazoo transaction
(:meth:`ZkStore.transaction` + :meth:`ZkStore.commit_transaction`).

Every kazoo exception is translated here into a stream_ops error, chained with ``from``:

=========================================================  ===================================
kazoo                                                      stream_ops
=========================================================  ===================================
connect timeout, ``ConnectionLoss``, ``SessionExpired``,   :class:`ZooKeeperUnavailableError`
``OperationTimeout``, closed client                        (transient)
``NoNodeError``                                            :class:`ZnodeNotFoundError`
``NodeExistsError``                                        :class:`ZnodeExistsError`
``BadVersionError`` on an explicit version                 :class:`ConcurrentUpdateError`
a rolled-back transaction                                  :class:`TransactionFailedError`
anything else (``NoAuth``, ``NotEmpty``, ...)              :class:`CoordinationError`
=========================================================  ===================================

Every call is bounded in time. kazoo's synchronous calls wait forever while the client
reconnects (requests are queued until a server answers), so the store uses kazoo's async
calls and waits at most ``operation_timeout_s`` (default: the session timeout) for each.
Reads (``get_json``, ``children``, ``exists``) are retried through connection losses until
that time is spent.

Many reads at once: :meth:`ZkStore.get_many`, :meth:`ZkStore.get_json_many` and
:meth:`ZkStore.children_many` return a dict by path (``None`` for a missing node). They group
the reads into ZooKeeper ``multiRead`` requests (ZooKeeper 3.6+; kazoo has no API for it, so
:class:`_MultiRead` speaks it) of at most :data:`MULTI_READ_MAX_OPS` reads, and pipeline those
over the session with at most ``concurrency`` reads in flight (default
:data:`DEFAULT_BATCH_CONCURRENCY`). Thousands of znodes then cost a few requests instead of one
each (about 25x faster than one async read per znode: kazoo spends ~100 us of Python per
request). A server that does not know multiRead gets pipelined single reads (kazoo's
``get_async``), the same bound applying. Use them where a caller reads hundreds of nodes (e.g.
every task of every topology for a status report). Writes are never retried after a connection loss or a timeout, because
ZooKeeper may or may not apply them (a queued write may still be sent after a reconnect):
the caller gets :class:`ZooKeeperUnavailableError` and decides (re-read, then write again).

Watches and recipes go through a store too: :mod:`~stream_ops.coordination.watches`
(children and data watches), :mod:`~stream_ops.coordination.lock` (an exclusive lock with a
timeout) and :mod:`~stream_ops.coordination.election` (leader election). Session listeners get a
:class:`~stream_ops.coordination.session.ConnectionState`. No code outside this package touches
kazoo or :attr:`ZkStore.client`; paths always come from
:class:`~stream_ops.coordination.paths.ZkPaths`.

Example:
    >>> from stream_ops.config import ZooKeeperConfig
    >>> with ZkStore.connect(ZooKeeperConfig(hosts="127.0.0.1:2181")) as store:  # doctest: +SKIP
    ...     store.create_json("/storms/wc-1-1700000000", {"status": "ACTIVE"})
    ...     store.update_json("/storms/wc-1-1700000000", lambda s: {**s, "status": "INACTIVE"})
    ...     store.next_counter(ZkPaths.ID_COUNTER)
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import deque, namedtuple
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    EXCEPTIONS,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    UnimplementedError,
    ZookeeperStoppedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.paths import _norm_root, _prefix_root
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    int_struct,
    multiheader_struct,
    read_buffer,
    read_string,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from stream_ops.config import ZooKeeperConfig
from stream_ops.coordination.acl import cluster_acl, cluster_roots, format_acl, same_acl, tree_not_owned
from stream_ops.coordination.session import ConnectionState, SessionListener
from stream_ops.errors import (
    ConcurrentUpdateError,
    CoordinationError,
    StreamOpsError,
    TransactionFailedError,
    ZnodeExistsError,
    ZnodeNotFoundError,
    ZooKeeperUnavailableError,
)

__all__ = [
    "DEFAULT_BATCH_CONCURRENCY",
    "KAZOO_ERRORS",
    "MULTI_READ_MAX_OPS",
    "ZkStore",
    "ZnodeStat",
    "decode_json",
    "encode_json",
    "translate_error",
]

logger = logging.getLogger(__name__)


#: kazoo errors that mean "no usable connection right now".
_UNAVAILABLE = (
    ConnectionLoss,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
    ZookeeperStoppedError,
)
#: Errors after which a read may be retried (a closed client is final).
_RETRYABLE_READ = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)

#: Everything kazoo raises (its timeout error is not a KazooException); for this package's
#: recipes, which translate them with :func:`translate_error`.
KAZOO_ERRORS = (KazooException, KazooTimeoutError)

_MISSING: Any = object()

#: Znode reads a batch read (:meth:`ZkStore.get_many`, ...) keeps in flight by default.
DEFAULT_BATCH_CONCURRENCY = 1000
#: Most reads in one multiRead request: keeps each request and answer far below ZooKeeper's
#: ``jute.maxbuffer`` (1 MB) for znodes of a few hundred bytes, as stream_ops' records are.
MULTI_READ_MAX_OPS = 200

_OP_NAMES = {
    "Create": "create",
    "Create2": "create",
    "Delete": "delete",
    "SetData": "set_data",
    "CheckVersion": "check",
}


class _MultiRead(namedtuple("_MultiRead", "operations")):
    """ZooKeeper's multiRead request (opcode 22, ZooKeeper 3.6+), which kazoo does not offer.

    Many ``GetData``/``GetChildren`` reads in one request and one answer, each read on its own
    (a missing node fails only its read); the wire format is the multi transaction's. Its
    answer is one item per operation: ``(data, stat)``, a list of child names, or the kazoo
    exception of that read.
    """

    type = 22

    def serialize(self) -> bytearray:
        body = bytearray()
        for op in self.operations:
            body.extend(multiheader_struct.pack(op.type, False, -1))
            body.extend(op.serialize())
        body.extend(multiheader_struct.pack(-1, True, -1))
        return body

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        while True:
            kind, done, _err = multiheader_struct.unpack_from(buffer, offset)
            offset += multiheader_struct.size
            if done:
                return results
            if kind == GetData.type:
                data, offset = read_buffer(buffer, offset)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(buffer, offset))))
                offset += stat_struct.size
            elif kind == GetChildren.type:
                count = int_struct.unpack_from(buffer, offset)[0]
                offset += int_struct.size
                names = []
                for _ in range(max(count, 0)):
                    name, offset = read_string(buffer, offset)
                    names.append(name)
                results.append(names)
            elif kind == -1:  # this read failed: its error code
                code = int_struct.unpack_from(buffer, offset)[0]
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"unexpected operation type {kind} in a multiRead answer")


def _chrooted(root: str, path: str) -> str:
    """``path`` under the normalised chroot ``root``, as kazoo's ``_prefix_root`` makes it.

    Paths built by :class:`~stream_ops.coordination.paths.ZkPaths` (absolute, no empty, ``.``
    or ``..`` component, no trailing slash) are just appended: kazoo's normalisation costs more
    than the rest of sending a read in a multiRead. Anything else goes through kazoo's.
    """
    if path.startswith("/") and not path.endswith("/") and "//" not in path and "/." not in path:
        return path if root == "/" else root + path
    return str(_prefix_root(root, path))


def encode_json(data: Any) -> bytes:
    """Encode ``data`` as compact UTF-8 JSON (the format of every stream_ops znode).

    Raises:
        TypeError: ``data`` is not JSON-serialisable.
        ValueError: ``data`` contains NaN or infinity.
    """
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def decode_json(raw: bytes | None, path: str = "?") -> Any:
    """Decode znode bytes written by :func:`encode_json`; empty data decodes to ``None``.

    Raises:
        CoordinationError: The znode holds something that is not UTF-8 JSON.
    """
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CoordinationError(
            f"znode {path} does not hold UTF-8 JSON ({e}); it was not written by stream_ops "
            "or is corrupt: inspect it with zkCli and delete or rewrite it"
        ) from e


def translate_error(e: BaseException, action: str, path: str) -> StreamOpsError:
    """Map a kazoo exception raised while doing ``action`` on ``path`` to a stream_ops error.

    Raise the result ``from e``. Only this package's modules call it (nothing else sees kazoo).
    """
    if isinstance(e, ConnectionClosedError | ZookeeperStoppedError):
        return ZooKeeperUnavailableError(f"cannot {action} {path}: this ZkStore is closed; connect a new one")
    if isinstance(e, KazooTimeoutError):
        return ZooKeeperUnavailableError(
            f"cannot {action} {path}: no answer from ZooKeeper in time (the client is reconnecting "
            "or the server is overloaded); the operation may or may not be applied later. "
            "Check that ZooKeeper is running, then re-read the node and retry."
        )
    if isinstance(e, _UNAVAILABLE):
        return ZooKeeperUnavailableError(
            f"cannot {action} {path}: lost the connection to ZooKeeper ({type(e).__name__}); "
            "the operation may or may not have been applied. Retry after re-reading the node."
        )
    if isinstance(e, NoNodeError):
        return ZnodeNotFoundError(f"cannot {action} {path}: the znode (or its parent) does not exist")
    if isinstance(e, NodeExistsError):
        return ZnodeExistsError(f"cannot {action} {path}: the znode already exists")
    if isinstance(e, BadVersionError):
        return ConcurrentUpdateError(
            f"cannot {action} {path}: its version changed since it was read (another writer won); re-read it and try again"
        )
    if isinstance(e, NoAuthError):
        return CoordinationError(
            f"cannot {action} {path}: ZooKeeper answered NoAuthError: this session is not allowed to. "
            "The znode is protected by the cluster's ACL; connect with the cluster's digest credentials "
            "(ZooKeeperConfig.auth_digest, CLI --zk-auth-file / STREAM_OPS_ZK_AUTH)"
        )
    return CoordinationError(f"cannot {action} {path}: ZooKeeper answered {type(e).__name__}: {e}")


def _absolute(chroot: str, path: str) -> str:
    """``path`` under ``chroot`` as ZooKeeper names it (for messages)."""
    return path if chroot == "/" else f"{chroot}{'' if path == '/' else path}"


def _foreign_nodes(client: KazooClient, paths: list[str], acl: list[ACL], timeout: float) -> list[tuple[str, list[ACL] | None]]:
    """``(path, its ACL)`` of each existing node in ``paths`` whose ACL is not ``acl``.

    The ACL is None when this session may not even read it. Missing nodes are skipped. The
    reads are sent together and then awaited, one round trip in all.
    """
    pending = [(path, client.get_acls_async(path)) for path in paths]
    foreign: list[tuple[str, list[ACL] | None]] = []
    for path, result in pending:
        try:
            actual, _stat = result.get(timeout=timeout)
        except NoNodeError:
            continue
        except NoAuthError:
            foreign.append((path, None))
            continue
        if not same_acl(list(actual), acl):
            foreign.append((path, list(actual)))
    return foreign


def _create_missing(client: KazooClient, paths: list[str], acl: list[ACL], timeout: float) -> None:
    """Create each of ``paths`` that does not exist yet, with ``acl`` (sent together, then awaited)."""
    pending = [client.create_async(path, b"", acl=acl) for path in paths]
    for result in pending:
        try:
            result.get(timeout=timeout)
        except NodeExistsError:
            pass


def _create_tree(client: KazooClient, config: ZooKeeperConfig, acl: list[ACL]) -> None:
    """Create the chroot and every top-level node in one transaction, all with ``acl``.

    A concurrent creator winning the race is fine (the caller checks what it made).
    """
    timeout = config.connect_timeout_s
    parent = config.chroot.rpartition("/")[0]
    if parent:
        client.ensure_path_async(parent).get(timeout=timeout)  # default_acl: the cluster's
    tx = client.transaction()
    tx.create(config.chroot, b"", acl=acl)
    for node in cluster_roots():
        tx.create(f"{config.chroot}{node}", b"", acl=acl)
    results = tx.commit_async().get(timeout=timeout)
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, RolledBackError | RuntimeInconsistency)]
    if not failures:
        logger.info("created ZooKeeper chroot %s and its top-level nodes with ACL %s", config.chroot, format_acl(acl))
    elif not isinstance(failures[0], NodeExistsError):
        raise failures[0]


def _prepare_chroot(client: KazooClient, config: ZooKeeperConfig, *, verify_tree: bool) -> None:
    """Make the chroot exist; with credentials, own it (see :meth:`ZkStore.connect`).

    Args:
        client: A started client without chroot, authenticated as the cluster.
        config: The cluster's configuration.
        verify_tree: Check the ACLs of the chroot and its top-level nodes.

    Raises:
        ZooKeeperTreeNotOwnedError: A node does not carry exactly the cluster ACL.
        KazooException: Any ZooKeeper failure (the caller translates it).
    """
    timeout = config.connect_timeout_s
    acl = cluster_acl(config)
    if acl is None:
        client.ensure_path_async(config.chroot).get(timeout=timeout)
        return
    if client.exists_async(config.chroot).get(timeout=timeout) is None:
        _create_tree(client, config, acl)
    if not verify_tree:
        return
    roots = [f"{config.chroot}{node}" for node in cluster_roots()]
    chroot_is_ours = not _foreign_nodes(client, [config.chroot], acl, timeout)
    if chroot_is_ours:  # create nothing under a chroot that is not the cluster's
        _create_missing(client, roots, acl, timeout)
    foreign = _foreign_nodes(client, [config.chroot, *roots], acl, timeout)
    if foreign:
        raise tree_not_owned(config, foreign)


class ZkStore:
    """JSON, compare-and-set access to ZooKeeper under one chroot.

    Create it with :meth:`connect`; close it with :meth:`close` or use it as a context manager.
    The instance is thread-safe (kazoo clients are).

    Args:
        client: A started :class:`KazooClient` whose chroot exists.
        config: The configuration it was built from.
        sleep: Sleeper used between retries (injectable for tests).
        operation_timeout_s: Longest wait for one ZooKeeper call; defaults to the session
            timeout.
    """

    def __init__(
        self,
        client: KazooClient,
        config: ZooKeeperConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        operation_timeout_s: float | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._sleep = sleep
        self._timeout = operation_timeout_s if operation_timeout_s is not None else config.session_timeout_s
        self._closed = False
        # Batch reads use ZooKeeper's multiRead until the server turns out not to know it.
        self._multi_read = True
        # Listeners given to add_listener -> the kazoo listeners that translate the state for them.
        self._listeners: dict[SessionListener, Callable[[KazooState], object]] = {}
        # Mirrors the session state (set while CONNECTED): calls wait on it instead of letting
        # kazoo queue requests that would be sent, possibly much later, after a reconnect.
        self._live = threading.Event()
        self._give_up = threading.Event()
        client.add_listener(self._on_state)
        if client.connected:
            self._live.set()
            if not client.connected:  # dropped while we looked: the listener may have run first
                self._live.clear()

    def _on_state(self, state: KazooState) -> None:
        """Session listener (kazoo's event thread): track liveness, log changes."""
        was_live = self._live.is_set()
        if state == KazooState.CONNECTED:
            self._live.set()
        else:
            self._live.clear()
        if not self._closed and was_live != (state == KazooState.CONNECTED):
            logger.info("ZooKeeper session to %s%s is %s", self._config.hosts, self._config.chroot, state)

    # --- connection ------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        config: ZooKeeperConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        operation_timeout_s: float | None = None,
        verify_tree: bool = True,
    ) -> ZkStore:
        """Connect to ZooKeeper, creating the chroot node if it is missing.

        kazoo requires a chroot to exist before use, so a short-lived client without chroot
        creates it first. With ``auth_digest`` the session authenticates with digest
        credentials and every znode it creates gets
        :func:`~stream_ops.coordination.acl.cluster_acl`: all permissions for that identity,
        plus READ for anyone when ``open_reads`` is set, nothing for anybody else. The cluster
        then owns its tree (see :mod:`stream_ops.coordination.acl`):

        1. a missing chroot is created together with every top-level node
           (:func:`~stream_ops.coordination.acl.cluster_roots`) in one transaction, all with
           the cluster ACL, so it is never an empty node others could delete;
        2. the chroot must carry exactly the cluster ACL;
        3. missing top-level nodes are created, and each must carry exactly the cluster ACL.

        Args:
            config: Hosts, chroot, timeouts and optional digest credentials.
            sleep: Sleeper used between retries (injectable for tests).
            operation_timeout_s: Longest wait for one ZooKeeper call (default: session timeout).
            verify_tree: With credentials, run steps 2 and 3. Only
                :func:`~stream_ops.coordination.acl.secure_tree` and audits of a tree that is
                not (yet) owned pass False.

        Returns:
            A connected store.

        Raises:
            ZooKeeperUnavailableError: No server answered within ``connect_timeout_s``.
            ZooKeeperTreeNotOwnedError: With credentials, the chroot or a top-level node does
                not carry exactly the cluster ACL (the error names each, with its ACL).
            CoordinationError: The chroot could not be created (e.g. not authorised).

        Example:
            >>> store = ZkStore.connect(ZooKeeperConfig(hosts="127.0.0.1:2181"))  # doctest: +SKIP
        """
        if config.chroot != "/":
            bootstrap = cls._start_client(config, config.hosts)
            try:
                _prepare_chroot(bootstrap, config, verify_tree=verify_tree)
            except KAZOO_ERRORS as e:
                raise translate_error(e, "open or create the chroot", config.chroot) from e
            finally:
                bootstrap.stop()
                bootstrap.close()
        client = cls._start_client(config, config.connection_string)
        logger.info(
            "connected to ZooKeeper %s (chroot %s, session 0x%x)",
            config.hosts,
            config.chroot,
            client.client_id[0] if client.client_id else 0,
        )
        return cls(client, config, sleep=sleep, operation_timeout_s=operation_timeout_s)

    @staticmethod
    def _start_client(config: ZooKeeperConfig, hosts: str) -> KazooClient:
        credentials = config.auth_credentials()
        auth = [("digest", credentials)] if credentials else None
        client = KazooClient(
            hosts=hosts,
            timeout=config.session_timeout_s,
            auth_data=auth,
            # Every create (ours, transactions', recipes') uses it; None = ZooKeeper's open ACL.
            default_acl=cluster_acl(config),
            # Reconnect quickly and forever (kazoo's default backs off up to an hour).
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, max_jitter=0.1),
            command_retry=KazooRetry(max_tries=3, delay=0.05, backoff=2, max_delay=1.0, max_jitter=0.1),
        )
        try:
            client.start(timeout=config.connect_timeout_s)
        except KazooTimeoutError as e:
            raise ZooKeeperUnavailableError(
                f"no ZooKeeper server answered at {config.hosts} within {config.connect_timeout_s:g}s. "
                "Check that ZooKeeper is running (`stream-ops zookeeper start` runs a local one), "
                "that the host:port list is right, and that this machine can reach it."
            ) from e
        except KAZOO_ERRORS as e:
            client.stop()
            client.close()
            raise CoordinationError(
                f"could not open a ZooKeeper session at {config.hosts}: {type(e).__name__}: {e}. "
                "Check the auth_digest credentials and the server log."
            ) from e
        return client

    @property
    def client(self) -> KazooClient:
        """The underlying kazoo client: only for this package's recipes (and tests).

        Code outside :mod:`stream_ops.coordination` uses the store's methods and the
        watch, lock and election modules instead.
        """
        return self._client

    @property
    def config(self) -> ZooKeeperConfig:
        """The configuration this store was connected with."""
        return self._config

    @property
    def connected(self) -> bool:
        """Whether the session is currently connected (not suspended or lost)."""
        return bool(self._client.connected)

    @property
    def session_id(self) -> int | None:
        """The id of the current ZooKeeper session, or ``None`` while not connected.

        It is the ``ephemeralOwner`` of every ephemeral node this session creates (see
        :meth:`owns_ephemeral`).
        """
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def owns_ephemeral(self, stat: ZnodeStat) -> bool:
        """Whether ``stat`` is of an ephemeral node of this store's current session.

        False while not connected (the session cannot be told then).
        """
        session = self.session_id
        return session is not None and stat.ephemeralOwner == session

    def add_listener(self, fn: SessionListener) -> None:
        """Register a session-state listener; it gets a :class:`ConnectionState`.

        The listener runs on the ZooKeeper client's event thread and must not block; returning
        ``True`` unregisters it.
        """

        def translated(state: KazooState) -> object:
            return fn(ConnectionState(state))

        self._listeners[fn] = translated
        self._client.add_listener(translated)

    def remove_listener(self, fn: SessionListener) -> None:
        """Unregister a listener added with :meth:`add_listener` (unknown ones are ignored)."""
        translated = self._listeners.pop(fn, None)
        if translated is not None:
            self._client.remove_listener(translated)

    def require_connection(self, action: str, path: str) -> None:
        """Wait until the session is connected, at most the operation timeout.

        For this package's recipes, before they start kazoo calls that would otherwise queue
        until a reconnect.

        Args:
            action: What is about to be done, for the message (e.g. ``"watch"``).
            path: The znode it is done on, for the message.

        Raises:
            ZooKeeperUnavailableError: Closed, or not connected in time (nothing was sent).
        """
        self._await_connection(action, path, self._timeout)

    def close(self) -> None:
        """End the session (ephemeral nodes vanish) and free the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()
        logger.debug("closed ZooKeeper session to %s%s", self._config.hosts, self._config.chroot)

    def __enter__(self) -> ZkStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("connected" if self.connected else "disconnected")
        return f"ZkStore({self._config.connection_string}, {state})"

    # --- calls ---------------------------------------------------------------------

    def stop_waiting(self) -> None:
        """From now on, fail at once instead of waiting for a lost connection to come back (a
        process shutting down); while connected, operations go on as before."""
        self._give_up.set()

    def _await_connection(self, action: str, path: str, timeout: float) -> None:
        """Wait until the session is connected; raise (nothing was sent) if it is not in time."""
        if self._closed:
            raise ZooKeeperUnavailableError(f"cannot {action} {path}: this ZkStore is closed; connect a new one")
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self._live.wait(min(0.1, max(deadline - time.monotonic(), 0.0))):
            if self._give_up.is_set():
                raise ZooKeeperUnavailableError(f"cannot {action} {path}: not connected to ZooKeeper, and shutting down")
            if time.monotonic() >= deadline:
                break
        if not self._live.is_set():
            raise ZooKeeperUnavailableError(
                f"cannot {action} {path}: not connected to ZooKeeper at {self._config.hosts} for "
                f"{self._timeout:g}s; nothing was sent. Check that ZooKeeper is running and reachable."
            )

    def _wait(self, result: IAsyncResult, timeout: float | None = None) -> Any:
        """Wait for a kazoo async result at most ``timeout`` (default: the operation timeout)."""
        return result.get(timeout=self._timeout if timeout is None else timeout)

    def _read(self, action: str, path: str, start: Callable[[], IAsyncResult], missing: Any = _MISSING) -> Any:
        """Run an idempotent read, retrying through connection loss for the operation timeout.

        Returns ``missing`` when the znode does not exist (if given).
        """
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while True:
            self._await_connection(action, path, deadline - time.monotonic())
            remaining = deadline - time.monotonic()
            try:
                return self._wait(start(), max(remaining, 0.001))
            except NoNodeError as e:
                if missing is _MISSING:
                    raise translate_error(e, action, path) from e
                return missing
            except _RETRYABLE_READ as e:
                if self._closed or isinstance(e, ConnectionClosedError) or time.monotonic() + delay >= deadline:
                    raise translate_error(e, action, path) from e
                logger.debug("retrying %s %s after %s", action, path, type(e).__name__)
                self._sleep(delay)
                delay = min(delay * 2, 1.0)
            except KAZOO_ERRORS as e:
                raise translate_error(e, action, path) from e

    def _start_reads(self, kind: type[GetData] | type[GetChildren], paths: list[str]) -> IAsyncResult:
        """Send one read of each of ``paths``: a multiRead of them all, or a single read of one."""
        if len(paths) == 1 and not self._multi_read:
            if kind is GetData:
                return self._client.get_async(paths[0])
            return self._client.get_children_async(paths[0])
        root = _norm_root(self._client.chroot or "")
        request = _MultiRead(tuple(kind(_chrooted(root, path), None) for path in paths))
        result: IAsyncResult = self._client.handler.async_result()
        self._client._call(request, result)
        return result

    def _read_many(
        self,
        action: str,
        paths: Iterable[str],
        kind: type[GetData] | type[GetChildren],
        concurrency: int,
    ) -> dict[str, Any]:
        """Read every path (``kind``: data or children), pipelined (see :meth:`get_many`).

        Returns path -> what kazoo's ``get``/``get_children`` returns, ``None`` where the znode
        does not exist, in the order of ``paths`` (duplicates read once).
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        todo = list(dict.fromkeys(paths))
        found: dict[str, Any] = dict.fromkeys(todo)
        # The operation timeout bounds the wait for *progress*: every answer restarts it.
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while todo:
            multi = self._multi_read
            group = min(concurrency, MULTI_READ_MAX_OPS) if multi else 1
            in_flight = max(1, concurrency // group)
            units = [todo[i : i + group] for i in range(0, len(todo), group)]
            self._await_connection(action, todo[0], deadline - time.monotonic())
            retry: list[str] = []
            failure: tuple[str, BaseException] | None = None
            window: deque[tuple[list[str], IAsyncResult]] = deque()
            sent = 0
            while sent < len(units) or window:
                if sent < len(units) and len(window) < in_flight and failure is None:
                    window.append((units[sent], self._start_reads(kind, units[sent])))
                    sent += 1
                    continue
                unit, result = window.popleft()
                items: list[Any] | None
                try:
                    answer = self._wait(result, max(deadline - time.monotonic(), 0.001))
                    items = answer if multi else [answer]
                except NoNodeError:
                    items = [None]  # a single read of a missing node
                except _RETRYABLE_READ as e:
                    # The session dropped (or no answer in time): stop sending, collect what is
                    # in flight, then send the rest again once connected.
                    retry.extend(unit)
                    failure = failure or (unit[0], e)
                    items = None
                except UnimplementedError as e:
                    if not multi:
                        raise translate_error(e, action, unit[0]) from e
                    found.update(self._without_multi_read(action, todo, kind, concurrency, e))
                    return found
                except KAZOO_ERRORS as e:
                    raise translate_error(e, action, unit[0]) from e
                except Exception as e:  # a multiRead answer kazoo could not parse
                    if not multi:
                        raise
                    found.update(self._without_multi_read(action, todo, kind, concurrency, e))
                    return found
                if items is not None:
                    deadline = time.monotonic() + self._timeout
                    for path, item in zip(unit, items):
                        if isinstance(item, NoNodeError) or item is None:
                            found[path] = None
                        elif isinstance(item, BaseException):
                            raise translate_error(item, action, path) from item
                        else:
                            found[path] = item
                if failure is not None and not window:
                    retry.extend(p for u in units[sent:] for p in u)
                    sent = len(units)
            if failure is None:
                break
            path, error = failure
            if self._closed or isinstance(error, ConnectionClosedError) or time.monotonic() + delay >= deadline:
                raise translate_error(error, f"{action} ({len(retry)} of a batch of {len(found)} znodes)", path) from error
            logger.debug("retrying %d %s of a batch after %s", len(retry), action, type(error).__name__)
            self._sleep(delay)
            delay = min(delay * 2, 1.0)
            todo = retry
        return found

    def _without_multi_read(
        self,
        action: str,
        paths: list[str],
        kind: type[GetData] | type[GetChildren],
        concurrency: int,
        error: BaseException,
    ) -> dict[str, Any]:
        """The server cannot do multiRead (ZooKeeper < 3.6): pipeline single reads from now on."""
        logger.warning(
            "ZooKeeper at %s did not answer a multiRead (%s: %s); batch reads send one request per znode from now on",
            self._config.hosts,
            type(error).__name__,
            error,
        )
        self._multi_read = False
        return self._read_many(action, paths, kind, concurrency)

    def _write(self, action: str, path: str, start: Callable[[], IAsyncResult]) -> Any:
        """Send a write once connected and wait for it; failures are translated, never retried."""
        self._await_connection(action, path, self._timeout)
        try:
            return self._wait(start())
        except KAZOO_ERRORS as e:
            raise translate_error(e, action, path) from e

    # --- reads -----------------------------------------------------------------------

    def get_json(self, path: str, *, watch: Callable[..., Any] | None = None) -> tuple[Any, ZnodeStat] | None:
        """Read and decode a znode.

        Args:
            path: Znode path under the chroot.
            watch: Optional one-shot kazoo data watch.

        Returns:
            ``(value, stat)``, or ``None`` if the znode does not exist. Empty data decodes to
            ``None``. ``stat.version`` is the version to pass to :meth:`set_json`.

        Raises:
            ZooKeeperUnavailableError: No answer within the operation timeout.
        """
        found = self._read("read", path, lambda: self._client.get_async(path, watch=watch), missing=None)
        if found is None:
            return None
        raw, stat = found
        return decode_json(raw, path), stat

    def exists(self, path: str) -> bool:
        """Whether the znode exists."""
        return self._read("check", path, lambda: self._client.exists_async(path)) is not None

    def stat(self, path: str) -> ZnodeStat | None:
        """The znode's stat (version, ``ephemeralOwner``, ...), or ``None`` if it does not exist.

        Raises:
            ZooKeeperUnavailableError: No answer within the operation timeout.
        """
        stat: ZnodeStat | None = self._read("check", path, lambda: self._client.exists_async(path))
        return stat

    def get_bytes(self, path: str) -> tuple[bytes | None, ZnodeStat] | None:
        """Read a znode's raw data, for nodes not written as JSON (e.g. election contenders).

        Returns:
            ``(data, stat)``, or ``None`` if the znode does not exist. ``data`` is ``None`` for a
            node created with null data.

        Raises:
            ZooKeeperUnavailableError: No answer within the operation timeout.
        """
        found = self._read("read", path, lambda: self._client.get_async(path), missing=None)
        if found is None:
            return None
        raw, stat = found
        return raw, stat

    def children(self, path: str, *, watch: Callable[..., Any] | None = None) -> list[str]:
        """Names of the children of ``path``, sorted; empty if the znode is missing."""
        names = self._read("list", path, lambda: self._client.get_children_async(path, watch=watch), missing=[])
        return sorted(names)

    def get_many(
        self, paths: Iterable[str], *, concurrency: int = DEFAULT_BATCH_CONCURRENCY
    ) -> dict[str, tuple[bytes | None, ZnodeStat] | None]:
        """Read many znodes' raw data at once, with at most ``concurrency`` reads in flight.

        The reads go in multiRead requests of up to ``min(concurrency, MULTI_READ_MAX_OPS)``
        znodes (single ``get_async`` reads on a server without multiRead), pipelined: as many
        requests as keep ``concurrency`` reads in flight are sent, then each answer is
        collected in order while the next request goes out. So thousands of znodes cost a few
        requests, not one each. Each znode is read on its own (a missing one fails only its own
        read), as consecutive :meth:`get_bytes` calls would; do not rely on one atomic snapshot.

        Connection losses are retried as :meth:`get_bytes` retries them (only the reads not
        answered yet are sent again); the operation timeout bounds the wait for each answer.

        Args:
            paths: Znode paths under the chroot (duplicates are read once).
            concurrency: Most znode reads in flight at once (>= 1).

        Returns:
            Path -> ``(data, stat)`` as :meth:`get_bytes` returns it, or ``None`` for a znode
            that does not exist; keys in the order of ``paths``.

        Raises:
            ZooKeeperUnavailableError: No answer (or no connection) within the operation timeout.
            CoordinationError: ZooKeeper refused a read (e.g. ``NoAuth``); nothing is returned.
            ValueError: ``concurrency`` is below 1.

        Example:
            >>> found = store.get_many([ZkPaths.owner(tid, t) for t in range(100)])  # doctest: +SKIP
            >>> missing = [path for path, node in found.items() if node is None]  # doctest: +SKIP
        """
        found = self._read_many("read", paths, GetData, concurrency)
        return {path: None if node is None else (node[0], node[1]) for path, node in found.items()}

    def get_json_many(
        self, paths: Iterable[str], *, concurrency: int = DEFAULT_BATCH_CONCURRENCY
    ) -> dict[str, tuple[Any, ZnodeStat] | None]:
        """:meth:`get_many`, each value decoded as :meth:`get_json` decodes it.

        Raises:
            CoordinationError: A znode does not hold UTF-8 JSON (decode with :func:`decode_json`
                from :meth:`get_many` instead to handle each node on its own).
        """
        found = self.get_many(paths, concurrency=concurrency)
        return {path: None if node is None else (decode_json(node[0], path), node[1]) for path, node in found.items()}

    def children_many(self, paths: Iterable[str], *, concurrency: int = DEFAULT_BATCH_CONCURRENCY) -> dict[str, list[str] | None]:
        """The children of many znodes at once (pipelined like :meth:`get_many`).

        Returns:
            Path -> sorted child names, or ``None`` for a znode that does not exist (where
            :meth:`children` says ``[]``); keys in the order of ``paths``.

        Raises:
            ZooKeeperUnavailableError: No answer (or no connection) within the operation timeout.
            CoordinationError: ZooKeeper refused a read.
            ValueError: ``concurrency`` is below 1.
        """
        found = self._read_many("list", paths, GetChildren, concurrency)
        return {path: None if names is None else sorted(names) for path, names in found.items()}

    def get_acl(self, path: str) -> list[ACL]:
        """The ACL of a znode (needs READ or ADMIN on it, as ZooKeeper decides).

        Raises:
            ZnodeNotFoundError: The node does not exist.
        """
        acl, _stat = self._read("read the ACL of", path, lambda: self._client.get_acls_async(path))
        return list(acl)

    # --- writes ----------------------------------------------------------------------

    def set_acl(self, path: str, acl: list[ACL], *, version: int = -1) -> ZnodeStat:
        """Replace the ACL of a znode (needs ADMIN on it).

        Args:
            path: Existing znode.
            acl: The new ACL (see :mod:`stream_ops.coordination.acl`).
            version: Expected ACL version (``stat.aversion``); ``-1`` writes unconditionally.

        Raises:
            ZnodeNotFoundError: The node does not exist.
            CoordinationError: Not allowed (NoAuth) or the ACL is invalid.
        """
        stat: ZnodeStat = self._write("set the ACL of", path, lambda: self._client.set_acls_async(path, acl, version=version))
        return stat

    def create_json(
        self,
        path: str,
        data: Any,
        *,
        ephemeral: bool = False,
        makepath: bool = True,
        sequence: bool = False,
    ) -> str:
        """Create a znode holding ``data`` as JSON.

        Args:
            path: Znode path (for ``sequence=True``, the prefix of the name).
            data: JSON-serialisable value.
            ephemeral: Delete the node when this session ends.
            makepath: Create missing parents (as persistent, empty nodes).
            sequence: Append ZooKeeper's 10-digit sequence number to the name.

        Returns:
            The path actually created (differs from ``path`` when ``sequence`` is set).

        Raises:
            ZnodeExistsError: The node exists already.
            ZnodeNotFoundError: The parent is missing and ``makepath`` is false.
            ZooKeeperUnavailableError: Connection lost (the node may or may not exist now).
        """
        raw = encode_json(data)
        return str(
            self._write(
                "create",
                path,
                lambda: self._client.create_async(path, raw, ephemeral=ephemeral, sequence=sequence, makepath=makepath),
            )
        )

    def set_json(self, path: str, data: Any, *, version: int = -1) -> ZnodeStat:
        """Overwrite a znode's data with ``data`` as JSON.

        Args:
            path: Existing znode.
            data: JSON-serialisable value.
            version: Expected current version (compare-and-set); ``-1`` writes unconditionally.

        Returns:
            The new stat.

        Raises:
            ConcurrentUpdateError: ``version`` did not match.
            ZnodeNotFoundError: The node does not exist.
            ZooKeeperUnavailableError: Connection lost (the write may or may not be applied).
        """
        raw = encode_json(data)
        stat: ZnodeStat = self._write("write", path, lambda: self._client.set_async(path, raw, version=version))
        return stat

    def update_json(
        self,
        path: str,
        fn: Callable[[Any], Any],
        *,
        default: Any = _MISSING,
        retries: int = 20,
    ) -> Any:
        """Read-modify-write ``path`` with a version compare-and-set, retrying on conflicts.

        ``fn`` gets the current decoded value and returns the new one; it may run several times
        and must have no side effects. When the node is missing and ``default`` is given, the
        node is created with ``fn(default)`` (a concurrent creator makes this attempt retry).

        Args:
            path: Znode path.
            fn: Pure function old value -> new value.
            default: Value to start from when the node is missing; omit to require the node.
            retries: Attempts before giving up.

        Returns:
            The value written.

        Raises:
            ZnodeNotFoundError: The node is missing and no ``default`` was given.
            ConcurrentUpdateError: Lost the compare-and-set ``retries`` times.
            ZooKeeperUnavailableError: Connection lost (the last write may or may not be applied).

        Example:
            >>> store.update_json("/storms/x", lambda s: {**s, "status": "KILLED"})  # doctest: +SKIP
        """
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        for attempt in range(retries):
            if attempt:
                # Jittered backoff so contending writers spread out.
                self._sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
            current = self.get_json(path)
            if current is None:
                if default is _MISSING:
                    raise ZnodeNotFoundError(f"cannot update {path}: the znode does not exist (pass default= to create it)")
                new = fn(default)
                version: int | None = None
            else:
                value, stat = current
                new = fn(value)
                version = stat.version
            raw = encode_json(new)
            self._await_connection("update", path, self._timeout)
            try:
                if version is None:
                    self._wait(self._client.create_async(path, raw, makepath=True))
                else:
                    self._wait(self._client.set_async(path, raw, version=version))
                return new
            except (BadVersionError, NodeExistsError, NoNodeError) as e:
                logger.debug("update of %s lost a race (%s), attempt %d", path, type(e).__name__, attempt + 1)
            except KAZOO_ERRORS as e:
                raise translate_error(e, "update", path) from e
        raise ConcurrentUpdateError(
            f"gave up updating {path} after {retries} attempts: other writers changed it every time. "
            "Retry later or reduce contention on this znode."
        )

    def next_counter(self, path: str, *, retries: int = 100) -> int:
        """Atomically increment the JSON integer at ``path`` and return the new value.

        The counter starts at 0 (the first call returns 1) and every call, from any process,
        gets a distinct, larger value. Used for topology ids ``name-<counter>-<ts>``.

        Raises:
            ConcurrentUpdateError: Lost the compare-and-set ``retries`` times.
            CoordinationError: The znode holds something other than an integer.
        """

        def _increment(value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise CoordinationError(f"counter {path} holds {value!r}, not an integer")
            return value + 1

        return int(self.update_json(path, _increment, default=0, retries=retries))

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents as empty persistent nodes if missing.

        With ``auth_digest``, every node of ``path`` that exists already must carry exactly the
        cluster ACL: a node someone else created would let them delete and recreate what the
        cluster puts under it.

        Raises:
            ZooKeeperTreeNotOwnedError: An existing node of ``path`` has another ACL (nothing is
                created below it).
        """
        self.ensure_paths([path])

    def ensure_paths(self, paths: Iterable[str]) -> None:
        """:meth:`ensure_path` for several paths at once: their nodes are created level by level,
        each level's in parallel, so existing roots cost one round trip in all rather than one each.

        Raises:
            ZooKeeperTreeNotOwnedError: With ``auth_digest``, an existing node has another ACL
                (nothing is created below it).
        """
        acl = cluster_acl(self._config)
        levels: dict[int, set[str]] = {}
        for path in paths:
            parts = [p for p in path.split("/") if p]
            for depth in range(1, len(parts) + 1):
                levels.setdefault(depth, set()).add("/" + "/".join(parts[:depth]))
        for depth in sorted(levels):
            nodes = sorted(levels[depth])
            self._await_connection("create", nodes[0], self._timeout)
            pending = [(node, self._client.create_async(node, b"", acl=acl)) for node in nodes]
            for node, result in pending:
                try:
                    self._wait(result)
                except NodeExistsError:
                    if acl is not None:
                        self._check_owned(node)
                except KAZOO_ERRORS as e:
                    raise translate_error(e, "create", node) from e

    def _check_owned(self, path: str) -> None:
        """Raise :class:`ZooKeeperTreeNotOwnedError` unless ``path`` carries exactly the cluster ACL."""
        try:
            actual: list[ACL] | None = self.get_acl(path)
        except ZnodeNotFoundError:
            return  # deleted meanwhile (by the cluster: nobody else may)
        except ZooKeeperUnavailableError:
            raise
        except CoordinationError:
            actual = None  # NoAuth: not even allowed to read its ACL
        if actual is None or not same_acl(actual, cluster_acl(self._config)):
            raise tree_not_owned(self._config, [(_absolute(self._config.chroot, path), actual)])

    def delete(self, path: str, *, version: int = -1) -> None:
        """Delete one znode (compare-and-set on ``version`` unless ``-1``).

        Raises:
            ZnodeNotFoundError: The node does not exist.
            ConcurrentUpdateError: ``version`` did not match.
            CoordinationError: The node has children.
        """
        self._write("delete", path, lambda: self._client.delete_async(path, version=version))

    def delete_recursive(self, path: str) -> None:
        """Delete ``path`` and everything under it; a missing node is not an error.

        ``"/"`` (the chroot itself) is emptied but kept, so the store stays usable.
        """
        for child in self.children(path):
            self.delete_recursive(f"{path.rstrip('/')}/{child}")
        if path == "/":
            return
        for _ in range(10):
            self._await_connection("delete", path, self._timeout)
            try:
                self._wait(self._client.delete_async(path))
                return
            except NoNodeError:
                return
            except NotEmptyError:
                # A child appeared meanwhile: delete it too, then try again.
                for child in self.children(path):
                    self.delete_recursive(f"{path}/{child}")
            except KAZOO_ERRORS as e:
                raise translate_error(e, "delete", path) from e
        raise ConcurrentUpdateError(f"could not delete {path}: children kept being added under it")

    # --- transactions ----------------------------------------------------------------

    def transaction(self) -> TransactionRequest:
        """Start a kazoo transaction; add operations, then :meth:`commit_transaction` it.

        Encode values with :func:`encode_json`.

        Example:
            >>> tx = store.transaction()  # doctest: +SKIP
            >>> tx.check(ZkPaths.owner(tid, 3), owner_version)  # doctest: +SKIP
            >>> tx.set_data(ZkPaths.transactional_task(tid, 3), encode_json(meta), version=v)  # doctest: +SKIP
            >>> store.commit_transaction(tx)  # doctest: +SKIP
        """
        return self._client.transaction()

    def commit_transaction(self, tx: TransactionRequest) -> list[Any]:
        """Commit ``tx``; all of its operations apply, or none do.

        Returns:
            One result per operation (created path, ``True`` for delete/check, stat for set).

        Raises:
            TransactionFailedError: ZooKeeper rolled the transaction back; the error names the
                failing operation (index, kind, path) and ZooKeeper's reason.
            ZooKeeperUnavailableError: Connection lost (the transaction may or may not be applied).
        """
        self._await_connection("commit a transaction on", "ZooKeeper", self._timeout)
        try:
            results: list[Any] = self._wait(tx.commit_async())
        except KAZOO_ERRORS as e:
            raise translate_error(e, f"commit a transaction of {len(tx.operations)} operations on", "ZooKeeper") from e
        failures = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        if not failures:
            return results
        # ZooKeeper marks the culprit with its own error, the others RolledBack/RuntimeInconsistency.
        culprits = [(i, r) for i, r in failures if not isinstance(r, RolledBackError | RuntimeInconsistency)]
        index, error = (culprits or failures)[0]
        op = tx.operations[index]
        kind = _OP_NAMES.get(type(op).__name__, type(op).__name__)
        path = self._client.unchroot(op.path)
        reason = type(error).__name__
        hint = ""
        if isinstance(error, NoAuthError):
            hint = (
                ": the znode is protected by the cluster's ACL; connect with the cluster's digest "
                "credentials (ZooKeeperConfig.auth_digest, CLI --zk-auth-file / STREAM_OPS_ZK_AUTH)"
            )
        raise TransactionFailedError(
            f"transaction rolled back, nothing applied: operation {index} ({kind} {path}) failed with {reason}{hint}",
            index=index,
            operation=kind,
            path=path,
            reason=reason,
        ) from error
