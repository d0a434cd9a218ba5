"""Lasting watches on a znode's children or data (kazoo's ``ChildrenWatch`` / ``DataWatch``).

ZooKeeper watches fire once; these re-arm themselves after every change and after reconnects
(a lost session too), and call back until the callback returns ``False``. Callbacks run on the
ZooKeeper client's threads: they should only record what changed (set an event) and return.

Example:
    >>> changed = threading.Event()  # doctest: +SKIP
    >>> watch_children(store, ZkPaths.ASSIGNMENTS, lambda children: changed.set())  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from stream_ops.coordination.store import KAZOO_ERRORS, ZnodeStat, translate_error

if TYPE_CHECKING:
    from stream_ops.coordination.store import ZkStore

__all__ = ["ChildrenCallback", "DataCallback", "watch_children", "watch_data"]

#: Gets the children's names; returning ``False`` ends the watch.
ChildrenCallback = Callable[[list[str]], bool | None]
#: Gets the node's raw data and stat (both ``None`` while it does not exist); returning
#: ``False`` ends the watch.
DataCallback = Callable[[bytes | None, ZnodeStat | None], bool | None]


def watch_children(store: ZkStore, path: str, fn: ChildrenCallback) -> None:
    """Call ``fn`` with the children of ``path`` now, then each time they change.

    The first call happens before this returns. ``path`` must exist: on a missing node nothing
    is called and the watch ends.

    Args:
        store: A connected store.
        path: The znode whose children to watch.
        fn: The callback.

    Raises:
        ZooKeeperUnavailableError: Not connected within the operation timeout (nothing is watched).
        CoordinationError: The first read failed (e.g. NoAuth).
    """
    store.require_connection("watch the children of", path)
    try:
        ChildrenWatch(store.client, path, fn)
    except KAZOO_ERRORS as e:
        raise translate_error(e, "watch the children of", path) from e


def watch_data(store: ZkStore, path: str, fn: DataCallback) -> None:
    """Call ``fn`` with the data of ``path`` now, then each time it changes.

    The first call happens before this returns. The node may be missing (``fn`` then gets
    ``None, None``, and is called again once it is created).

    Args:
        store: A connected store.
        path: The znode to watch.
        fn: The callback.

    Raises:
        ZooKeeperUnavailableError: Not connected within the operation timeout (nothing is watched).
        CoordinationError: The first read failed (e.g. NoAuth).
    """
    store.require_connection("watch", path)
    try:
        DataWatch(store.client, path, fn)
    except KAZOO_ERRORS as e:
        raise translate_error(e, "watch", path) from e
