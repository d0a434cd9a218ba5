"""An exclusive ZooKeeper lock with a timeout (kazoo's ``Lock`` recipe behind a ZkStore).

The lock is a sequential-ephemeral node under its path: it is released when the block ends,
and by ZooKeeper if the session that holds it ends first.

Example:
    >>> with hold_lock(store, ZkPaths.compaction_lock(topology_id, 3), timeout_s=30):  # doctest: +SKIP
    ...     compact()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock

from stream_ops.coordination.store import KAZOO_ERRORS, translate_error
from stream_ops.errors import LockTimeoutError

if TYPE_CHECKING:
    from stream_ops.coordination.store import ZkStore

__all__ = ["hold_lock"]


@contextmanager
def hold_lock(store: ZkStore, path: str, *, timeout_s: float, identifier: str | None = None) -> Iterator[None]:
    """Hold the exclusive lock at ``path`` for the duration of the ``with`` block.

    Args:
        store: A connected store.
        path: The lock's znode (created if missing).
        timeout_s: Longest wait for the lock.
        identifier: Names this holder among the lock's contenders (for inspection).

    Raises:
        LockTimeoutError: Not acquired within ``timeout_s`` (nothing ran under it).
        ZooKeeperUnavailableError: Not connected within the operation timeout.
        CoordinationError: ZooKeeper refused the lock or its release (e.g. NoAuth).
    """
    store.require_connection("lock", path)
    lock = Lock(store.client, path, identifier)
    try:
        acquired = lock.acquire(timeout=timeout_s)
    except LockTimeout as e:
        raise LockTimeoutError(f"the lock {path} was not acquired within {timeout_s:g}s: another process holds it") from e
    except KAZOO_ERRORS as e:
        raise translate_error(e, "lock", path) from e
    if not acquired:
        raise LockTimeoutError(f"the lock {path} was not acquired within {timeout_s:g}s: another process holds it")
    try:
        yield
    finally:
        try:
            lock.release()
        except KAZOO_ERRORS as e:
            raise translate_error(e, "release the lock", path) from e
